"""The public ``SamplingParams`` (vLLM's field names) and how it maps onto a workload row's overrides.

Every field left ``None`` takes the value the LLM's configuration gives, exactly as ``specdec run``
would: ``sampler.temperature`` / ``top_k`` / ``top_p``, seed ``sampler.seed + i`` for the i-th prompt
of a call, ``workload.max_new_tokens`` and ``workload.stop``. Values are checked with the same rules
(and messages) as a workload file's per-request fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from specdec_cli.errors import sampling_problems

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request; ``None``: the configuration's value (see the module docstring)."""

    temperature: Optional[float] = None  # 0: greedy
    top_k: Optional[int] = None  # 0: off
    top_p: Optional[float] = None  # 1: off
    seed: Optional[int] = None  # a non-negative 63-bit int
    max_tokens: Optional[int] = None  # new tokens at most
    stop: Optional[Union[str, Sequence[str]]] = None  # stop strings (not included in the text)

    @property
    def stop_strings(self) -> Optional[tuple[str, ...]]:
        """``stop`` as a tuple (a single string becomes one), or None when unset."""
        if self.stop is None:
            return None
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def overrides(self) -> dict[str, Any]:
        """The set fields under the names a workload row uses (``max_tokens`` -> ``max_new_tokens``)."""
        values = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                  "seed": self.seed, "max_new_tokens": self.max_tokens}
        return {key: value for key, value in values.items() if value is not None}

    def problems(self, where: str = "") -> list[str]:
        """One line per invalid field, each starting with ``where``."""
        values = self.overrides()
        out = []
        if "max_new_tokens" in values:
            max_tokens = values.pop("max_new_tokens")
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
                out.append(f"{where}max_tokens={max_tokens!r} must be an integer >= 1")
        out += sampling_problems(values, where)
        stops = self.stop_strings
        if stops is not None and not all(isinstance(s, str) and s for s in stops):
            out.append(f"{where}stop={self.stop!r} must be a non-empty string or a list of them")
        return out


def messages_problems(messages: object, where: str = "") -> list[str]:
    """Why ``messages`` is not a chat ([{role, content}, ...], the last from the user), one line each."""
    if not isinstance(messages, (list, tuple)) or not messages:
        return [f"{where}messages must be a non-empty list of {{'role', 'content'}} dicts"]
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            out.append(f"{where}messages[{i}] must be a dict with exactly 'role' and 'content'")
        elif message["role"] not in ROLES:
            out.append(f"{where}messages[{i}].role={message['role']!r} is not one of {', '.join(ROLES)}")
        elif not isinstance(message["content"], str) or not message["content"].strip():
            out.append(f"{where}messages[{i}].content must be a non-empty string")
    if not out and messages[-1]["role"] != "user":
        out.append(f"{where}the last message must be from the user (the model answers it)")
    return out
