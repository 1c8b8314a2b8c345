"""Typed configuration: one dataclass per config group option.

These dataclasses are the schema Hydra validates overrides against (registered in
``config/store.py``) and the typed objects every later stage receives after
``OmegaConf.to_object``. Each stage gets only its own slice (``cfg.method``,
``cfg.sampler``, ...), never the whole tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


# --------------------------------------------------------------------------- method
@dataclass
class MethodConfig:
    """Common fields of every speculative method (``method=<name>``)."""

    name: str = MISSING
    num_draft_tokens: int = 4  # K, the maximum draft length per step
    # max batch size -> K, as in TensorRT-LLM: a batch of size b drafts the K of the first
    # key >= b, and 0 above the largest key ({4: 4, 8: 2}: bs 1-4 -> 4, 5-8 -> 2, 9+ -> 0).
    # The smallest key must map to num_draft_tokens. Empty (auto): always num_draft_tokens, except model drafters
    # on CPU, which stop drafting above batch 2 (eagle3) or 1 (config.combinations.draft_len_schedule_for).
    # (Not Optional: OmegaConf cannot merge a CLI dict into a None-valued Optional[Dict].)
    draft_len_schedule: dict[int, int] = field(default_factory=dict)
    # How a model-based drafter picks its draft token: "sample" from its filtered softmax
    # (q = that softmax) or "argmax" (q = one-hot). Retrieval drafters are always one-hot.
    draft_policy: str = "sample"
    # Relaxed (thinking-phase) acceptance: MTP only, lossy, exclusive with rejection.
    relaxed_acceptance: bool = False
    relaxed_topk: int = 10
    relaxed_delta: float = 0.6
    # Confidence stop (model drafters): a request's chain stops after its first draft whose own
    # probability is below this (q(d) when sampled; the draft's softmax at d when greedy). 0: off.
    draft_confidence: float = 0.0
    # Suffix enhancer (model drafters): where the request's own prompt + output has a suffix match of
    # >= suffix_min_match tokens, its drafts are the retrieval continuation (one-hot q) instead.
    # None (auto): on for model drafters (a tree's match is proposed as a chain), off elsewhere (reason recorded).
    suffix_enhancer: Optional[bool] = None
    suffix_min_match: int = 3  # measured against 4: benchmarks/results_enhancer_vocab.md
    # Adaptive skip: a request whose running acceptance (EMA of accepted drafts per drafted step)
    # falls below this drafts nothing, except a probe every adaptive_probe_every steps. 0: off.
    adaptive_min_accept: float = 0.0
    adaptive_probe_every: int = 8
    # Dynamic draft tree (EAGLE-3; TensorRT-LLM's names): children per node (1: today's chain) and the nodes
    # sent to one verify forward (None: tree_topk * num_draft_tokens); the tree's depth is num_draft_tokens.
    # tree_topk None (auto; EAGLE-3's default): see Eagle3MethodConfig.
    tree_topk: Optional[int] = 1
    max_total_draft_tokens: Optional[int] = None

    @property
    def drafts_a_tree(self) -> bool:
        """tree_topk > 1 (auto, None, counts as the chain until `specdec run` resolves it)."""
        return (self.tree_topk or 1) > 1


@dataclass
class NoneMethodConfig(MethodConfig):
    name: str = "none"
    num_draft_tokens: int = 0


@dataclass
class NgramMethodConfig(MethodConfig):
    name: str = "ngram"
    min_n: int = 2
    max_n: int = 4


@dataclass
class SuffixMethodConfig(MethodConfig):
    name: str = "suffix"
    use_global_pool: bool = False  # also match against other requests' outputs
    max_pool_tokens: int = 200_000
    min_match_len: int = 2


@dataclass
class DraftTargetMethodConfig(MethodConfig):
    name: str = "draft_target"
    # HF directory / GGUF of the draft model; None: the shipped draft for the embedded target.
    draft_path: Optional[str] = None
    # Self-speculation without training: the target's first N layers + final norm + LM head.
    self_speculative_layers: Optional[int] = None


@dataclass
class LearnedHeadMethodConfig(MethodConfig):
    """Fields of the methods whose draft is a learned head on the target's features (eagle3, mtp, dflash)."""

    checkpoint: Optional[str] = None  # None: the shipped head for the embedded target
    # The head's weights: float32 | bfloat16 | int8 (weight-only, CPU); None: as model.dtype. The draft's
    # numerics change only which drafts are proposed, never the output distribution.
    head_dtype: Optional[str] = None


@dataclass
class Eagle3MethodConfig(LearnedHeadMethodConfig):
    name: str = "eagle3"
    # Target layers whose outputs are fused (output-of-layer-i convention); None: {1, N/2-1, N-4}.
    target_layers: Optional[list[int]] = None
    # None (auto): a tree of topk AUTO_TREE_TOPK where a tree can run (batch 1, one process, no adaptive skip,
    # no CUDA graphs; K * topk nodes for a greedy request, K + 1 for a sampled one), else the chain
    # (config.combinations.tree_topk_for, tree_nodes_for).
    tree_topk: Optional[int] = None


@dataclass
class MtpMethodConfig(LearnedHeadMethodConfig):
    name: str = "mtp"
    # Relaxed acceptance applies only inside the thinking phase, between these token ids (TensorRT-LLM's
    # begin/end thinking-phase tokens), strict elsewhere. A model without thinking tokens leaves them None
    # and must ask for relaxed acceptance on every token with relaxed_everywhere=true (else refused).
    begin_thinking_token_id: Optional[int] = None
    end_thinking_token_id: Optional[int] = None
    relaxed_everywhere: bool = False


@dataclass
class PardMethodConfig(MethodConfig):
    name: str = "pard"
    checkpoint: Optional[str] = None
    mask_token_id: Optional[int] = None  # None: read from the checkpoint config


@dataclass
class DflashMethodConfig(LearnedHeadMethodConfig):
    name: str = "dflash"
    target_layers: Optional[list[int]] = None  # None: read from the checkpoint config


# --------------------------------------------------------------------------- sampler
@dataclass
class SamplerConfig:
    """Default sampling parameters of every request (a workload may override per request)."""

    name: str = MISSING
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # <= 0: off
    top_p: float = 1.0  # 1: off; must be in (0, 1]
    seed: int = 0  # base seed; request i uses seed + i
    guided_decoding: Optional[str] = None  # e.g. "json"; not supported with rejection


# --------------------------------------------------------------------------- rejection
@dataclass
class RejectionConfig:
    mode: str = "auto"  # auto | on | off
    backend: str = "auto"  # auto | torch | flashinfer
    verification: str = "auto"  # auto | token | block (chains: block, trees: traversal verification); auto: block
    # except a chain on flashinfer


# --------------------------------------------------------------------------- parallelism
@dataclass
class ParallelismConfig:
    name: str = "single"
    tp: int = 1  # tensor parallel ranks
    dp: int = 1  # attention data parallel ranks
    cp: int = 1  # context parallel ranks


# --------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    name: str = "smollm2_135m"
    path: Optional[str] = None  # HF directory or .gguf file; None: the embedded default
    dtype: str = "float32"  # float32 | bfloat16 | int8 (weight-only int8 target, CPU)
    device: str = "auto"  # auto | cpu | cuda
    chat_template: bool = True


@dataclass
class HfModelConfig(ModelConfig):
    """``model=hf``: your own checkpoint; ``path`` is required (checked by ``resolve``:
    a ``???`` here would be lost, OmegaConf merges never replace a value with MISSING)."""

    name: str = "hf"


# --------------------------------------------------------------------------- workload
@dataclass
class WorkloadConfig:
    name: str = "quick"
    source: str = "builtin"  # builtin | mt_bench | jsonl | repetitive | inline
    path: Optional[str] = None  # for source=jsonl (and an override of the mt_bench file)
    num_prompts: int = 4  # <= 0: all
    max_new_tokens: int = 64
    prompts: list[str] = field(default_factory=list)  # for source=inline: the prompts themselves
    stop: list[str] = field(default_factory=list)
    # Optional per-request sampler overrides cycled over requests, e.g.
    # [{temperature: 0.0}, {temperature: 1.0, top_k: 20}]
    sampler_mix: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------- engine
@dataclass
class EngineConfig:
    max_batch_size: int = 1
    max_seq_len: int = 1024
    prefill_chunk: int = 512  # tokens of one request's prompt per step; <= 0: no chunking
    cuda_graphs: str = "auto"  # auto | on | off: CUDA graphs for decode batches <= 16 (auto: on with CUDA)


@dataclass
class ServerConfig:
    """``specdec serve``: where the OpenAI-compatible HTTP server listens."""

    host: str = "127.0.0.1"  # loopback only; "0.0.0.0" exposes it to the network
    port: int = 8000  # 0: any free port
    model_name: Optional[str] = None  # the id /v1/models reports; None: model.path or model.name


@dataclass
class RunConfig:
    method: MethodConfig = MISSING
    sampler: SamplerConfig = MISSING
    rejection: RejectionConfig = MISSING
    parallelism: ParallelismConfig = MISSING
    model: ModelConfig = MISSING
    workload: WorkloadConfig = MISSING
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    output_dir: Optional[str] = None  # None: Hydra's run directory
    skip_if_done: bool = False  # skip a job whose results.json already exists (sweep re-runs)
    dry_run: bool = False  # validate and write the effective config, but do not load models
    # tokens_per_s | acceptance_length: the Hydra job returns this metric (a float, for the Optuna
    # sweeper to maximise) instead of the results dict; None: the dict
    objective: Optional[str] = None
    # also run method=none on the same requests, same engine settings and model load (metrics.baseline,
    # metrics.speedup; greedy runs also record metrics.baseline_identical); single process only
    baseline: bool = False
    # per-step time breakdown (profile_steps.jsonl) and a torch.profiler trace (profile_trace.json, open it in
    # Perfetto or chrome://tracing) in the output directory; single process only; slows the run a little
    profile: bool = False


# --------------------------------------------------------------------------- train
@dataclass
class TrainCorpusConfig:
    """Stage 1 of ``specdec train``: the target's answers to generated prompts (train/data.py)."""

    dir: Optional[str] = None  # None: data/distill/<model name> in the checkout
    # if_empty: generate only when the directory holds no shards (else use what is there);
    # complete: generate every missing shard up to num_prompts (resumable); never: use what is there
    generate: str = "if_empty"
    num_prompts: int = 4096
    max_new_tokens: int = 256
    batch_size: int = 32
    time_budget_s: Optional[float] = None  # stop generating after this long (shards already written stay)
    max_sequences: int = 0  # training sequences to use; <= 0: all (held-out ones are never trained on)
    # more corpus directories trained on with ``dir`` (never generated into): their training sequences come
    # first, so ``max_sequences`` cuts ``dir``'s; their held-out ones are evaluated after ``dir``'s
    extra_dirs: list[str] = field(default_factory=list)


@dataclass
class TrainConfig:
    """``specdec train``: self-distil a drafter for a target model; the fields every method reads.

    Each trainable method extends it with its own fields (its train schema, next to its trainer in
    ``specdec_cli/train/methods/``); ``specdec train`` accepts every method's fields as flat overrides."""

    method: MethodConfig = MISSING  # what to train; method.num_draft_tokens is the evaluated chain length
    model: ModelConfig = MISSING  # the target
    corpus: TrainCorpusConfig = field(default_factory=TrainCorpusConfig)
    out_dir: Optional[str] = None  # None: Hydra's run directory; rerunning into it resumes
    steps: int = 400  # optimiser steps
    batch_size: int = 8  # sequences per step
    lr: float = 1e-3  # peak learning rate (AdamW, betas 0.9/0.95)
    warmup_steps: int = 30  # linear warmup, then cosine decay to lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 100  # steps between held-out evaluations; <= 0: only at the end
    eval_sequences: int = 32  # held-out sequences evaluated
    checkpoint_every: int = 100  # steps between checkpoints (resume state + loadable artifact)
    resume: bool = True  # continue from out_dir's checkpoint when there is one
    time_budget_s: Optional[float] = None  # stop training (checkpointed) after this long
    feature_cache: bool = True  # target features computed once into the specdec cache (else per batch)
    threads: int = 0  # CPU threads for training (0: every core)
    seed: int = 0
