"""A generation request and its per-request sampling state."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # <= 0: off
    top_p: float = 1.0  # 1: off
    seed: Optional[int] = None  # None: unseeded (fresh entropy)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Request:
    """One prompt to complete. The engine fills the fields below the line."""

    id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    prompt: str = ""
    stop: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    # ---- engine state
    output_token_ids: list[int] = field(default_factory=list)
    slot: int = -1
    num_prefilled: int = 0  # prompt tokens already in the target KV cache
    steps: int = 0  # verify steps taken (generation phase)
    finish_reason: Optional[str] = None  # "eos" | "length" | "stop"
    output_text: str = ""
    generator: Optional[torch.Generator] = None

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

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
