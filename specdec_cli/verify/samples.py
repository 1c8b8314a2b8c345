"""Sampling for ``specdec verify``: many seeded continuations of one prompt through ``SpecEngine``.

Every request of one engine shares the same prompt, so ``SharedPromptEngine`` computes the
target KV cache of the prompt (all but its last token) once and copies it into each slot a
request is admitted to; the engine then prefills only the last prompt token and samples the
first generated token from its logits, exactly as after a full prefill. This makes the
real-model check ~prompt-length times cheaper. Drafters that need target hidden states of
the prompt (``hidden_layers`` / ``needs_final_hidden``) get the plain full prefill instead.

``conditional_expectation`` teacher-forces the target over sampled continuations (the same
shared prompt KV) and sums, per position, its filtered law given each sample's own prefix.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from specdec_cli.config.schema import MethodConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import Drafter, DrafterDeps
from specdec_cli.engine.adaptive import skip_rule
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.tree import TreeSpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.models import KVCache, Transformer
from specdec_cli.engine.drive import run_to_completion
from specdec_cli.sampling import probs_from_logits
from specdec_cli.verify.lossless import END


@dataclass(frozen=True)
class PromptCase:
    """One prompt to sample continuations of, with its sampling parameters (seed ignored)."""

    id: str
    token_ids: tuple[int, ...]
    params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineSetup:
    """What every verify engine shares: the target, where it runs, batch and rejection settings."""

    target: Transformer
    device: torch.device
    dtype: torch.dtype
    batch_size: int
    rejection: bool
    backend: str
    draft_len_schedule: Optional[dict[int, int]]
    verification: str = "token"  # rejection.verification: token | block
    model_dtype: str = "float32"  # model.dtype as configured (learned heads follow it unless method.head_dtype)
    head_dtype: Optional[str] = None  # the resolved auto head dtype (EffectiveConfig.head_dtype), as `specdec run`
    tree_nodes: int = 0  # a draft tree's nodes per verify of a greedy / sampled request, as `specdec run` resolves
    sampled_tree_nodes: int = 0  # them (EffectiveConfig.tree_nodes, sampled_tree_nodes)


@dataclass(frozen=True)
class SideSamples:
    """Continuations [N, T] (``END`` after an early stop) and the engine's speculation stats."""

    tokens: np.ndarray
    stats: dict[str, Any]


class SharedPromptEngine(SpecEngine):
    """A ``SpecEngine`` whose requests all start with ``prompt``: its KV is computed once."""

    def __init__(self, target: Transformer, drafter: Optional[Drafter], options: EngineOptions,
                 prompt: tuple[int, ...]) -> None:
        super().__init__(target, drafter, options)
        needs_hidden = drafter is not None and (drafter.hidden_layers or drafter.needs_final_hidden)
        self.prompt = prompt
        self.prefix_cache = None if needs_hidden else prefix_cache(target, prompt)
        self.shared_len = 0 if self.prefix_cache is None else len(prompt) - 1

    def _admit(self) -> None:
        before = {id(request) for request in self.active}
        super()._admit()
        for request in self.active:
            if id(request) not in before and self.prefix_cache is not None:
                if tuple(request.prompt_token_ids) != self.prompt:
                    raise ValueError(f"request {request.id}: SharedPromptEngine serves one prompt only")
                copy_prefix(self.prefix_cache, self.cache, request.slot)
                request.num_prefilled = self.shared_len


@torch.inference_mode()
def prefix_cache(target: Transformer, prompt: tuple[int, ...]) -> Optional[KVCache]:
    """A one-slot KV cache holding ``prompt[:-1]`` (None for a one-token prompt)."""
    if len(prompt) < 2:
        return None
    cache = target.new_cache(1, len(prompt) - 1)
    target(cache, [0], [torch.tensor(prompt[:-1], dtype=torch.int64)], logits_for=[0])
    return cache


def copy_prefix(prefix: KVCache, cache: KVCache, slot: int) -> None:
    """Put the prefix's keys and values into ``slot`` (which must be empty)."""
    n = prefix.length(0)
    cache.k[:, slot, :, :n] = prefix.k[:, 0, :, :n]
    cache.v[:, slot, :, :n] = prefix.v[:, 0, :, :n]
    cache.advance(slot, n)


def build_engine(setup: EngineSetup, method: MethodConfig, case: PromptCase, max_new_tokens: int) -> SpecEngine:
    """An engine for ``method`` (``none``: target-only) sized for this prompt."""
    k = method.num_draft_tokens
    max_seq_len = len(case.token_ids) + max_new_tokens + k + 2
    deps = DrafterDeps(target=setup.target, num_slots=setup.batch_size, max_seq_len=max_seq_len,
                       vocab_size=setup.target.arch.vocab_size, device=setup.device, dtype=setup.dtype,
                       model_dtype=setup.model_dtype, head_dtype=setup.head_dtype)
    drafter = build_drafter(method, deps)
    options = EngineOptions(
        max_batch_size=setup.batch_size, max_seq_len=max_seq_len, prefill_chunk=0,
        max_draft_len=k if drafter is not None else 0,
        draft_len_schedule=setup.draft_len_schedule or None,
        rejection=setup.rejection, backend=setup.backend,
        verification=setup.verification, skip=skip_rule(method),
    )
    if method.drafts_a_tree:  # trees verify one request at a time (engine/tree.py)
        return TreeSpecEngine(setup.target, drafter, dataclasses.replace(options, max_batch_size=1),
                              max_nodes=setup.tree_nodes, sampled_max_nodes=setup.sampled_tree_nodes)
    return SharedPromptEngine(setup.target, drafter, options, case.token_ids)


def sample_continuations(engine: SpecEngine, case: PromptCase, num_samples: int, num_tokens: int,
                         first_seed: int, *, extra_tokens: int = 0) -> SideSamples:
    """The first ``num_tokens`` tokens of ``num_samples`` continuations, request i seeded ``first_seed + i``.

    Requests generate ``num_tokens + extra_tokens``: the engine never drafts past a request's
    ``max_new_tokens``, so ``extra_tokens = K`` lets every verify step inside the tested
    positions carry the full K drafts.
    """
    requests = [
        Request(
            id=f"{case.id}/{i}", prompt_token_ids=list(case.token_ids),
            params=dataclasses.replace(case.params, seed=first_seed + i),
            max_new_tokens=num_tokens + extra_tokens, eos_token_ids=case.eos_token_ids,
        )
        for i in range(num_samples)
    ]
    run_to_completion(engine, requests)
    tokens = np.full((num_samples, num_tokens), END, dtype=np.int64)
    for row, request in enumerate(requests):
        output = request.output_token_ids[:num_tokens]
        tokens[row, : len(output)] = output
    return SideSamples(tokens, engine.stats.summary())


@torch.inference_mode()
def conditional_expectation(setup: EngineSetup, case: PromptCase, tokens: np.ndarray) -> np.ndarray:
    """Expected token counts [T, V] of sampled continuations [N, T] given their sampled prefixes.

    Row j sums, over the samples that have a token at position j, the target's filtered law
    of that position given the sample's own tokens before it (one teacher-forced forward per
    sample; the prompt's KV is shared).
    """
    target, prompt = setup.target, case.token_ids
    prefix = prefix_cache(target, prompt)
    shared = 0 if prefix is None else len(prompt) - 1
    lengths = (tokens != END).sum(1)
    expected = torch.zeros(tokens.shape[1], target.arch.vocab_size, dtype=torch.float64)
    for start in range(0, len(tokens), setup.batch_size):
        rows = list(range(start, min(start + setup.batch_size, len(tokens))))
        cache = target.new_cache(len(rows), len(prompt) + tokens.shape[1])
        feeds = []
        for slot, row in enumerate(rows):
            if prefix is not None:
                copy_prefix(prefix, cache, slot)
            fed = tokens[row, : max(int(lengths[row]) - 1, 0)]
            feeds.append(torch.tensor([*prompt[shared:], *fed], dtype=torch.int64))
        counts = [int(lengths[row]) for row in rows]
        logits = target(cache, list(range(len(rows))), feeds, logits_for=counts).logits
        probs = probs_from_logits(logits.float(), *_row_params(case.params, sum(counts))).double().cpu()
        positions = torch.cat([torch.arange(n) for n in counts])
        expected.index_add_(0, positions, probs)
    return expected.numpy()


def _row_params(params: SamplingParams, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.full((rows,), params.temperature, dtype=torch.float32),
            torch.full((rows,), params.top_k, dtype=torch.int64),
            torch.full((rows,), params.top_p, dtype=torch.float32))
