"""Draft-target: a separate small model with the target's tokenizer drafts K tokens.

Step form: K sequential forwards of the draft model, each drawing one token from the
request's filtered draft distribution (``draft_policy=sample``, q = that distribution) or
taking its argmax (``draft_policy=argmax``, q = one-hot). The draft keeps its own slot KV
cache; before drafting it rewinds to the longest prefix it shares with the committed
sequence (rejected drafts drop out) and feeds the rest.

``self_speculative_layers=N`` drafts with the target's own first N layers, final norm and
LM head (no training, no extra weights).
"""
from __future__ import annotations

from pathlib import Path

import torch

from specdec_cli.config.schema import DraftTargetMethodConfig
from specdec_cli.drafters.base import (DRAFTERS, ChainStop, Drafter, DrafterDeps, DraftRequest, Proposal, draw,
                                       drafting_params)
from specdec_cli.drafters.learned import shipped_checkpoint
from specdec_cli.errors import ConfigError
from specdec_cli.models import Transformer, load_model
from specdec_cli.models.loading import draft_tokenizer_problem, tokenizers_match
from specdec_cli.models.loading import load_hf_dir
from specdec_cli.sampling.params import BatchParams


class ModelDrafter(Drafter):
    """Step-form drafter around any causal LM sharing the target's vocabulary."""

    has_proposal_distribution = True

    def __init__(self, model: Transformer, *, num_slots: int, max_seq_len: int, policy: str) -> None:
        self.model = model
        self.cache = model.new_cache(num_slots, max_seq_len)
        self.cached_tokens: dict[int, list[int]] = {}
        self.policy = policy
        self.draft_vocab_size = model.arch.vocab_size

    def add_request(self, slot: int, prompt_ids: list[int]) -> None:
        self.cache.rewind(slot, 0)
        self.cached_tokens[slot] = []

    def remove_request(self, slot: int, token_ids: list[int]) -> None:
        self.cache.rewind(slot, 0)
        self.cached_tokens.pop(slot, None)

    def _catch_up(self, requests: list[DraftRequest]) -> list[torch.Tensor]:
        """Rewind each slot to the prefix it shares with the committed tokens; return the rest."""
        feeds = []
        for req in requests:
            cached = self.cached_tokens.setdefault(req.slot, [])
            shared = 0
            limit = min(len(cached), len(req.token_ids) - 1)  # always re-feed the last token
            while shared < limit and cached[shared] == req.token_ids[shared]:
                shared += 1
            self.cache.rewind(req.slot, shared)
            del cached[shared:]
            feeds.append(req.token_ids[shared:])
        return [torch.tensor(f, dtype=torch.int64, device=self.model.device) for f in feeds]

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        slots = [r.slot for r in requests]
        feeds = self._catch_up(requests)
        params = drafting_params(params, self.policy)
        tokens = torch.zeros(len(requests), k, dtype=torch.int64, device=self.model.device)
        draft_probs = torch.zeros(len(requests), k, self.draft_vocab_size, dtype=torch.float32, device=self.model.device)
        chain = ChainStop(len(requests), self.draft_confidence)
        for step in range(k):
            rows, row_params = chain.rows, chain.params(params)
            logits = self.model(self.cache, [slots[r] for r in rows], feeds, logits_for="last").logits.float()
            for row, fed in zip(rows, feeds):
                self.cached_tokens[slots[row]].extend(fed.tolist())
            ids, probs = draw(logits, row_params)
            tokens[rows, step], draft_probs[rows, step] = ids, probs
            keep = chain.record(logits, ids, probs, row_params)
            feeds = [tokens[rows[i], step : step + 1] for i in keep]
            if not feeds:
                break
        return Proposal(tokens=tokens, draft_probs=draft_probs, num_drafts=chain.lengths)


@DRAFTERS.register("draft_target")
def build_draft_target(cfg: DraftTargetMethodConfig, deps: DrafterDeps) -> Drafter:
    if cfg.self_speculative_layers is not None:
        model = deps.target.truncated(cfg.self_speculative_layers)
    else:
        path = Path(cfg.draft_path or shipped_checkpoint("draft_target", "draft_path")).expanduser()
        if path.is_dir():  # a HF directory, maybe sharing the target's embedding (the shipped draft does)
            model = load_hf_dir(path, dtype=deps.dtype, device=deps.device, shared_from=deps.target)
            mismatch = draft_tokenizer_problem(deps.tokenizer, path) if deps.tokenizer is not None else None
        else:
            model, draft_tokenizer = load_model(path, dtype=deps.dtype, device=deps.device)
            mismatch = tokenizers_match(deps.tokenizer, draft_tokenizer) if deps.tokenizer is not None else None
        if mismatch:
            raise ConfigError([f"method.draft_path={path}: {mismatch}"])
        if model.arch.vocab_size != deps.vocab_size:
            raise ConfigError(
                [f"method.draft_path={path}: draft vocabulary {model.arch.vocab_size} "
                 f"!= target vocabulary {deps.vocab_size} (draft_target needs a shared tokenizer)"]
            )
    return ModelDrafter(model, num_slots=deps.num_slots, max_seq_len=deps.max_seq_len, policy=cfg.draft_policy)
