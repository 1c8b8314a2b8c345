"""``LLM``: the engine for Python users, loaded once, with no files written.

``LLM(overrides)`` composes and validates the overrides exactly like ``specdec run`` (the same
``conf/`` tree, the same rules, the same messages; an invalid setting raises ``ConfigError``, whose
``violations`` are the lines the CLI prints), then builds the pipeline of ``run/`` without a
workload. ``generate`` and ``chat`` turn prompts into engine requests the way ``specdec run`` turns a
workload's rows into them (``build_requests``: chat template when ``model.chat_template``, seeds
``sampler.seed + i``, ``workload.max_new_tokens``, ``workload.stop``), run them through the engine's
continuous batching and return one ``RequestOutput`` per prompt, in order.

Not thread-safe: one caller steps the engine at a time (the server gives it one thread).
"""
from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence, Union

from specdec_cli.api.outputs import RequestOutput, request_output
from specdec_cli.api.params import SamplingParams, messages_problems
from specdec_cli.config.compose import compose_config
from specdec_cli.config.validate import resolve
from specdec_cli.engine.drive import run_to_completion
from specdec_cli.engine.request import Request
from specdec_cli.engine.workload import WorkloadRow, build_requests, check_requests
from specdec_cli.errors import ConfigError
from specdec_cli.run.pipeline import Pipeline, build_pipeline

Messages = Sequence[dict[str, str]]
ParamsArg = Union[SamplingParams, Sequence[SamplingParams], None]


class LLM:
    """A loaded target + drafter + engine. ``LLM(["method=eagle3", "rejection=on"])``."""

    def __init__(self, overrides: Sequence[str] = ()) -> None:
        cfg = compose_config(list(overrides))
        effective = resolve(cfg)
        if cfg.parallelism.tp > 1 or cfg.parallelism.dp > 1:
            raise ConfigError([f"parallelism={cfg.parallelism.name}: the Python API and the server run in one "
                               "process (use parallelism=single, or `specdec run` for parallel jobs)"])
        self.config, self.effective = cfg, effective
        self.pipeline: Pipeline = build_pipeline(cfg, effective, with_workload=False)
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.pipeline.tokenizer

    @property
    def model_name(self) -> str:
        """The served model's name: ``server.model_name``, else ``model.path``, else ``model.name``."""
        return self.config.server.model_name or self.config.model.path or self.config.model.name

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def generate(self, prompts: Union[str, Sequence[str]], params: ParamsArg = None) -> list[RequestOutput]:
        """Complete each prompt (one ``SamplingParams`` for all, or one per prompt)."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        problems = [f"prompts[{i}] must be a non-empty string" for i, p in enumerate(prompts)
                    if not isinstance(p, str) or not p.strip()]
        rows = [WorkloadRow(id="", text=p, overrides={}) for p in prompts]
        return self._run(rows, params, chat=self.config.model.chat_template, problems=problems)

    def chat(self, messages: Union[Messages, Sequence[Messages]], params: ParamsArg = None) -> list[RequestOutput]:
        """Answer one chat (a list of ``{"role", "content"}``) or a list of chats, through the chat template."""
        chats = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        problems = [line for i, chat in enumerate(chats) for line in messages_problems(chat, f"chat {i}: ")]
        rows = [WorkloadRow(id="", text=_chat_text(chat), overrides={}, messages=tuple(chat)) for chat in chats]
        return self._run(rows, params, chat=True, problems=problems)

    def make_requests(self, rows: list[WorkloadRow], params: list[SamplingParams], *, chat: bool) -> list[Request]:
        """Engine requests for ``rows`` with ``params`` (one each), built and checked like ``specdec run``'s.

        Rows without an id get the next ``"<n>"``. Raises ``ConfigError`` for requests that cannot fit."""
        rows = [WorkloadRow(id=row.id or str(next(self._ids)), text=row.text, messages=row.messages,
                            overrides={**row.overrides, **p.overrides()}) for row, p in zip(rows, params)]
        requests = build_requests(self.config.workload, self.config.sampler, self.tokenizer, chat=chat, rows=rows)
        for request, p in zip(requests, params):
            request.stop = p.stop_strings if p.stop_strings is not None else request.stop
        check_requests(requests, max_seq_len=self.config.engine.max_seq_len,
                       max_position_embeddings=self.pipeline.target.arch.position_limit)
        return requests

    def rebuild_engine(self) -> None:
        """Load a fresh pipeline (target, drafter, engine): after a failed step their state is unknown."""
        self.pipeline = build_pipeline(self.config, self.effective, with_workload=False)

    def stats(self) -> dict[str, Any]:
        """The engine's speculation and latency summary over everything generated so far."""
        return self.pipeline.engine.stats.summary()

    def _run(self, rows: list[WorkloadRow], params: ParamsArg, *, chat: bool,
             problems: list[str]) -> list[RequestOutput]:
        per_row = _per_row(params, len(rows), problems)
        if problems:
            raise ConfigError.capped(problems)
        requests = self.make_requests(rows, per_row, chat=chat)
        try:
            run_to_completion(self.pipeline.engine, requests)
        except ValueError as err:  # the engine refuses a request (checked above; kept as an input error)
            raise ConfigError([str(err)]) from None
        return [request_output(request, self.decode) for request in requests]


def _per_row(params: ParamsArg, count: int, problems: list[str]) -> list[SamplingParams]:
    """One ``SamplingParams`` per row; their problems are appended to ``problems``."""
    if params is None or isinstance(params, SamplingParams):
        per_row = [params or SamplingParams()] * count
        problems += per_row[0].problems() if per_row else []
        return per_row
    per_row = list(params)
    if len(per_row) != count:
        problems.append(f"{len(per_row)} SamplingParams for {count} prompts: give one, or one per prompt")
        return [SamplingParams()] * count
    for i, p in enumerate(per_row):
        problems += p.problems(f"params[{i}]: ") if isinstance(p, SamplingParams) else [
            f"params[{i}] is a {type(p).__name__}, not a SamplingParams"]
    return per_row


def _chat_text(messages: Messages) -> str:
    """A chat as ``role: content`` lines (the ``prompt`` field of its output)."""
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages if isinstance(m, dict))
