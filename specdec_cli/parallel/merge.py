"""Attention-DP results: every rank's share merged into one run on rank 0.

Counts are summed (lists position by position, dicts key by key) and the rates recomputed from the sums (``SpecStats.summary``); the wall time
is the slowest rank's (the ranks run concurrently), so ``tokens_per_s`` is the aggregate rate.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from specdec_cli.engine.metrics import SpecStats


@dataclass
class RankShare:
    """What one ADP rank sends to rank 0: its requests' output rows (by workload index), its stats."""

    rank: int
    indices: list[int]
    rows: list[dict]
    stats: SpecStats
    load_s: float
    categories: dict[str, list[float]] = field(default_factory=dict)  # run/result.py category_tally


def merge_stats(parts: list[SpecStats]) -> SpecStats:
    """Sum every counter (lists position by position); wall time is the maximum."""
    merged = SpecStats()
    for part in parts:
        for spec in dataclasses.fields(SpecStats):
            if spec.metadata.get("per_process"):
                continue
            mine, theirs = getattr(merged, spec.name), getattr(part, spec.name)
            if spec.name == "wall_s":
                merged.wall_s = max(mine, theirs)
            elif isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for position, value in enumerate(theirs):
                    mine[position] += value
            elif isinstance(mine, dict):  # backend_usage: counts per kernel
                for key, value in theirs.items():
                    mine[key] = mine.get(key, 0) + value
            else:
                setattr(merged, spec.name, mine + theirs)
    return merged


def merge_rows(shares: list[RankShare], num_requests: int) -> list[dict]:
    """The output rows in workload order; every request must come back exactly once."""
    by_index: dict[int, dict] = {}
    for share in shares:
        for index, row in zip(share.indices, share.rows, strict=True):
            if index in by_index:
                raise RuntimeError(f"request {row['id']} finished on more than one rank")
            by_index[index] = row
    missing = sorted(set(range(num_requests)) - set(by_index))
    if missing:
        raise RuntimeError(f"{len(missing)} request(s) never finished (workload indices {missing[:5]})")
    return [by_index[index] for index in range(num_requests)]
