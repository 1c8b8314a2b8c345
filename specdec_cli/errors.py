"""Errors the CLI reports as one line per problem, never as a traceback.

``SpecdecError`` is an expected failure (exit 1); ``ConfigError`` is an invalid
configuration or input and carries every violation found at once (exit 2).
"""
from __future__ import annotations


class SpecdecError(Exception):
    """An expected failure, reported in one line."""

    exit_code = 1


class ConfigError(SpecdecError):
    """An invalid configuration or input: every violated rule, one message each."""

    exit_code = 2

    def __init__(self, violations: list[str]) -> None:
        super().__init__("; ".join(violations))
        self.violations = list(violations)
