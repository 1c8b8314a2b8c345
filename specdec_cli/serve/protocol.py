"""OpenAI request bodies (pydantic) and the JSON the server answers with.

Bodies ignore fields they do not know (clients send ``user``, ``logprobs``, ...). Sampling fields
missing from a body take the server configuration's values (``sampler.*``, ``workload.max_new_tokens``);
``top_k`` is an extension. Every value is checked by ``SamplingParams.problems`` (the same rules as the
CLI); a problem is a 400 with an OpenAI-style error body.
"""
from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from specdec_cli.api.outputs import FINISH_REASONS
from specdec_cli.api.params import SamplingParams
from specdec_cli.engine.request import Request


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    n: int = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None

    def sampling_params(self) -> SamplingParams:
        """The body's sampling fields; no seed: a fresh random one (two unseeded requests differ)."""
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=seed,
                              max_tokens=self.max_tokens, stop=self.stop)

    def problems(self, params: SamplingParams) -> list[str]:
        """What is wrong with the body's values (``params``: its ``sampling_params()``)."""
        return ([] if self.n == 1 else [f"n={self.n}: only n=1 is supported"]) + params.problems()


class CompletionBody(_Body):
    prompt: Union[str, list[str]]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: Union[str, list[TextPart]]

    def plain(self) -> dict[str, str]:
        """``{"role", "content"}`` with text parts joined."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": self.role, "content": text}


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None

    def sampling_params(self) -> SamplingParams:
        params = super().sampling_params()
        if self.max_tokens is None and self.max_completion_tokens is not None:
            return dataclasses.replace(params, max_tokens=self.max_completion_tokens)
        return params


def error_body(message: str, kind: str = "invalid_request_error", code: Optional[str] = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def usage(requests: list[Request]) -> dict[str, Any]:
    """Token counts plus the speculation behind them (over every choice of a response)."""
    prompt = sum(len(r.prompt_token_ids) for r in requests)
    completion = sum(len(r.output_token_ids) for r in requests)
    steps = sum(r.steps for r in requests)
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "acceptance_length": sum(r.emitted_tokens for r in requests) / steps if steps else 0.0,
        "draft_tokens_proposed": sum(p for r in requests for p, _ in r.drafts),
        "draft_tokens_accepted": sum(a for r in requests for _, a in r.drafts),
        "verify_steps": steps,
    }


def finish_reason(request: Request) -> str:
    return FINISH_REASONS.get(request.finish_reason or "", "length")


class ResponseShape:
    """The JSON of one response (completion or chat), whole or as stream chunks."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, requests: list[Request], texts: list[str]) -> dict[str, Any]:
        choices = []
        for index, (request, text) in enumerate(zip(requests, texts)):
            body = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text,
                                                                                          "logprobs": None}
            choices.append({"index": index, **body, "finish_reason": finish_reason(request)})
        return {**self._envelope(choices, chunk=False), "usage": usage(requests)}

    def chunk(self, index: int, text: str, finish: Optional[str] = None, *, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        return self._envelope([choice], chunk=True)

    def usage_chunk(self, requests: list[Request]) -> dict[str, Any]:
        return {**self._envelope([], chunk=True), "usage": usage(requests)}
