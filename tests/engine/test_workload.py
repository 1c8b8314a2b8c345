"""Workloads become requests; stop conditions end them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdec_cli.config.schema import NoneMethodConfig, SamplerConfig, WorkloadConfig
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.runner import run_requests
from specdec_cli.engine.workload import build_requests, load_prompts
from specdec_cli.errors import ConfigError
from specdec_cli.testing import toy_model


class CharTokenizer:
    """A character-level tokenizer over 'a'..'p' (16 ids), no chat template."""

    eos_token_id = 15
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % 15 for c in text if not c.isspace()][:40] or [0]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def test_builtin_mt_bench_and_repetitive_prompts() -> None:
    assert len(load_prompts(WorkloadConfig(source="builtin", num_prompts=3))) == 3
    mt_bench = load_prompts(WorkloadConfig(source="mt_bench", num_prompts=0))
    assert len(mt_bench) == 80 and mt_bench[0].id == "mt_bench_81"
    repetitive = load_prompts(WorkloadConfig(source="repetitive", num_prompts=6))
    assert len({p.text for p in repetitive}) == 6


def test_jsonl_workload_with_per_request_sampling(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "hello", "temperature": 0.5, "max_new_tokens": 7}) + "\n\n"
                    + json.dumps({"prompt": "world"}) + "\n")
    requests = build_requests(WorkloadConfig(source="jsonl", path=str(path), num_prompts=0, max_new_tokens=9),
                              SamplerConfig(name="greedy", seed=5), CharTokenizer(), chat=True)
    assert [r.id for r in requests] == ["a", "line_3"]
    assert requests[0].params == SamplingParams(0.5, 0, 1.0, seed=5) and requests[0].max_new_tokens == 7
    assert requests[1].params.temperature == 0.0 and requests[1].params.seed == 6


def test_jsonl_problems_are_reported_together(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": 3}\nnot json\n{"prompt": "x", "colour": 1}\n')
    with pytest.raises(ConfigError) as err:
        load_prompts(WorkloadConfig(source="jsonl", path=str(path)))
    assert len(err.value.violations) == 3 and all(str(path) in v for v in err.value.violations)


def test_sampler_mix_cycles_over_requests() -> None:
    workload = WorkloadConfig(source="builtin", num_prompts=4,
                              sampler_mix=[{"temperature": 0.0}, {"temperature": 1.0, "top_k": 5}])
    requests = build_requests(workload, SamplerConfig(name="greedy"), CharTokenizer(), chat=False)
    assert [r.params.temperature for r in requests] == [0.0, 1.0, 0.0, 1.0]
    assert requests[3].params.top_k == 5


def test_eos_and_stop_strings_end_requests() -> None:
    model = toy_model(0, vocab_size=16)
    tokenizer = CharTokenizer()
    engine = SpecEngine(model, None, EngineOptions(max_batch_size=2, max_seq_len=64),
                        decode=lambda ids: tokenizer.decode(ids))
    free = Request(id="free", prompt_token_ids=[1, 2, 3], params=SamplingParams(0.0), max_new_tokens=20)
    run_requests(engine, [free])
    text = tokenizer.decode(free.output_token_ids)
    stop = text[3:5]
    eos = free.output_token_ids[2]
    engine = SpecEngine(model, None, EngineOptions(max_batch_size=2, max_seq_len=64), decode=tokenizer.decode)
    by_stop = Request(id="s", prompt_token_ids=[1, 2, 3], params=SamplingParams(0.0), max_new_tokens=20, stop=(stop,))
    by_eos = Request(id="e", prompt_token_ids=[1, 2, 3], params=SamplingParams(0.0), max_new_tokens=20,
                     eos_token_ids=(eos,))
    run_requests(engine, [by_stop, by_eos])
    assert by_stop.finish_reason == "stop" and by_stop.output_text == text[: text.find(stop)]
    first = free.output_token_ids.index(eos)
    assert by_eos.finish_reason == "eos" and by_eos.output_token_ids == free.output_token_ids[: first + 1]
    assert free.finish_reason == "length"


def test_request_that_cannot_fit_is_refused() -> None:
    engine = SpecEngine(toy_model(0, vocab_size=16), None, EngineOptions(max_batch_size=1, max_seq_len=8))
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        engine.add_request(Request(id="x", prompt_token_ids=[1] * 5, params=SamplingParams(), max_new_tokens=4))
