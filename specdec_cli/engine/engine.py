"""The speculative decoding engine: continuous batching around one step loop.

One ``step()``:
  1. schedule  – admit waiting requests into free KV slots (continuous batching)
  2. verify    – ONE target forward over every active request: a prefill chunk for context
                 requests, ``[last token, d_1..d_k]`` for generation requests
  3. accept    – per generation request, emit 1..k+1 tokens (acceptance.py) and rewind the
                 target KV cache past the rejected drafts
  4. finish    – stop on EOS / max_new_tokens / stop strings; free the slot
  5. draft     – the drafter proposes the next drafts and their q into the slot-indexed
                 proposal buffer, read by step 3 of the next step

Invariant: a request's KV cache holds its committed tokens except the newest one, which
is the first token of the next verify.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from specdec_cli.drafters.base import Drafter, DraftRequest
from specdec_cli.engine.acceptance import accept_group, sample_first_tokens
from specdec_cli.engine.metrics import SpecStats
from specdec_cli.engine.proposals import ProposalBuffer
from specdec_cli.engine.request import Request
from specdec_cli.models import Transformer
from specdec_cli.sampling import expand_draft_probs

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
    relaxed: Optional[tuple[int, float]] = None  # (top-k, delta): MTP relaxed acceptance, lossy


def draft_len_for(batch_size: int, max_draft_len: int, schedule: Optional[dict[int, int]]) -> int:
    """Runtime K (TensorRT-LLM's rule): the value of the first key >= batch_size; a batch
    larger than every key drafts nothing. ``{4: 4, 8: 2}``: bs 1-4 -> 4, 5-8 -> 2, 9+ -> 0."""
    if not schedule:
        return max_draft_len
    keys = [key for key in schedule if key >= batch_size]
    return schedule[min(keys)] if keys else 0


class SpecEngine:
    def __init__(self, target: Transformer, drafter: Optional[Drafter], options: EngineOptions,
                 decode: Optional[Callable[[list[int]], str]] = None) -> None:
        self.target = target
        self.drafter = drafter
        self.options = options
        self.decode = decode
        self.vocab_size = target.arch.vocab_size
        self.cache = target.new_cache(options.max_batch_size, options.max_seq_len)
        max_k = options.max_draft_len if drafter is not None else 0
        self.buffer = ProposalBuffer(
            options.max_batch_size, max_k, drafter.draft_vocab_size if drafter else self.vocab_size,
            store_probs=drafter is not None and drafter.has_proposal_distribution and options.rejection,
        )
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []
        self.free_slots = list(range(options.max_batch_size - 1, -1, -1))
        self.stats = SpecStats()
        self.pending_hidden: dict[int, list[tuple[dict[int, torch.Tensor], Optional[torch.Tensor]]]] = {}

    # ------------------------------------------------------------------ public
    def add_request(self, request: Request) -> None:
        needed = len(request.prompt_token_ids) + request.max_new_tokens
        if needed > self.options.max_seq_len:
            raise ValueError(f"request {request.id}: prompt ({len(request.prompt_token_ids)} tokens) + "
                             f"max_new_tokens ({request.max_new_tokens}) exceeds max_seq_len {self.options.max_seq_len}")
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.id}: empty prompt")
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    @torch.inference_mode()
    def step(self) -> list[Request]:
        """Run one engine step; returns the requests that finished in it."""
        self._admit()
        batch = list(self.active)
        output = self._verify_forward(batch)
        self._accept(batch, output)
        finished = self._finish()
        self._draft()
        return finished

    # ------------------------------------------------------------------ 1. schedule
    def _admit(self) -> None:
        while self.waiting and self.free_slots:
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop()
            self.cache.rewind(request.slot, 0)
            self.buffer.write_placeholder(request.slot)
            if self.drafter is not None:
                self.drafter.add_request(request.slot, request.prompt_token_ids)
            self.active.append(request)

    # ------------------------------------------------------------------ 2. verify
    def _step_tokens(self, request: Request) -> tuple[list[int], int]:
        """(tokens to feed this step, how many trailing positions need logits)."""
        if request.in_prefill:
            chunk = self.options.prefill_chunk if self.options.prefill_chunk > 0 else len(request.prompt_token_ids)
            tokens = request.prompt_token_ids[request.num_prefilled : request.num_prefilled + chunk]
            done = request.num_prefilled + len(tokens) == len(request.prompt_token_ids)
            return tokens, 1 if done else 0
        problem = self.buffer.check(request.slot, self.vocab_size)
        if problem is not None:  # fail closed: verify without these drafts
            self._fallback(problem)
            self.buffer.write_placeholder(request.slot)
        num = self.buffer.num_drafts[request.slot]
        drafts = self.buffer.draft_tokens[request.slot, :num].tolist()
        return [request.output_token_ids[-1], *drafts], 1 + num

    def _verify_forward(self, batch: list[Request]):
        feeds, logit_counts = zip(*(self._step_tokens(r) for r in batch))
        self.stats.target_forwards += 1
        return self.target(
            self.cache, [r.slot for r in batch], [torch.tensor(f, dtype=torch.int64) for f in feeds],
            logits_for=list(logit_counts),
            hidden_layers=self.drafter.hidden_layers if self.drafter else (),
            final_hidden=bool(self.drafter and self.drafter.needs_final_hidden),
        ), [len(f) for f in feeds], list(logit_counts)

    # ------------------------------------------------------------------ 3. accept
    def _accept(self, batch: list[Request], verify) -> None:
        output, fed, logit_counts = verify
        logit_rows = torch.split(output.logits, logit_counts)
        token_offsets = [0]
        for n in fed:
            token_offsets.append(token_offsets[-1] + n)
        first_token_rows, groups = [], {}
        for index, request in enumerate(batch):
            if request.in_prefill:
                request.num_prefilled += fed[index]
                if not request.in_prefill:
                    first_token_rows.append(index)
                self._keep_hidden(request, output, token_offsets[index], fed[index])
            else:
                groups.setdefault(logit_counts[index] - 1, []).append(index)
        if first_token_rows:
            self._sample_first(batch, first_token_rows, logit_rows)
        for k, rows in groups.items():
            self._accept_group(batch, rows, k, logit_rows, output, token_offsets)

    def _params(self, requests: list[Request]):
        return dict(
            temperature=torch.tensor([r.params.temperature for r in requests], dtype=torch.float32),
            top_k=torch.tensor([r.params.top_k for r in requests], dtype=torch.int64),
            top_p=torch.tensor([r.params.top_p for r in requests], dtype=torch.float32),
            generators=[r.generator for r in requests],
        )

    def _sample_first(self, batch: list[Request], rows: list[int], logit_rows) -> None:
        requests = [batch[i] for i in rows]
        logits = torch.cat([logit_rows[i] for i in rows])
        tokens = sample_first_tokens(logits, **self._params(requests))
        for request, token in zip(requests, tokens.tolist()):
            request.output_token_ids.append(token)

    def _accept_group(self, batch, rows: list[int], k: int, logit_rows, output, token_offsets) -> None:
        requests = [batch[i] for i in rows]
        slots = [r.slot for r in requests]
        logits = torch.stack([logit_rows[i] for i in rows])  # [G, k+1, V]
        draft_tokens, draft_probs = self.buffer.read(slots, k)
        use_rejection = self.options.rejection and self.drafter is not None and k > 0
        if use_rejection and draft_probs is not None:
            draft_probs = expand_draft_probs(draft_probs, self.drafter.d2t, self.vocab_size)
            if not bool((draft_probs.gather(-1, draft_tokens[..., None]) > 0).all()):
                self._fallback("a draft token has zero probability under its stored q")
                use_rejection = False
        tokens, emitted, _ = accept_group(
            logits, draft_tokens, draft_probs=draft_probs if use_rejection else None,
            use_rejection=use_rejection, backend=self.options.backend,
            relaxed=self.options.relaxed if k > 0 else None, **self._params(requests),
        )
        for group_row, (row, request) in enumerate(zip(rows, requests)):
            num_emitted = int(emitted[group_row])
            new_tokens = tokens[group_row, :num_emitted].tolist()
            self.stats.observe(k, num_emitted)
            request.steps += 1
            # KV holds the fed [last, d_1..d_k]; keep last + accepted drafts.
            self.cache.rewind(request.slot, self.cache.length(request.slot) - (k + 1) + num_emitted)
            self._keep_hidden(request, output, token_offsets[row], num_emitted)
            request.output_token_ids.extend(new_tokens)

    def _fallback(self, problem: str) -> None:
        if self.stats.guard_fallbacks == 0:
            log.warning("proposal buffer check failed (%s); using strict acceptance", problem)
        self.stats.guard_fallbacks += 1

    def _keep_hidden(self, request: Request, output, offset: int, count: int) -> None:
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
            if request.in_prefill or not self._check_stop(request):
                continue
            self.active.remove(request)
            self.stats.generated_tokens += len(request.output_token_ids)
            if self.drafter is not None:
                self.drafter.remove_request(request.slot, request.token_ids)
            self.pending_hidden.pop(request.slot, None)
            self.buffer.write_placeholder(request.slot)
            self.cache.rewind(request.slot, 0)
            self.free_slots.append(request.slot)
            finished.append(request)
        return finished

    def _check_stop(self, request: Request) -> bool:
        """Truncate at EOS / max_new_tokens / a stop string; True when the request is done."""
        out = request.output_token_ids
        for index, token in enumerate(out):
            if token in request.eos_token_ids:
                del out[index + 1 :]
                request.finish_reason = "eos"
                break
        if request.finish_reason is None and len(out) >= request.max_new_tokens:
            del out[request.max_new_tokens :]
            request.finish_reason = "length"
        if request.stop and self.decode is not None:
            text = self.decode(out)
            hits = [text.find(s) for s in request.stop if s in text]
            if hits:
                request.output_text = text[: min(hits)]
                request.finish_reason = "stop"
        return request.finish_reason is not None

    # ------------------------------------------------------------------ 5. draft
    def _draft(self) -> None:
        generating = [r for r in self.active if not r.in_prefill]
        if self.drafter is None or not generating:
            return
        k = draft_len_for(len(self.active), self.options.max_draft_len, self.options.draft_len_schedule)
        groups: dict[int, list[Request]] = {}
        for request in generating:
            # never draft past max_new_tokens (the verify also emits one token of its own)
            groups.setdefault(max(0, min(k, request.remaining - 1)), []).append(request)
        for k_r, requests in groups.items():
            if k_r == 0:
                for request in requests:
                    self.buffer.write_placeholder(request.slot)
                continue
            proposal = self.drafter.propose([self._draft_request(r) for r in requests], k_r)
            self.stats.draft_forwards += 1
            for row, request in enumerate(requests):
                probs = proposal.draft_probs[row] if proposal.draft_probs is not None else None
                self.buffer.write(request.slot, proposal.tokens[row], probs, proposal.num_drafts[row])

    def _draft_request(self, request: Request) -> DraftRequest:
        pending = self.pending_hidden.pop(request.slot, [])
        hidden = {layer: torch.cat([h[layer] for h, _ in pending]) for layer in (pending[0][0] if pending else {})}
        finals = [f for _, f in pending if f is not None]
        return DraftRequest(
            slot=request.slot, token_ids=request.token_ids, temperature=request.params.temperature,
            top_k=request.params.top_k, top_p=request.params.top_p, generator=request.generator,
            target_hidden=hidden, target_final_hidden=torch.cat(finals) if finals else None,
        )
