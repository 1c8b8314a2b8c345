"""The drafter interface: what every speculative method implements.

A drafter proposes up to K tokens per generation request **and the distribution each
token was actually drawn from** (``q``). The engine stores both in the slot-indexed
proposal buffer and hands them to acceptance in the next step. See
``docs/DEVELOPER_GUIDE.md`` for the contract; ``tests/drafters/test_drafter_contract.py``
checks it for every registered drafter.

Drafters never import the CLI or the config loader; they receive their own config slice
(``cfg.method``) plus plain arguments from ``build_drafter``, and per step the batch's
``BatchParams`` (the sampling filters and generators of the requests, row for row).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from specdec_cli.registry import Registry
from specdec_cli.sampling import expand_draft_probs, one_hot, probs_from_logits, sample_from_probs
from specdec_cli.sampling.params import BatchParams

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
    ``Drafter.hidden_layers``); ``target_final_hidden`` [n, H] the post-norm ones.
    Sampling parameters are not here: they come as ``BatchParams`` rows, aligned with the requests.
    """

    slot: int
    token_ids: list[int]
    target_hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    target_final_hidden: Optional[torch.Tensor] = None


@dataclass
class Proposal:
    """Drafts for a batch of requests.

    tokens:      [R, k] int64 **target-vocabulary** ids (entries past ``num_drafts[r]`` are padding).
                 A drafter with a reduced vocabulary maps its draft ids through ``d2t`` exactly once,
                 when it draws them.
    draft_probs: [R, k, Vd] float32, the q each token was drawn from, in the **draft** vocabulary
                 (never mapped by the drafter; the engine expands it to target ids once, see
                 ``target_probs``). None means one-hot at the drafted token, which is only meaningful
                 when draft ids are target ids: a drafter with ``d2t`` always returns draft_probs (its
                 deterministic drafts as one-hot rows in draft ids).
    num_drafts:  [R] real drafts per request (0..k)
    one_hot_rows: rows whose q is one-hot at their ``tokens`` in the **target** vocabulary, whatever
                 ``draft_probs`` holds there (retrieval drafts, which may lie outside a reduced draft vocabulary)
    """

    tokens: torch.Tensor
    draft_probs: Optional[torch.Tensor]
    num_drafts: list[int]
    one_hot_rows: tuple[int, ...] = ()

    @classmethod
    def from_token_lists(cls, drafts: list[list[int]], k: int) -> "Proposal":
        """A one-hot proposal from ragged token lists (retrieval drafters)."""
        host = torch.device("cpu")  # retrieval runs on the host; the engine's buffer copies the drafts once
        tokens = torch.zeros(len(drafts), k, dtype=torch.int64, device=host)
        for row, draft in enumerate(drafts):
            tokens[row, : len(draft)] = torch.tensor(draft, dtype=torch.int64, device=host)
        return cls(tokens=tokens, draft_probs=None, num_drafts=[len(d) for d in drafts])

    def target_probs(self, d2t: Optional[torch.Tensor], vocab_size: int,
                     positions: Optional[int] = None) -> torch.Tensor:
        """q in target ids [R, positions or k, V] (the first ``positions`` drafts: the rows past every request's
        ``num_drafts`` need no expansion): ``draft_probs`` expanded through ``d2t`` (the one place it is applied
        to q), or one-hot at ``tokens`` when there is none. A one-hot proposal from a drafter with a reduced
        vocabulary is refused: its tokens are target ids and cannot index draft-vocabulary rows."""
        tokens = self.tokens[:, :positions]
        if self.draft_probs is not None:
            draft_probs = self.draft_probs[:, :positions]
            probs = expand_draft_probs(draft_probs, d2t, vocab_size)
            if self.one_hot_rows:
                rows = torch.tensor(self.one_hot_rows, device=probs.device)
                probs = probs.clone() if probs is draft_probs else probs
                probs[rows] = one_hot(tokens[rows].to(probs.device), vocab_size)
            return probs
        if d2t is not None:
            raise ValueError("a drafter with a reduced vocabulary (d2t) must report draft_probs: "
                             "one-hot rows at target ids would land on the wrong draft-vocabulary ids")
        return one_hot(tokens, vocab_size)


class Drafter(ABC):
    """Base class: a method proposes drafts; the engine verifies and accepts them."""

    #: Draft vocabulary size (Vd) and its map to target ids (None: identity).
    draft_vocab_size: int = 0
    d2t: Optional[torch.Tensor] = None
    #: Whether draft_probs can be a real (non one-hot) distribution.
    has_proposal_distribution: bool = False
    #: Target layers (output-of-layer-i convention) whose hidden states the drafter needs.
    hidden_layers: tuple[int, ...] = ()
    needs_final_hidden: bool = False
    #: Confidence stop of a model drafter (``method.draft_confidence``, set by ``build_drafter``; 0: off):
    #: a request's drafts end with its first draft whose ``own_probability`` is below it (see ``ChainStop``).
    draft_confidence: float = 0.0

    @abstractmethod
    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        """Propose up to ``k`` drafts for each request (k >= 1); ``params`` row r is request r's sampling."""

    def add_request(self, slot: int, prompt_ids: list[int]) -> None:
        """A request entered ``slot`` (its prompt is known; nothing is generated yet)."""

    def remove_request(self, slot: int, token_ids: list[int]) -> None:
        """The request in ``slot`` finished; free per-slot state."""

    def forget_finished(self) -> None:
        """Drop what finished requests left behind for later ones (a global pool); the engine calls it after
        its warm-up requests."""


def drafting_params(params: BatchParams, policy: str) -> BatchParams:
    """The filters a model drafter draws with: the requests' own, or temperature 0 (one-hot q, argmax
    drafts) under ``draft_policy=argmax``."""
    if policy != "argmax":
        return params
    return replace(params, temperature=torch.zeros_like(params.temperature), all_greedy=True)


def draw(logits: torch.Tensor, params: BatchParams) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, Vd] -> (draft ids [N] int64, q [N, Vd] float32): q = ``probs_from_logits`` with row n's
    filters, the id drawn from q with row n's generator (one uniform per row)."""
    probs = probs_from_logits(logits, params.temperature, params.top_k, params.top_p)
    return sample_from_probs(probs, params.generators), probs


def draw_block(logits: torch.Tensor, params: BatchParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Every draft of a block drawn independently: logits [R, n, Vd] -> (draft ids [R, n], q [R, n, Vd]),
    row r's filters and generator for all its n drafts (n uniforms per request, in order)."""
    rows, num, vocab = logits.shape
    ids, probs = draw(logits.reshape(rows * num, vocab), params.repeat_rows(num))
    return ids.view(rows, num), probs.view(rows, num, vocab)


def own_probability(logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, params: BatchParams) -> torch.Tensor:
    """The draft's probability of its own drafted token [N]: q(d) (probs [N, Vd]) for sampled rows; for greedy
    rows (temperature 0, q one-hot) the untempered softmax of ``logits`` [N, Vd] at d (ids [N], draft ids)."""
    own = probs.gather(-1, ids[:, None])[:, 0]
    greedy = (params.temperature == 0).to(own.device)
    if bool(greedy.any()):
        own = torch.where(greedy, torch.softmax(logits.float(), dim=-1).gather(-1, ids[:, None])[:, 0], own)
    return own


class ChainStop:
    """The confidence stop of a chain drafter: which rows are still drafting and how many drafts each has.

    A row stops after its first draft whose own probability is below ``threshold`` (0: never). That draft is
    still sent: it was drawn from the q it reports, and whether later positions exist depends only on drafts
    already drawn, so verification stays exact at T > 0 (leaving it out would bias the sent tokens toward
    confident ones). Later drafts of a stopped row are never drawn (no forward, no generator draw)."""

    def __init__(self, num_rows: int, threshold: float) -> None:
        self.threshold = threshold
        self.rows = list(range(num_rows))  # rows still drafting, ascending
        self.lengths = [0] * num_rows  # drafts per row so far

    def params(self, params: BatchParams) -> BatchParams:
        """The drafting rows' sampling parameters (``params`` itself while every row drafts)."""
        return params if len(self.rows) == len(self.lengths) else params.select(self.rows)

    def record(self, logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, params: BatchParams) -> list[int]:
        """One draft per drafting row (``own_probability`` arguments, rows in ``self.rows`` order); returns the
        positions, in that order, of the rows that go on."""
        for row in self.rows:
            self.lengths[row] += 1
        if self.threshold <= 0:
            return list(range(len(self.rows)))
        confident = (own_probability(logits, ids, probs, params) >= self.threshold).tolist()
        keep = [i for i, ok in enumerate(confident) if ok]
        self.rows = [self.rows[i] for i in keep]
        return keep


def block_stop(logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor, params: BatchParams,
               threshold: float) -> list[int]:
    """Block drafters' confidence stop: drafts kept per row of a block (logits [R, n, Vd], ids [R, n] draft ids,
    probs [R, n, Vd], ``params`` one row per request), up to and including the first one whose own probability
    is below ``threshold`` (n where none is, and always n at threshold 0). Each position was drawn
    independently from its q, so cutting after a drawn position keeps verification exact, as ``ChainStop``."""
    rows, num, vocab = logits.shape
    if threshold <= 0:
        return [num] * rows
    own = own_probability(logits.reshape(-1, vocab), ids.reshape(-1), probs.reshape(-1, vocab),
                          params.repeat_rows(num)).view(rows, num)
    below = own < threshold
    first = torch.where(below.any(dim=1), below.int().argmax(dim=1) + 1, torch.full((rows,), num, device=logits.device))
    return first.tolist()


@dataclass(frozen=True)
class DrafterDeps:
    """Plain facts the builder hands to a drafter factory (never the whole config)."""

    target: "Transformer"
    num_slots: int
    max_seq_len: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    tokenizer: Any = None  # the target's tokenizer (a draft model with its own must match it)
    model_dtype: str = "float32"  # model.dtype as configured: a learned head's head_dtype=None follows it
    head_dtype: Optional[str] = None  # the resolved auto head dtype (EffectiveConfig.head_dtype); None: model_dtype


DrafterFactory = Callable[["MethodConfig", DrafterDeps], Optional[Drafter]]

#: method name -> factory(method_cfg, deps) returning a Drafter (None for method=none).
DRAFTERS: Registry[DrafterFactory] = Registry("drafter")
