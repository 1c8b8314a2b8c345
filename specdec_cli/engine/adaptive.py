"""The runtime draft length: the batch-size schedule (``draft_len_for``), then adaptive skipping, where a
request drafts only while its recent acceptance says drafting pays.

The rule (per request, inside a batch): ``estimate`` is an exponential moving average of the drafts accepted
per drafted step, starting at ``START`` (optimistic: a new request drafts) and updated after every verify of
real drafts: ``estimate = (1 - WEIGHT) * estimate + WEIGHT * accepted``. A request whose estimate is below
``min_accept`` drafts nothing (a plain decode step, which is lossless), except on every ``probe_every``-th step
since it last drafted: that probe's acceptance updates the estimate, so a request whose text turns predictable
recovers. Steps where the request drafted nothing for another reason (the batch-size schedule, its last token)
leave the estimate as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from specdec_cli.config.schema import MethodConfig
from specdec_cli.engine.request import Request


def draft_len_for(batch_size: int, max_draft_len: int, schedule: Optional[dict[int, int]]) -> int:
    """Runtime K (TensorRT-LLM's rule): the value of the first key >= batch_size; a batch
    larger than every key drafts nothing. ``{4: 4, 8: 2}``: bs 1-4 -> 4, 5-8 -> 2, 9+ -> 0."""
    if not schedule:
        return max_draft_len
    keys = [key for key in schedule if key >= batch_size]
    return schedule[min(keys)] if keys else 0


START = 1.0  # the estimate of a new request (accepted drafts per step)
WEIGHT = 0.3  # weight of the newest drafted step in the estimate


@dataclass(frozen=True)
class SkipRule:
    min_accept: float  # skip below this estimate (accepted drafts per drafted step); > 0
    probe_every: int = 8  # a skipping request drafts again every this many steps; >= 1


def skip_rule(method: MethodConfig) -> Optional[SkipRule]:
    """``method.adaptive_min_accept`` / ``adaptive_probe_every`` as a rule (None: off)."""
    if method.adaptive_min_accept <= 0:
        return None
    return SkipRule(method.adaptive_min_accept, method.adaptive_probe_every)


@dataclass
class _Track:
    request_id: str
    emitted: int  # request.emitted_tokens when it last drafted
    sent: int  # drafts it sent then (0: none)
    estimate: float = START
    idle: int = 0  # steps since it last sent drafts


class AcceptanceTracker:
    """Per KV slot, the running acceptance of the request in it; ``observe`` once per step, then ``sent``."""

    def __init__(self, rule: SkipRule) -> None:
        self.rule = rule
        self.tracks: dict[int, _Track] = {}
        self.skipped = 0  # request-steps that drafted nothing because of the rule

    def observe(self, request: Request) -> bool:
        """Fold the request's last verify into its estimate; whether it should draft this step."""
        track = self.tracks.get(request.slot)
        if track is None or track.request_id != request.id:
            self.tracks[request.slot] = _Track(request.id, request.emitted_tokens, 0)
            return True
        if track.sent:  # that verify emitted the accepted drafts + one token of the target's own
            accepted = request.emitted_tokens - track.emitted - 1
            track.estimate = (1 - WEIGHT) * track.estimate + WEIGHT * accepted
        drafts = track.estimate >= self.rule.min_accept or track.idle + 1 >= self.rule.probe_every
        self.skipped += not drafts
        return drafts

    def sent(self, requests: list[Request], num_drafts: list[int]) -> None:
        """Record what each of ``requests`` (each ``observe``d this step) drafted: ``num_drafts[slot]``."""
        for request in requests:
            track = self.tracks[request.slot]
            track.emitted, track.sent = request.emitted_tokens, num_drafts[request.slot]
            track.idle = 0 if track.sent else track.idle + 1
