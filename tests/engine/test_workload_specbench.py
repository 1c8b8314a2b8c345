"""Spec-Bench questions (question_id, category, turns): validated before any model loads, categories carried
to the requests and broken down in results.json (metrics.per_category) and in the report."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdec_cli.config.schema import SamplerConfig, WorkloadConfig
from specdec_cli.config.validate import resolve
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import build_requests, read_workload
from specdec_cli.errors import ConfigError
from specdec_cli.report.rows import row_from_results
from specdec_cli.report.tables import to_markdown
from specdec_cli.run.result import category_metrics, category_tally, merge_tallies

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it rhyme."]},
    {"question_id": 2, "category": "math_reasoning", "turns": ["What is 17 * 3?"]},
    {"question_id": 3, "category": "writing", "turns": ["Describe a sunset."]},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def spec_bench(path: Path) -> WorkloadConfig:
    return WorkloadConfig(name="spec_bench", source="spec_bench", path=str(path), num_prompts=0)


def test_rows_are_first_turns_with_their_category(tmp_path: Path) -> None:
    rows = read_workload(spec_bench(write_jsonl(tmp_path / "question.jsonl", QUESTIONS)))
    assert [(r.id, r.text, r.category) for r in rows] == [
        ("spec_bench_1", "Write a haiku about rain.", "writing"),
        ("spec_bench_2", "What is 17 * 3?", "math_reasoning"),
        ("spec_bench_3", "Describe a sunset.", "writing"),
    ]


def test_the_composed_option_reads_a_question_file(make_config, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "question.jsonl", QUESTIONS)
    cfg = make_config("workload=spec_bench", f"workload.path={path}")
    assert (cfg.workload.source, cfg.workload.num_prompts) == ("spec_bench", 0)
    assert len(read_workload(cfg.workload)) == 3


def test_a_path_is_required(make_config) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(make_config("workload=spec_bench"))
    assert "workload.source=spec_bench needs workload.path=<spec_bench.jsonl>" in info.value.violations


def test_every_bad_row_is_named_before_any_model_loads(tmp_path: Path) -> None:
    rows = [
        {"question_id": 1, "turns": ["no category"]},
        {"question_id": 2, "category": "", "turns": ["empty category"]},
        {"question_id": 3, "category": "qa", "turns": [""]},
        {"category": "qa", "turns": ["no id"]},
        {"question_id": 5, "category": "qa", "turns": ["fine"]},
        {"question_id": 5, "category": "qa", "turns": ["duplicate id"]},
        {"prompt": "a prompts file"},
    ]
    path = write_jsonl(tmp_path / "question.jsonl", rows)
    with pytest.raises(ConfigError) as info:
        read_workload(spec_bench(path))
    assert info.value.violations == [
        f'{path}:1: "category" must be a non-empty string',
        f'{path}:2: "category" must be a non-empty string',
        f"{path}:3: empty first turn",
        f'{path}:4: expected Spec-Bench format: one JSON object per line with "question_id", "category" and '
        '"turns" (a list of strings)',
        f"{path}:6: duplicate id 'spec_bench_5' (first on line 5)",
        f'{path}:7: expected Spec-Bench format: one JSON object per line with "question_id", "category" and '
        '"turns" (a list of strings); use workload.source=jsonl for a prompts file',
    ]


def test_mt_bench_rows_carry_their_category_too() -> None:
    rows = read_workload(WorkloadConfig(source="mt_bench", num_prompts=0))
    assert len({row.category for row in rows}) == 8 and rows[0].category == "writing"


class CharTokenizer:
    """Enough of a tokenizer for build_requests: one id per character, no chat template."""

    eos_token_id = 0
    chat_template = None

    def __call__(self, text: str, **_: object) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def test_requests_carry_the_category(tmp_path: Path) -> None:
    cfg = spec_bench(write_jsonl(tmp_path / "question.jsonl", QUESTIONS))
    requests = build_requests(cfg, SamplerConfig(name="greedy"), CharTokenizer(), chat=False)
    assert [r.category for r in requests] == ["writing", "math_reasoning", "writing"]


def finished(category: str | None, *, steps: int, emitted: int, outputs: int, seconds: float) -> Request:
    request = Request(id=f"r{steps}", prompt_token_ids=[1], params=SamplingParams(), max_new_tokens=64,
                      category=category)
    request.steps, request.emitted_tokens = steps, emitted
    request.output_token_ids = list(range(outputs))
    request.arrival_s, request.finish_s = 10.0, 10.0 + seconds
    return request


def test_per_category_metrics_pool_each_category() -> None:
    requests = [
        finished("writing", steps=4, emitted=10, outputs=10, seconds=1.0),
        finished("writing", steps=6, emitted=10, outputs=9, seconds=1.0),
        finished("qa", steps=5, emitted=5, outputs=5, seconds=0.5),
    ]
    assert category_metrics(category_tally(requests)) == {"per_category": {
        "qa": {"num_requests": 1, "generated_tokens": 5, "acceptance_length": 1.0, "tokens_per_s": 10.0},
        "writing": {"num_requests": 2, "generated_tokens": 19, "acceptance_length": 2.0, "tokens_per_s": 9.5},
    }}
    assert category_metrics(category_tally([finished(None, steps=1, emitted=1, outputs=1, seconds=1.0)])) == {}
    # the ranks of a data-parallel run each tally their share; the merged tally gives the same metrics
    shares = [category_tally(requests[:1]), category_tally(requests[1:]), {}]
    assert category_metrics(merge_tallies(shares)) == category_metrics(category_tally(requests))


def test_the_report_has_a_per_category_table() -> None:
    metrics = {"acceptance_length": 1.5, "tokens_per_s": 20.0, "per_category": {
        "writing": {"num_requests": 2, "acceptance_length": 2.0, "tokens_per_s": 9.5},
        "qa": {"num_requests": 1, "acceptance_length": 1.0, "tokens_per_s": 10.0}}}
    row = row_from_results("ngram_k4", {"config": {"method": {"name": "ngram", "num_draft_tokens": 4}},
                                        "metrics": metrics})
    text = to_markdown("t", [row], (), [])
    assert "## Per category" in text
    assert "| ngram_k4 | ngram | qa | 1 | 1.00 | 10.0 |" in text
    assert "| ngram_k4 | ngram | writing | 2 | 2.00 | 9.5 |" in text
    plain = row_from_results("none", {"config": {"method": {"name": "none"}}, "metrics": {}})
    assert "Per category" not in to_markdown("t", [plain], (), [])
