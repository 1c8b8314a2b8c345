"""Errors the CLI reports as one line per problem, never as a traceback, and the value checks
shared by every place that accepts sampling parameters (config, workload rows).

``SpecdecError`` is an expected failure (exit 1); ``ConfigError`` is an invalid
configuration or input and carries every violation found at once (exit 2).
Seeds are non-negative 63-bit integers: 0 <= seed <= 2**63 - 1.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

MAX_SEED = 2**63 - 1
MAX_LINES = 20  # violations shown before "... and N more"


class SpecdecError(Exception):
    """An expected failure, reported in one line."""

    exit_code = 1


class ConfigError(SpecdecError):
    """An invalid configuration or input: every violated rule, one message each."""

    exit_code = 2

    def __init__(self, violations: list[str]) -> None:
        super().__init__("; ".join(violations))
        self.violations = list(violations)

    @classmethod
    def capped(cls, violations: list[str], limit: int = MAX_LINES) -> ConfigError:
        """At most ``limit`` violations, then one ``... and N more problems`` line."""
        shown = list(violations[:limit])
        if len(violations) > limit:
            shown.append(f"... and {len(violations) - limit} more problems")
        return cls(shown)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def seed_problem(value: object, where: str) -> Optional[str]:
    """Why ``value`` is not a seed (a non-negative 63-bit int), or None; ``where`` names it
    (``sampler.seed``, ``prompts.jsonl:3: seed``)."""
    if not _is_int(value) or not 0 <= value <= MAX_SEED:
        return f"{where}={value!r} must be an integer in [0, 2**63 - 1] (seeds are non-negative 63-bit ints)"
    return None


#: sampling field -> (check, what a valid value is)
_SAMPLING_RULES = {
    "max_new_tokens": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "temperature": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0 = greedy)"),
    "top_k": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 = off)"),
    "top_p": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1] (1 = off)"),
}
SAMPLING_FIELDS = (*_SAMPLING_RULES, "seed")


def sampling_problems(values: Mapping[str, object], where: str) -> list[str]:
    """One line per invalid field of a per-request sampling override; every key must be one of
    ``SAMPLING_FIELDS`` (the caller names unknown keys with its own allowed list)."""
    out = []
    for key, value in values.items():
        if key == "seed":
            problem = seed_problem(value, f"{where}seed")
        else:
            valid, expected = _SAMPLING_RULES[key]
            problem = None if valid(value) else f"{where}{key}={value!r} must be {expected}"
        if problem:
            out.append(problem)
    return out
