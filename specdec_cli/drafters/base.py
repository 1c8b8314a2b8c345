"""The drafter interface: what every speculative method implements.

A drafter proposes up to K tokens per generation request **and the distribution each
token was actually drawn from** (``q``). The engine stores both in the slot-indexed
proposal buffer and hands them to acceptance in the next step. See
``docs/DEVELOPER_GUIDE.md`` for the contract and the tests every drafter must pass.

Drafters never import the CLI or the config loader; they receive their own config slice
(``cfg.method``) plus plain arguments from ``build_drafter``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal, Optional

import torch

from specdec_cli.registry import Registry

if TYPE_CHECKING:
    from specdec_cli.config.schema import MethodConfig
    from specdec_cli.models.transformer import Transformer


@dataclass
class DraftRequest:
    """One generation request as a drafter sees it at the end of a step.

    ``token_ids`` is the whole committed sequence (prompt + output so far); the last
    token is the one the target will see first in the next verify step. ``target_hidden``
    holds target hidden states (layer id -> [n, H]) for the committed tokens whose
    features became known this step (the drafters that need them say so through
    ``Drafter.hidden_layers``).
    """

    slot: int
    token_ids: list[int]
    temperature: float
    top_k: int
    top_p: float
    generator: Optional[torch.Generator]
    target_hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    target_final_hidden: Optional[torch.Tensor] = None


@dataclass
class Proposal:
    """Drafts for a batch of requests.

    tokens:      [R, k] int64 target-vocabulary ids (entries past ``num_drafts[r]`` are padding)
    draft_probs: [R, k, Vd] float32, the q each token was drawn from, in the draft vocabulary;
                 None means one-hot at the drafted token (argmax and retrieval drafters).
    num_drafts:  [R] real drafts per request (0..k)
    """

    tokens: torch.Tensor
    draft_probs: Optional[torch.Tensor]
    num_drafts: list[int]

    @classmethod
    def from_token_lists(cls, drafts: list[list[int]], k: int) -> "Proposal":
        """A one-hot proposal from ragged token lists (retrieval drafters)."""
        tokens = torch.zeros(len(drafts), k, dtype=torch.int64)
        for row, draft in enumerate(drafts):
            tokens[row, : len(draft)] = torch.tensor(draft, dtype=torch.int64)
        return cls(tokens=tokens, draft_probs=None, num_drafts=[len(d) for d in drafts])


class Drafter(ABC):
    """Base class: a method proposes drafts; the engine verifies and accepts them."""

    #: "step": K sequential draft steps; "block": all K drafts from one forward.
    form: Literal["step", "block"] = "step"
    #: Draft vocabulary size (Vd) and its map to target ids (None: identity).
    draft_vocab_size: int = 0
    d2t: Optional[torch.Tensor] = None
    #: Whether draft_probs can be a real (non one-hot) distribution.
    has_proposal_distribution: bool = False
    #: Target layers (output-of-layer-i convention) whose hidden states the drafter needs.
    hidden_layers: tuple[int, ...] = ()
    needs_final_hidden: bool = False

    @abstractmethod
    def propose(self, requests: list[DraftRequest], k: int) -> Proposal:
        """Propose up to ``k`` drafts for each request (k >= 1)."""

    def add_request(self, slot: int, prompt_ids: list[int]) -> None:
        """A request entered ``slot`` (its prompt is known; nothing is generated yet)."""

    def remove_request(self, slot: int, token_ids: list[int]) -> None:
        """The request in ``slot`` finished; free per-slot state."""


@dataclass(frozen=True)
class DrafterDeps:
    """Plain facts the builder hands to a drafter factory (never the whole config)."""

    target: "Transformer"
    num_slots: int
    max_seq_len: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype


DrafterFactory = Callable[["MethodConfig", DrafterDeps], Optional[Drafter]]

#: method name -> factory(method_cfg, deps) returning a Drafter (None for method=none).
DRAFTERS: Registry[DrafterFactory] = Registry("drafter")

