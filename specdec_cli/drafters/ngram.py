"""Prompt lookup (n-gram) drafter: copy what followed an earlier occurrence of the suffix.

For each request, try n = max_n down to min_n: find the *earliest* earlier occurrence of
the sequence's last n tokens and propose up to K tokens that followed it. A retrieval
drafter has no proposal distribution: q is one-hot at each drafted token.
"""
from __future__ import annotations

import torch

from specdec_cli.config.schema import NgramMethodConfig
from specdec_cli.drafters.base import DRAFTERS, Drafter, DrafterDeps, DraftRequest, Proposal
from specdec_cli.sampling.params import BatchParams


def find_ngram_continuation(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens following the earliest earlier match of the longest suffix n-gram."""
    seq = torch.tensor(token_ids, dtype=torch.int64, device="cpu")  # host-side retrieval
    length = seq.numel()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = seq[length - n :]
        # windows starting at 0 .. length-n-1 (exclude the suffix itself)
        windows = seq[: length - 1].unfold(0, n, 1)
        hits = (windows == suffix).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[0]) + n
            return token_ids[start : start + k]
    return []


class NgramDrafter(Drafter):

    def __init__(self, cfg: NgramMethodConfig, vocab_size: int) -> None:
        self.min_n, self.max_n = cfg.min_n, cfg.max_n
        self.draft_vocab_size = vocab_size

    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        drafts = [find_ngram_continuation(r.token_ids, self.min_n, self.max_n, k) for r in requests]
        return Proposal.from_token_lists(drafts, k)


@DRAFTERS.register("ngram")
def build_ngram(cfg: NgramMethodConfig, deps: DrafterDeps) -> Drafter:
    return NgramDrafter(cfg, deps.vocab_size)
