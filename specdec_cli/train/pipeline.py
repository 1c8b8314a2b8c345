"""``specdec train``'s job: a typed ``TrainConfig`` -> corpus -> features -> training -> artifact.

  1. corpus    the target's answers to generated prompts (``train.data``, ``data/distill/<model>`` by
               default): reused when present, generated when empty (``corpus.generate``); training
               uses the training split only, evaluation the held-out split
  2. features  the target's hidden states for every corpus token (``train.features``)
  3. training  ``train.tasks`` (eagle3, mtp, draft_target) or ``train.block_tasks`` (pard, dflash)
               objective under ``train.trainer`` (resumable), artifact in out_dir/<method>
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec_cli.config.compose import conf_dir
from specdec_cli.config.schema import TrainConfig
from specdec_cli.errors import ConfigError
from specdec_cli.models import Transformer, eagle3_default_layers, load_model
from specdec_cli.drafters.dflash import load_dflash
from specdec_cli.drafters.pard import MASK_KEYS
from specdec_cli.models.loading import EMBEDDED_NAME, ModelLoadError, load_hf_dir
from specdec_cli.train.block_tasks import DflashTask, PardTask, default_mask_token_id
from specdec_cli.train.data import CorpusSpec, generate_corpus, load_corpus
from specdec_cli.train.dflash_objective import init_dflash
from specdec_cli.train.features import (
    CachedFeatures,
    FeatureExtractor,
    OnlineFeatures,
    Sequences,
    feature_cache_dir,
    target_fingerprint,
)
from specdec_cli.train.heads import draft_vocabulary, new_draft_model, new_eagle3, new_mtp
from specdec_cli.train.pard_objective import init_pard_from_target
from specdec_cli.train.tasks import DraftModelTask, HeadTask, Task
from specdec_cli.train.trainer import Trainer, TrainOptions

TRAINABLE = ("eagle3", "mtp", "draft_target", "pard", "dflash")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GENERATE = ("if_empty", "complete", "never")
POSITIVE = ("steps", "batch_size", "ttt_steps", "draft_layers", "checkpoint_every", "eval_sequences", "pard_layers",
            "pard_hidden_size", "dflash_layers", "dflash_anchors")


def check_train_config(cfg: TrainConfig) -> list[str]:
    """Every violated rule of a train config, one line each."""
    out = []
    if cfg.method.name not in TRAINABLE:
        out.append(f"method={cfg.method.name}: specdec train supports {', '.join(TRAINABLE)}")
    for name in POSITIVE:
        if getattr(cfg, name) < 1:
            out.append(f"{name}={getattr(cfg, name)} must be >= 1")
    if cfg.corpus.generate not in GENERATE:
        out.append(f"corpus.generate={cfg.corpus.generate} is not one of: {', '.join(GENERATE)}")
    if cfg.method.num_draft_tokens < 1:
        out.append(f"method.num_draft_tokens={cfg.method.num_draft_tokens} (the evaluated chain length) must be >= 1")
    if not cfg.lr > 0:
        out.append(f"lr={cfg.lr} must be > 0")
    if not 0 < cfg.pard_keep_ratio <= 1:
        out.append(f"pard_keep_ratio={cfg.pard_keep_ratio} must be in (0, 1]")
    if cfg.mask_token_id is not None and cfg.mask_token_id < 0:
        out.append(f"mask_token_id={cfg.mask_token_id} must be >= 0")
    if not 0 <= cfg.min_lr_ratio <= 1:
        out.append(f"min_lr_ratio={cfg.min_lr_ratio} must be in [0, 1]")
    if cfg.warmup_steps < 0 or cfg.weight_decay < 0 or not cfg.grad_clip > 0 or not cfg.step_weight > 0:
        out.append("warmup_steps and weight_decay must be >= 0, grad_clip and step_weight > 0")
    if cfg.model.dtype not in DTYPES:
        out.append(f"model.dtype={cfg.model.dtype} is not one of: {', '.join(DTYPES)}")
    if cfg.model.device not in ("auto", "cpu", "cuda"):
        out.append(f"model.device={cfg.model.device} is not one of: auto, cpu, cuda")
    elif cfg.model.device == "cuda" and not torch.cuda.is_available():
        out.append("model.device=cuda but no CUDA device is available")
    if cfg.model.name == "hf" and not cfg.model.path:
        out.append("model=hf needs model.path=<HF directory or .gguf file>")
    if cfg.model.path and not Path(cfg.model.path).expanduser().exists():
        out.append(f"model.path={cfg.model.path} does not exist")
    if cfg.init_from and cfg.method.name not in ("pard", "dflash"):
        out.append(f"init_from is read by pard and dflash only, not method={cfg.method.name}")
    elif cfg.init_from and not (Path(cfg.init_from).expanduser() / "config.json").is_file():
        out.append(f"init_from={cfg.init_from}: no config.json there (a checkpoint directory is expected)")
    if cfg.threads < 0:
        out.append(f"threads={cfg.threads} must be >= 0 (0: every core)")
    return out


def corpus_dir(cfg: TrainConfig) -> Path:
    """``corpus.dir``, else ``data/distill/<model name>`` in the checkout."""
    if cfg.corpus.dir:
        return Path(cfg.corpus.dir).expanduser()
    name = Path(cfg.model.path).stem if cfg.model.path else cfg.model.name
    return conf_dir().parent / "data" / "distill" / name


def shared_layers(target: Transformer) -> tuple[int, ...]:
    """The target layers every feature cache stores (EAGLE-3's defaults; none for a target under 4 layers)."""
    return eagle3_default_layers(target.arch.num_layers) if target.arch.num_layers >= 4 else ()


def mask_token(cfg: TrainConfig, target: Transformer, tokenizer: Any) -> int:
    """``mask_token_id``, else (pard) ``method.mask_token_id``, else ``default_mask_token_id``."""
    mask = cfg.mask_token_id if cfg.mask_token_id is not None else getattr(cfg.method, "mask_token_id", None)
    vocab = target.arch.vocab_size
    if mask is None:
        return default_mask_token_id(tokenizer, vocab)
    if not 0 <= mask < vocab:
        raise ConfigError([f"mask_token_id={mask} must be a token id in [0, {vocab})"])
    return mask


def build_block_task(cfg: TrainConfig, target: Transformer, tokenizer: Any) -> Task:
    """pard / dflash: a draft drafting ``method.num_draft_tokens`` tokens per forward, fresh or from ``init_from``."""
    k = cfg.method.num_draft_tokens
    init = Path(cfg.init_from).expanduser() if cfg.init_from else None
    if cfg.method.name == "pard":
        if init is not None:
            model, init_mask = pard_start(init, target)
        else:
            try:
                model = init_pard_from_target(target, cfg.pard_layers, hidden_size=cfg.pard_hidden_size, seed=cfg.seed)
            except ValueError as err:
                raise ConfigError([f"pard_hidden_size={cfg.pard_hidden_size}: {err}"]) from None
            init_mask = None
        mask = init_mask if init_mask is not None and cfg.mask_token_id is None else mask_token(cfg, target, tokenizer)
        return PardTask(model, target, mask_token_id=mask, depth=k, keep_ratio=cfg.pard_keep_ratio,
                        tokenizer=tokenizer, seed=cfg.seed)
    num = target.arch.num_layers
    if init is not None:
        draft = load_dflash(init, target, target_layers=getattr(cfg.method, "target_layers", None))
        draft.block_size = k + 1
        if cfg.mask_token_id is not None:
            draft.mask_token_id = mask_token(cfg, target, tokenizer)
        return DflashTask(draft.requires_grad_(True).train(), target, num_anchors=cfg.dflash_anchors, seed=cfg.seed)
    layers = tuple(getattr(cfg.method, "target_layers", None) or shared_layers(target) or range(num))
    if not all(0 <= layer < num for layer in layers):
        raise ConfigError([f"method.target_layers={list(layers)} must be output-of-layer ids in 0..{num - 1}"])
    draft = init_dflash(target, layers, mask_token_id=mask_token(cfg, target, tokenizer), num_layers=cfg.dflash_layers,
                        block_size=k + 1, seed=cfg.seed)
    return DflashTask(draft, target, num_anchors=cfg.dflash_anchors, seed=cfg.seed)


def pard_start(directory: Path, target: Transformer) -> tuple[Transformer, Optional[int]]:
    """(trainable float32 model, its mask token id if it is a PARD checkpoint) from ``init_from``: a causal
    LM with the target's vocabulary. Tensors equal to the target's (a shared embedding / LM head) stay frozen."""
    problem = f"init_from={directory}"
    try:
        model = load_hf_dir(directory, dtype=torch.float32, device=target.device, shared_from=target)
    except ModelLoadError as err:
        raise ConfigError([f"{problem}: {err}"]) from None
    if model.arch.vocab_size != target.arch.vocab_size:
        raise ConfigError([f"{problem}: vocabulary {model.arch.vocab_size} != the target's {target.arch.vocab_size} "
                           "(PARD needs the target's tokenizer)"])
    model.requires_grad_(True).train()
    for mine, theirs in ((model.embed_tokens.weight, target.embed_tokens.weight),
                         (model.lm_head.weight, target.lm_head.weight)):
        if mine.shape == theirs.shape and torch.equal(mine, theirs.to(mine.dtype)):
            mine.requires_grad_(False)
    config = json.loads((directory / "config.json").read_text())
    found = [config[key] for key in MASK_KEYS if isinstance(config.get(key), int)]
    return model, (found[0] if found else None)


def build_task(cfg: TrainConfig, target: Transformer, tokenizer: Any, sequences: Sequences,
               num_train: int, vocab_ids: Optional[torch.Tensor]) -> Task:
    """The method's fresh drafter and objective. The draft vocabulary is ``vocab_ids`` (a resumed run's)
    or the most frequent ids of the first ``num_train`` (training) sequences."""
    if cfg.method.name == "draft_target":
        if not 1 <= cfg.draft_layers <= target.arch.num_layers:
            raise ConfigError([f"draft_layers={cfg.draft_layers} must be in 1..{target.arch.num_layers}"])
        return DraftModelTask(new_draft_model(target, cfg.draft_layers), target, tokenizer)
    if cfg.method.name in ("pard", "dflash"):
        return build_block_task(cfg, target, tokenizer)
    vocab = target.arch.vocab_size
    if vocab_ids is None and 0 < cfg.draft_vocab_size < vocab:
        responses, prompts = torch.zeros(vocab, dtype=torch.int64), torch.zeros(vocab, dtype=torch.int64)
        for tokens, prompt_len in zip(sequences.tokens[:num_train], sequences.prompt_lens[:num_train]):
            prompts += torch.bincount(tokens[:prompt_len], minlength=vocab)
            responses += torch.bincount(tokens[prompt_len:], minlength=vocab)
        vocab_ids = draft_vocabulary(responses, prompts, cfg.draft_vocab_size)
    if cfg.method.name == "eagle3":
        ids = vocab_ids if vocab_ids is not None else torch.arange(vocab)
        head = new_eagle3(target, ids, hidden_layers=getattr(cfg.method, "target_layers", None), seed=cfg.seed)
    else:
        head = new_mtp(target, vocab_ids, seed=cfg.seed)
    return HeadTask(head, target, steps=cfg.ttt_steps, step_weight=cfg.step_weight)


def resumed_vocabulary(out_dir: Path, resume: bool) -> Optional[torch.Tensor]:
    """The draft vocabulary of the checkpoint a run resumes from (so that it never changes mid-training)."""
    path = out_dir / "state.pt"
    if not (resume and path.is_file()):
        return None
    d2t = torch.load(path, map_location="cpu", weights_only=True)["module"].get("d2t")
    return None if d2t is None else torch.arange(d2t.numel()) + d2t


def run_training(cfg: TrainConfig, out_dir: Path, *, console: Optional[Console] = None) -> dict[str, Any]:
    """Run the three stages; returns the trainer's summary (also in out_dir/train.json)."""
    console = console or Console()

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    torch.set_num_threads(cfg.threads or max(1, os.cpu_count() or 1))
    torch.manual_seed(cfg.seed)
    device = torch.device("cuda" if cfg.model.device == "cuda" or (
        cfg.model.device == "auto" and torch.cuda.is_available()) else "cpu")
    target, tokenizer = load_model(cfg.model.path, dtype=DTYPES[cfg.model.dtype], device=device)
    directory = corpus_dir(cfg)
    empty = not any(directory.glob("shard_*.npz"))
    if cfg.corpus.generate == "complete" or (cfg.corpus.generate == "if_empty" and empty):
        spec = CorpusSpec(num_prompts=cfg.corpus.num_prompts, batch_size=cfg.corpus.batch_size,
                          max_new_tokens=cfg.corpus.max_new_tokens)
        generate_corpus(target, tokenizer, directory, spec, time_budget_s=cfg.corpus.time_budget_s, log=say)
    train_pairs, eval_pairs = load_corpus(directory, held_out=False), load_corpus(directory, held_out=True)
    if not train_pairs:
        raise ConfigError([f"corpus.dir={directory}: no training sequences (generate them: corpus.generate=complete)"])
    if cfg.corpus.max_sequences > 0:
        train_pairs = train_pairs[: cfg.corpus.max_sequences]
    eval_pairs = eval_pairs[: cfg.eval_sequences]
    sequences = Sequences.from_pairs(train_pairs + eval_pairs)
    say(f"corpus {directory}: {len(train_pairs)} training sequences "
        f"({sum(len(r) for _, r in train_pairs)} response tokens), {len(eval_pairs)} held-out")
    task = build_task(cfg, target, tokenizer, sequences, len(train_pairs), resumed_vocabulary(out_dir, cfg.resume))
    # one feature cache serves every method: EAGLE-3's default layers are stored even when not read
    layers = task.feature_layers or shared_layers(target)
    extractor = FeatureExtractor(target, layers, max(t.numel() for t in sequences.tokens))
    if cfg.feature_cache:
        name = cfg.model.path or EMBEDDED_NAME
        cache = feature_cache_dir(target_fingerprint(target, str(name)), layers, sequences)
        features: Any = _cached_features(extractor, sequences, cache, console)
    else:
        features = OnlineFeatures(extractor, sequences)
    options = TrainOptions(
        steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
        min_lr_ratio=cfg.min_lr_ratio, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
        eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, eval_k=cfg.method.num_draft_tokens,
        resume=cfg.resume, time_budget_s=cfg.time_budget_s, seed=cfg.seed,
    )
    trainer = Trainer(task, features, sequences, train_indices=list(range(len(train_pairs))),
                      eval_indices=list(range(len(train_pairs), len(sequences))), options=options, out_dir=out_dir,
                      artifact=cfg.method.name, hidden_size=target.arch.hidden_size, device=device, console=console)
    return trainer.run()


def _cached_features(extractor: FeatureExtractor, sequences: Sequences, directory: Path,
                     console: Console) -> CachedFeatures:
    """Fill (or reuse) the feature cache with a progress bar."""
    total = sum(t.numel() for t in sequences.tokens)
    with Progress(TextColumn("[bold]target features"), BarColumn(), TextColumn("{task.completed}/{task.total} tokens"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        bar = progress.add_task("features", total=total)
        return CachedFeatures(extractor, sequences, directory, progress=lambda n: progress.advance(bar, n))
