"""PARD: a parallel draft model that proposes all k tokens in one causal forward.

The draft is a small causal LM with the target's tokenizer, independent of the target (no target
features). Input: the committed tokens it has not cached yet, then k-1 copies of the mask token, at
positions continuing the sequence; ordinary causal attention. The last committed position predicts
d_1 and mask j predicts d_{j+1}. After the forward the k-1 mask entries are dropped from the slot KV
cache (the committed tokens stay; the next call catches up by longest shared prefix, as draft_target),
so the draft never conditions on its own drafts. Each draft is drawn independently from its filtered
distribution: q = exactly that distribution (``draft_policy=argmax``: one-hot).

Checkpoint: a HF causal-LM directory of the Llama family (``config.json`` + safetensors, the layout of
the published amd/PARD-* drafts), whose ``config.json`` names the mask token id in ``pard_token`` (PARD's
key; vLLM and TensorRT-LLM read it too), else ``mask_token_id`` or ``ptd_token_id``;
``method.mask_token_id`` overrides it. A draft vocabulary that differs from the target's only by
padding rows (Qwen) is cut to the shorter one; the dropped rows must be padding (all-zero LM-head rows, or
ids the tokenizer never produces), else the draft is refused.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from specdec_cli.config.schema import PardMethodConfig
from specdec_cli.drafters.base import (DRAFTERS, Drafter, DrafterDeps, DraftRequest, Proposal, block_stop,
                                       drafting_params, draw_block)
from specdec_cli.drafters.draft_target import ModelDrafter
from specdec_cli.drafters.learned import arch_config, save_checkpoint, shipped_checkpoint
from specdec_cli.errors import ConfigError
from specdec_cli.models import ModelLoadError, Transformer
from specdec_cli.models.loading import draft_tokenizer_problem, load_hf_dir
from specdec_cli.sampling.params import BatchParams

#: config.json keys naming the mask token, in order of preference
MASK_KEYS = ("pard_token", "mask_token_id", "ptd_token_id")


class PardDrafter(ModelDrafter):
    """Block form around a causal LM: k drafts from one forward over [new committed tokens, mask x (k-1)]."""

    def __init__(self, model: Transformer, mask_token_id: int, *, vocab_size: int, num_slots: int,
                 max_seq_len: int, policy: str) -> None:
        super().__init__(model, num_slots=num_slots, max_seq_len=max_seq_len, policy=policy)
        self.mask_token_id = mask_token_id
        self.draft_vocab_size = min(model.arch.vocab_size, vocab_size)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        feeds = self._catch_up(requests)
        masks = torch.full((k - 1,), self.mask_token_id, dtype=torch.int64, device=self.model.device)
        logits = self.model(self.cache, [r.slot for r in requests], [torch.cat([fed, masks]) for fed in feeds],
                            logits_for=[k] * len(requests)).logits
        for req, fed in zip(requests, feeds):
            self.cache.rewind(req.slot, self.cache.length(req.slot) - (k - 1))  # masks never stay cached
            self.cached_tokens[req.slot].extend(fed.tolist())
        logits = logits.view(len(requests), k, -1)[..., : self.draft_vocab_size]
        logits, params = logits.float(), drafting_params(params, self.policy)
        tokens, probs = draw_block(logits, params)
        return Proposal(tokens=tokens, draft_probs=probs,
                        num_drafts=block_stop(logits, tokens, probs, params, self.draft_confidence))


def load_pard(path: str | Path, *, mask_token_id: Optional[int] = None, dtype: torch.dtype = torch.float32,
              device: torch.device | str = "cpu", target: Optional[Transformer] = None) -> tuple[Transformer, int]:
    """(draft model, mask token id) from a PARD directory (tensors it shares with ``target`` filled from
    it, as a shipped draft's embedding); ConfigError naming the file/field/tensor."""
    directory = Path(path).expanduser()
    try:
        model = load_hf_dir(directory, dtype=dtype, device=device, shared_from=target)
    except ModelLoadError as err:
        raise ConfigError([str(err)]) from None
    config_file = directory / "config.json"
    source = "method.mask_token_id"
    if mask_token_id is None:
        config = json.loads(config_file.read_text())
        found = [(key, config[key]) for key in MASK_KEYS if config.get(key) is not None]
        if not found:
            raise ConfigError([f"{config_file}: no mask token id (none of {', '.join(MASK_KEYS)}); "
                               "pass one with method.mask_token_id=<id>"])
        key, mask_token_id = found[0]
        source = f"{config_file}: {key}"
        if isinstance(mask_token_id, list) and len(set(mask_token_id)) == 1:
            mask_token_id = mask_token_id[0]  # one id per depth, all equal: the shared mask token
    if not isinstance(mask_token_id, int) or not 0 <= mask_token_id < model.arch.vocab_size:
        raise ConfigError([f"{source}={mask_token_id!r} must be one token id in [0, {model.arch.vocab_size})"])
    return model, mask_token_id


def save_pard(model: Transformer, directory: str | Path, *, mask_token_id: int, tokenizer: Any = None,
              dtype: Optional[torch.dtype] = None) -> Path:
    """Write ``model`` as a HF causal-LM directory with ``pard_token`` (plus the tokenizer if given),
    its tensors cast to ``dtype`` if given."""
    tied = model.arch.tie_word_embeddings
    tensors = {(name if name.startswith("lm_head") else f"model.{name}"): t.to(dtype) if dtype is not None else t
               for name, t in model.state_dict().items() if not (tied and name == "lm_head.weight")}
    save_checkpoint(directory, {**arch_config(model.arch), "pard_token": mask_token_id}, tensors)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return Path(directory)


def trimmed_rows_problem(model: Transformer, vocab_size: int, tokenizer: Any = None) -> Optional[str]:
    """Why the draft's ids >= ``vocab_size`` (the target's) may not be dropped, or None: they are padding when
    their LM-head rows are all zero or the tokenizer never produces them (``len(tokenizer) <= vocab_size``)."""
    if model.arch.vocab_size <= vocab_size:
        return None
    weight = getattr(model.lm_head, "weight", None)
    if (weight is not None and not weight[vocab_size:].any()) or (tokenizer is not None and len(tokenizer) <= vocab_size):
        return None
    return (f"the draft vocabulary has {model.arch.vocab_size} ids and the target's {vocab_size}; ids "
            f"{vocab_size}..{model.arch.vocab_size - 1} have trained LM-head rows and are not known padding, "
            "so they cannot be dropped")


@DRAFTERS.register("pard")
def build_pard(cfg: PardMethodConfig, deps: DrafterDeps) -> Drafter:
    path = cfg.checkpoint or shipped_checkpoint("pard", "checkpoint")
    if deps.tokenizer is not None and Path(path).is_dir():
        if mismatch := draft_tokenizer_problem(deps.tokenizer, Path(path)):
            raise ConfigError([f"method.checkpoint={path}: {mismatch}"])
    model, mask_token_id = load_pard(path, mask_token_id=cfg.mask_token_id, dtype=deps.dtype, device=deps.device,
                                     target=deps.target)
    if problem := trimmed_rows_problem(model, deps.vocab_size, deps.tokenizer):
        raise ConfigError([f"method.checkpoint={path}: {problem}"])
    return PardDrafter(model, mask_token_id, vocab_size=deps.vocab_size, num_slots=deps.num_slots,
                       max_seq_len=deps.max_seq_len, policy=cfg.draft_policy)
