"""What ``LLM.generate`` returns: one ``RequestOutput`` per prompt, with its ``RequestMetrics``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from specdec_cli.engine.request import Request

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "error": "error"}  # engine -> OpenAI / vLLM names


@dataclass(frozen=True)
class RequestMetrics:
    """Speculation and latency of one request (times in seconds, host clock)."""

    acceptance_length: float  # mean tokens per verify step, bonus/recovered token included
    per_position_acceptance: list[float]  # [i]: P(draft i+1 accepted | proposed)
    draft_tokens_proposed: int
    draft_tokens_accepted: int
    steps: int  # verify steps
    ttft_s: float  # arrival -> first token
    tpot_s: Optional[float]  # per output token after the first; None below 2 tokens
    itl_s: list[float]  # one inter-token latency per output token after the first
    e2e_s: float  # arrival -> finish


@dataclass(frozen=True)
class RequestOutput:
    """One finished request. ``finish_reason``: "stop" (EOS or a stop string), "length", or "error" (``error``
    says why: non-finite logits; the tokens before the fault are kept)."""

    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    error: Optional[str] = None


def request_metrics(request: Request) -> RequestMetrics:
    """The metrics of a finished engine request."""
    return RequestMetrics(
        acceptance_length=request.acceptance_length,
        per_position_acceptance=request.per_position_acceptance,
        draft_tokens_proposed=sum(proposed for proposed, _ in request.drafts),
        draft_tokens_accepted=sum(accepted for _, accepted in request.drafts),
        steps=request.steps, ttft_s=request.ttft_s, tpot_s=request.tpot_s, itl_s=request.itl_s,
        e2e_s=request.finish_s - request.arrival_s,
    )


def final_text(request: Request, decode) -> str:
    """The request's text: cut before a stop string when one ended it, else all its tokens decoded."""
    return request.output_text if request.finish_reason == "stop" else decode(request.output_token_ids)


def request_output(request: Request, decode) -> RequestOutput:
    """The public output of a finished engine request (``decode``: token ids -> text)."""
    return RequestOutput(
        request_id=request.id, prompt=request.prompt, prompt_token_ids=list(request.prompt_token_ids),
        text=final_text(request, decode), token_ids=list(request.output_token_ids),
        finish_reason=FINISH_REASONS.get(request.finish_reason or "", "length"), metrics=request_metrics(request),
        error=request.error,
    )
