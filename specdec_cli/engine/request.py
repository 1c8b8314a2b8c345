"""A generation request, its per-request sampling state and its timestamps."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # <= 0: off
    top_p: float = 1.0  # 1: off
    seed: Optional[int] = None  # None: unseeded (fresh entropy)


@dataclass
class Request:
    """One prompt to complete. The engine fills the fields below the line.

    Timestamps are ``time.perf_counter()`` seconds: ``arrival_s`` when the engine took the request,
    ``chunks`` one (time, output length after it) per step that emitted tokens (the first chunk is the
    first token), ``finish_s`` when it finished.
    """

    id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    prompt: str = ""
    stop: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    category: Optional[str] = None  # the workload's category of the prompt (per-category metrics)
    # ---- engine state
    output_token_ids: list[int] = field(default_factory=list)
    slot: int = -1
    num_prefilled: int = 0  # prompt tokens already in the target KV cache
    steps: int = 0  # verify steps taken (generation phase)
    emitted_tokens: int = 0  # tokens those verify steps emitted (before stop truncation)
    drafts: list[tuple[int, int]] = field(default_factory=list)  # (proposed, accepted) drafts per verify step
    finish_reason: Optional[str] = None  # "eos" | "length" | "stop" | "error"
    error: Optional[str] = None  # why the request failed (finish_reason "error")
    output_text: str = ""
    generator: Optional[torch.Generator] = None
    arrival_s: float = 0.0
    chunks: list[tuple[float, int]] = field(default_factory=list)
    finish_s: float = 0.0

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.generator = torch.Generator(device="cpu").manual_seed(self.params.seed)

    def place_generator(self, device: torch.device) -> None:
        """Re-seed the request's generator on ``device`` (the model's) when it lives elsewhere; the engine calls
        this on admission, before anything is drawn (a CUDA generator's stream differs from the CPU one)."""
        if self.generator is not None and self.generator.device != torch.device(device):
            self.generator = torch.Generator(device=device).manual_seed(self.params.seed)

    def check_stop(self, decode: Optional[Callable[[list[int]], str]]) -> bool:
        """Truncate at EOS / max_new_tokens / a stop string; True when the request is done (or failed)."""
        if self.finish_reason == "error":
            return True
        out = self.output_token_ids
        for index, token in enumerate(out):
            if token in self.eos_token_ids:
                del out[index + 1 :]
                self.finish_reason = "eos"
                break
        if self.finish_reason is None and len(out) >= self.max_new_tokens:
            del out[self.max_new_tokens :]
            self.finish_reason = "length"
        if self.stop and decode is not None:
            text = decode(out)
            hits = [text.find(s) for s in self.stop if s in text]
            if hits:
                self.output_text = text[: min(hits)]
                self.finish_reason = "stop"
        return self.finish_reason is not None

    @property
    def in_prefill(self) -> bool:
        return self.num_prefilled < len(self.prompt_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """The committed sequence: prompt + output."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_token_ids)

    @property
    def acceptance_length(self) -> float:
        """Mean tokens emitted per verify step (bonus/recovered token included); 0.0 before the first."""
        return self.emitted_tokens / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """[i]: P(draft i+1 accepted | proposed) over this request's verify steps (empty: never drafted)."""
        depth = max((proposed for proposed, _ in self.drafts), default=0)
        proposed_at = [sum(p > i for p, _ in self.drafts) for i in range(depth)]
        accepted_at = [sum(a > i for _, a in self.drafts) for i in range(depth)]
        return [a / p for a, p in zip(accepted_at, proposed_at)]

    @property
    def ttft_s(self) -> float:
        """Time to first token: arrival -> the chunk holding the first output token."""
        return self.chunks[0][0] - self.arrival_s if self.chunks else 0.0

    @property
    def tpot_s(self) -> Optional[float]:
        """Time per output token after the first: (finish - first token) / (output tokens - 1); None below 2."""
        if len(self.output_token_ids) < 2 or not self.chunks:
            return None
        return (self.finish_s - self.chunks[0][0]) / (len(self.output_token_ids) - 1)

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latency, one sample per output token after the first: a chunk of n kept tokens emitted
        g seconds after the previous chunk contributes n samples of g / n (tokens cut by a stop count not)."""
        kept = len(self.output_token_ids)
        samples: list[float] = []
        for (before_s, before_len), (at_s, at_len) in zip(self.chunks, self.chunks[1:]):
            count = min(at_len, kept) - min(before_len, kept)
            samples += [(at_s - before_s) / count] * count if count > 0 else []
        return samples


def stamp_outputs(batch: list[Request], now: float) -> None:
    """Record a chunk for every request that gained output tokens this step (latency metrics)."""
    for request in batch:
        length = len(request.output_token_ids)
        if length > (request.chunks[-1][1] if request.chunks else 0):
            request.chunks.append((now, length))
