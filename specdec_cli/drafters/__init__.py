"""Drafters: one file per method, registered by name in ``DRAFTERS``.

Importing this package registers every built-in method; ``build_drafter`` is the only
place that turns a method config into a drafter.
"""
from __future__ import annotations

from typing import Optional

from specdec_cli.config.combinations import suffix_enhancer_on
from specdec_cli.drafters import dflash_drafter, draft_target, eagle3, mtp, ngram, pard, suffix  # noqa: F401  (registration)
from specdec_cli.drafters.base import DRAFTERS, Drafter, DrafterDeps, DraftRequest, Proposal
from specdec_cli.drafters.enhancer import SuffixEnhancer

__all__ = ["DRAFTERS", "Drafter", "DrafterDeps", "DraftRequest", "Proposal", "build_drafter", "enhance"]


@DRAFTERS.register("none")
def build_none(cfg, deps: DrafterDeps) -> None:
    """method=none: no drafter; every verify step is a plain decode step."""
    return None


def build_drafter(cfg, deps: DrafterDeps) -> Optional[Drafter]:
    """The drafter registered for ``cfg.name`` (None for method=none), with the confidence stop
    (``method.draft_confidence``) and wrapped in the suffix enhancer when ``method.suffix_enhancer`` resolves
    on (``config.combinations.suffix_enhancer_on``; validation allows both on model drafters only)."""
    drafter = DRAFTERS.get(cfg.name)(cfg, deps)
    return None if drafter is None else enhance(drafter, cfg, deps)


def enhance(drafter: Drafter, cfg, deps: DrafterDeps) -> Drafter:
    """``drafter`` with the method's confidence stop, wrapped in the suffix enhancer when ``cfg.suffix_enhancer``
    resolves on (else itself): what every built drafter gets, a sharded one included (``parallel/drafters.py``)."""
    drafter.draft_confidence = cfg.draft_confidence
    if suffix_enhancer_on(cfg):
        return SuffixEnhancer(drafter, min_match=cfg.suffix_min_match, vocab_size=deps.vocab_size)
    return drafter
