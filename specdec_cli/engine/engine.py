"""The speculative decoding engine: continuous batching around one step, ``SpecEngine.step``.

Read ``step`` first: it is the whole speculative iteration (schedule -> target forward -> accept ->
finish -> draft); the helpers below it each do one of those phases. Invariant: a request's KV cache
holds its committed tokens except the newest one, which is the first token of the next verify.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from specdec_cli.drafters.base import Drafter, DraftRequest
from specdec_cli.engine.adaptive import AcceptanceTracker, SkipRule, draft_len_for
from specdec_cli.engine.cuda_graphs import GraphedVerify
from specdec_cli.engine.metrics import SpecStats
from specdec_cli.engine.proposals import ProposalBuffer
from specdec_cli.engine.request import Request, stamp_outputs
from specdec_cli.engine.rules import AcceptanceOptions, acceptance_rule
from specdec_cli.models import ForwardOutput, Transformer
from specdec_cli.sampling import BatchParams, sample_tokens

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineOptions:
    max_batch_size: int = 1
    max_seq_len: int = 1024
    prefill_chunk: int = 512  # <= 0: whole prompt in one step
    max_draft_len: int = 0  # K
    draft_len_schedule: Optional[dict[int, int]] = None  # max batch size -> K (None: always K)
    rejection: bool = True  # rejection sampling where the drafter has a q
    backend: str = "torch"  # rejection kernel: torch | flashinfer
    verification: str = "token"  # rejection rule: token | block (a chain's block, a tree's traversal verification)
    relaxed: Optional[tuple[int, float]] = None  # (top-k, delta): MTP relaxed acceptance, lossy
    thinking: Optional[tuple[int, int]] = None  # (begin, end) token ids: relaxed only in between (None: everywhere)
    skip: Optional[SkipRule] = None  # adaptive skipping of requests whose drafts do not pay (None: off)
    cuda_graphs: bool = False  # decode-phase verifies through GraphedVerify (captured on CUDA, eager elsewhere)


class Feed(NamedTuple):
    """What one request feeds the target this step."""

    tokens: list[int]  # a prefill chunk, or [last token, d_1..d_k]
    num_logits: int  # trailing positions that need logits (k + 1; 1 or 0 for a prefill chunk)
    prefill: bool


class SpecEngine:
    def __init__(self, target: Transformer, drafter: Optional[Drafter], options: EngineOptions,
                 decode: Optional[Callable[[list[int]], str]] = None) -> None:
        self.target, self.drafter, self.options, self.decode = target, drafter, options, decode
        self.vocab_size = target.arch.vocab_size
        self.acceptance = AcceptanceOptions(options.rejection, options.backend, options.verification,
                                            options.relaxed, options.thinking)
        # engine.cuda_graphs: one more slot, the scratch row that graph warm-up and padding write
        self.cache = target.new_cache(options.max_batch_size + options.cuda_graphs, options.max_seq_len)
        self.graphed = GraphedVerify(target, self.cache, drafter) if options.cuda_graphs else None
        self.buffer = ProposalBuffer(
            options.max_batch_size, options.max_draft_len if drafter is not None else 0, self.vocab_size,
            store_probs=drafter is not None and drafter.has_proposal_distribution and options.rejection,
            device=target.device)
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []
        self.pending_hidden: dict[int, list[tuple[dict[int, torch.Tensor], Optional[torch.Tensor]]]] = {}
        self.reset()

    def reset(self) -> None:
        """Fresh bookkeeping for an idle engine: every slot free (lowest first), no statistics, no history."""
        self.free_slots = list(range(self.options.max_batch_size - 1, -1, -1))
        self.acceptance.usage.update({backend: 0 for backend in self.acceptance.usage})
        self.stats = SpecStats()
        self.stats.backend_usage = self.acceptance.usage
        skip = self.options.skip
        self.tracker = AcceptanceTracker(skip) if skip is not None and self.drafter is not None else None

    def add_request(self, request: Request) -> None:
        needed = len(request.prompt_token_ids) + request.max_new_tokens
        if needed > self.options.max_seq_len:
            raise ValueError(f"request {request.id}: prompt ({len(request.prompt_token_ids)} tokens) + "
                             f"max_new_tokens ({request.max_new_tokens}) exceeds max_seq_len {self.options.max_seq_len}")
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.id}: empty prompt")
        request.arrival_s = time.perf_counter()
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    @torch.inference_mode()
    def step(self) -> list[Request]:
        """One speculative iteration over every active request; returns the requests that finished in it.

        Phase times go to ``stats`` (host clock; a CUDA target would need a synchronize before each reading).
        """
        started = time.perf_counter()
        # 1. schedule: admit waiting requests into free KV slots; the batch's sampling parameters, once
        self._admit()
        batch = list(self.active)
        params = BatchParams.of(batch, device=self.target.device)
        feeds = [self._feed(request) for request in batch]

        # 2. target forward: verify [last, d_1..d_k] for generation requests + prefill chunks, one pass
        with self.stats.timed("target_forward"):
            output = self._target_forward(batch, feeds)

        # 3. accept: a first token after a finished prefill; per runtime k, ONE rule decides the group
        with self.stats.timed("accept"):
            logits, offsets, failed = self._after_forward(batch, feeds, output, params)
            for k, rows in self._groups(feeds, skip=failed).items():
                draft_tokens, draft_probs, proposal_ok = self.buffer.read([batch[i].slot for i in rows], k)
                if not proposal_ok:
                    self._fallback("a draft token has zero probability under its stored q")
                group = params.select(rows)
                rule = acceptance_rule(group, k, self.acceptance, proposal_ok=proposal_ok)
                contexts = [batch[i].token_ids for i in rows] if rule.name == "relaxed" else None
                tokens, emitted = rule.accept(torch.stack([logits[i] for i in rows]), draft_tokens, draft_probs,
                                              group, contexts)
                self._commit([batch[i] for i in rows], k, tokens, emitted, output, [offsets[i] for i in rows])
            stamp_outputs(batch, time.perf_counter())

        # 4. finish: EOS / max_new_tokens / stop strings; free the slots
        finished = self._finish()

        # 5. draft: the next drafts and the q each was drawn from, into the slot-indexed buffer
        with self.stats.timed("draft"):
            rows = [i for i, request in enumerate(batch) if request.finish_reason is None and not request.in_prefill]
            if self.drafter is not None and rows:
                self._draft([batch[i] for i in rows], params.select(rows))
        self.stats.end_step(started, len(batch))
        return finished

    def _contain_nonfinite(self, batch: list[Request], feeds: list[Feed], logits: torch.Tensor) -> set[int]:
        """Rows whose target logits [N, V] hold a NaN/inf: each such request ends with finish_reason
        "error" (its output so far kept; ``_finish`` releases its slot). One host sync when all is well."""
        if bool(torch.isfinite(logits.sum(dim=-1)).all()):  # finite row sums: every entry is finite (cheap)
            return set()
        bad_positions = (~torch.isfinite(logits)).any(dim=-1)  # [N]; a finite one overflowed its sum: none fail
        flags, ends = bad_positions.tolist(), itertools.accumulate(feed.num_logits for feed in feeds)
        failed = {row for row, (feed, end) in enumerate(zip(feeds, ends)) if any(flags[end - feed.num_logits : end])}
        for row in failed:
            batch[row].finish_reason = "error"
            where = "after the prompt" if feeds[row].prefill else f"at step {batch[row].steps + 1}"
            batch[row].error = f"non-finite target logits {where}"
            log.warning("request %s: %s", batch[row].id, batch[row].error)
        return failed

    # ------------------------------------------------------------------ 1. schedule
    def _admit(self) -> None:
        while self.waiting and self.free_slots:
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop()
            request.place_generator(self.target.device)
            self.cache.rewind(request.slot, 0)
            self.buffer.write_placeholder(request.slot)
            if self.drafter is not None:
                self.drafter.add_request(request.slot, request.prompt_token_ids)
            self.active.append(request)

    def _feed(self, request: Request) -> Feed:
        """The request's tokens for this step; a proposal that fails the buffer check is dropped (fail closed)."""
        if request.in_prefill:
            chunk = self.options.prefill_chunk if self.options.prefill_chunk > 0 else len(request.prompt_token_ids)
            tokens = request.prompt_token_ids[request.num_prefilled : request.num_prefilled + chunk]
            done = request.num_prefilled + len(tokens) == len(request.prompt_token_ids)
            return Feed(tokens, 1 if done else 0, prefill=True)
        problem = self.buffer.check(request.slot)
        if problem is not None:
            self._fallback(problem)
            self.buffer.write_placeholder(request.slot)
        num = self.buffer.num_drafts[request.slot]
        drafts = self.buffer.draft_tokens[request.slot, :num].tolist()
        return Feed([request.output_token_ids[-1], *drafts], 1 + num, prefill=False)

    # ------------------------------------------------------------------ 2. target forward
    def _target_forward(self, batch: list[Request], feeds: list[Feed]) -> ForwardOutput:
        self.stats.target_forwards += 1
        if self.graphed is not None and GraphedVerify.fits([f.tokens for f in feeds], [f.num_logits for f in feeds]):
            return self.graphed([r.slot for r in batch], [f.tokens for f in feeds])
        return self.target(
            self.cache, [r.slot for r in batch], [torch.tensor(f.tokens, dtype=torch.int64, device=self.target.device) for f in feeds],
            logits_for=[f.num_logits for f in feeds],
            hidden_layers=self.drafter.hidden_layers if self.drafter else (),
            final_hidden=bool(self.drafter and self.drafter.needs_final_hidden),
        )

    # ------------------------------------------------------------------ 3. accept
    def _after_forward(self, batch: list[Request], feeds: list[Feed], output: ForwardOutput, params: BatchParams):
        """Logits per request, token offsets and the rows whose logits were not finite (finished with an error);
        a request whose prompt just completed samples its first token."""
        logits = torch.split(output.logits, [feed.num_logits for feed in feeds])
        offsets = list(itertools.accumulate((len(feed.tokens) for feed in feeds), initial=0))
        first = self._advance_prefill(batch, feeds, output, offsets)
        failed = self._contain_nonfinite(batch, feeds, output.logits)
        first = [row for row in first if row not in failed]
        if first:
            tokens = sample_tokens(torch.cat([logits[i] for i in first])[:, None], params.select(first))
            for row, token in zip(first, tokens[:, 0].tolist()):
                batch[row].output_token_ids.append(token)
        return logits, offsets, failed

    def _advance_prefill(self, batch: list[Request], feeds: list[Feed], output: ForwardOutput,
                         offsets: list[int]) -> list[int]:
        """Count the fed prefill chunks; the rows whose prompt is now complete (they sample a first token)."""
        done = []
        for row, (request, feed) in enumerate(zip(batch, feeds)):
            if feed.prefill:
                request.num_prefilled += len(feed.tokens)
                self._keep_hidden(request, output, offsets[row], len(feed.tokens))
                if not request.in_prefill:
                    done.append(row)
        return done

    @staticmethod
    def _groups(feeds: list[Feed], skip: set[int]) -> dict[int, list[int]]:
        """Generation rows (but ``skip``) grouped by their runtime draft length k (in batch order)."""
        groups: dict[int, list[int]] = {}
        for row, feed in enumerate(feeds):
            if not feed.prefill and row not in skip:
                groups.setdefault(feed.num_logits - 1, []).append(row)
        return groups

    def _commit(self, requests: list[Request], k: int, tokens: torch.Tensor, emitted: torch.Tensor,
                output: ForwardOutput, offsets: list[int]) -> None:
        """Append each request's emitted tokens and rewind its KV past the rejected drafts."""
        for request, row_tokens, num_emitted, offset in zip(requests, tokens.tolist(), emitted.tolist(), offsets):
            self.stats.observe(k, num_emitted)
            request.steps += 1
            request.emitted_tokens += num_emitted
            request.drafts.append((k, num_emitted - 1))
            # KV holds the fed [last, d_1..d_k]; keep last + accepted drafts.
            self.cache.rewind(request.slot, self.cache.length(request.slot) - (k + 1) + num_emitted)
            self._keep_hidden(request, output, offset, num_emitted)
            request.output_token_ids.extend(row_tokens[:num_emitted])

    def _fallback(self, problem: str) -> None:
        if self.stats.guard_fallbacks == 0:
            log.warning("proposal buffer check failed (%s); using strict acceptance", problem)
        self.stats.guard_fallbacks += 1

    def _keep_hidden(self, request: Request, output: ForwardOutput, offset: int, count: int) -> None:
        """Queue the target features of newly committed tokens for the drafter."""
        if not output.hidden and output.final_hidden is None:
            return
        hidden = {layer: h[offset : offset + count] for layer, h in output.hidden.items()}
        final = output.final_hidden[offset : offset + count] if output.final_hidden is not None else None
        self.pending_hidden.setdefault(request.slot, []).append((hidden, final))

    # ------------------------------------------------------------------ 4. finish
    def _finish(self) -> list[Request]:
        finished = []
        for request in list(self.active):
            if request.in_prefill or not request.check_stop(self.decode):
                continue
            self.active.remove(request)
            request.finish_s = time.perf_counter()
            self.stats.finished(request)
            if self.drafter is not None:
                self.drafter.remove_request(request.slot, request.token_ids)
            self.pending_hidden.pop(request.slot, None)
            self.buffer.write_placeholder(request.slot)
            self.cache.rewind(request.slot, 0)
            self.free_slots.append(request.slot)
            finished.append(request)
        return finished

    # ------------------------------------------------------------------ 5. draft
    def _draft(self, generating: list[Request], params: BatchParams) -> None:
        """Propose for ``generating`` (rows of ``params``), grouped by runtime k; k = 0 writes placeholders."""
        k = draft_len_for(len(self.active), self.options.max_draft_len, self.options.draft_len_schedule)
        groups: dict[int, list[int]] = {}
        for row, request in enumerate(generating):
            drafts = self.tracker is None or self.tracker.observe(request)
            # never draft past max_new_tokens (the verify also emits one token of its own)
            groups.setdefault(max(0, min(k, request.remaining - 1)) if drafts else 0, []).append(row)
        for k_r, rows in groups.items():
            slots = [generating[row].slot for row in rows]
            if k_r == 0:
                for slot in slots:
                    self.buffer.write_placeholder(slot)
                continue
            proposal = self.drafter.propose([self._draft_request(generating[row]) for row in rows], k_r,
                                            params.select(rows))
            self.stats.draft_forwards += 1
            self.buffer.write_proposal(slots, proposal, self.drafter.d2t)
        if self.tracker is not None:
            self.tracker.sent(generating, self.buffer.num_drafts)

    def _draft_request(self, request: Request) -> DraftRequest:
        pending = self.pending_hidden.pop(request.slot, [])
        hidden = {layer: torch.cat([h[layer] for h, _ in pending]) for layer in (pending[0][0] if pending else {})}
        finals = [f for _, f in pending if f is not None]
        return DraftRequest(slot=request.slot, token_ids=request.token_ids, target_hidden=hidden,
                            target_final_hidden=torch.cat(finals) if finals else None)
