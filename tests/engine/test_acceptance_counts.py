"""Per-step acceptance counts: the run's histogram (``SpecStats.accepted_per_step``) and one request's
per-position acceptance (``Request.drafts``), on exact sequences."""
from __future__ import annotations

from specdec_cli.engine.metrics import SpecStats
from specdec_cli.engine.request import Request, SamplingParams


def test_accepted_per_step_counts_verify_steps_by_drafts_accepted() -> None:
    stats = SpecStats()
    for proposed, emitted in [(4, 1), (4, 5), (4, 3), (2, 3), (0, 1), (4, 3)]:
        stats.observe(proposed, emitted)
    assert stats.accepted_per_step == [2, 0, 3, 0, 1]
    assert stats.summary()["accepted_per_step"] == [2, 0, 3, 0, 1]
    assert sum(stats.accepted_per_step) == stats.verify_steps


def test_request_per_position_acceptance() -> None:
    request = Request(id="r", prompt_token_ids=[1], params=SamplingParams(), max_new_tokens=8)
    assert request.per_position_acceptance == []
    request.drafts += [(3, 3), (3, 1), (2, 0), (1, 1)]
    # position 1: proposed 4x, accepted 3x; position 2: 3x, 1x; position 3: 2x, 1x
    assert request.per_position_acceptance == [3 / 4, 1 / 3, 1 / 2]
