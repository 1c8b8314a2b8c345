"""``profile=true``: per-step time breakdown rows that add up to results.json's, and a torch.profiler trace."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_cli.config.compose import compose_config
from specdec_cli.config.validate import resolve
from specdec_cli.run.job import run_job

PHASES = ("target_forward", "draft", "accept", "other")


@pytest.mark.parametrize("method", ["draft_target", "none"])
def test_profile_writes_steps_that_sum_to_the_breakdown_and_a_trace(tiny_model_dir, tmp_path: Path,
                                                                     method: str) -> None:
    cfg = compose_config(["model=hf", f"model.path={tiny_model_dir}", f"method={method}", "profile=true", *(["method.self_speculative_layers=1"] if method != "none" else []),
                          "workload=showcase", "workload.max_new_tokens=10", "engine.max_batch_size=2",
                          "workload.prompts=[Repeat: one two three one two three,Count from one to ten,Hi]"])
    metrics = run_job(cfg, resolve(cfg), tmp_path, show_progress=False).metrics
    rows = [json.loads(line) for line in (tmp_path / "profile_steps.jsonl").read_text().splitlines()]
    assert metrics["profile"] == {"steps": len(rows), "steps_file": "profile_steps.jsonl",
                                  "trace_file": "profile_trace.json"}
    assert [row["step"] for row in rows] == list(range(len(rows))) and {row["batch"] for row in rows} <= {1, 2}
    totals = metrics["time_breakdown_s"]
    for phase in PHASES[:3]:
        assert sum(row[phase] for row in rows) == pytest.approx(totals[phase], rel=1e-9, abs=1e-12)
    assert sum(row["other"] for row in rows) == pytest.approx(totals["other"], rel=1e-6, abs=1e-9)
    assert sum(row["drafts"] for row in rows) == metrics["proposed_drafts"]
    assert (method == "none") == (metrics["proposed_drafts"] == 0)
    assert sum(row["emitted"] for row in rows) == pytest.approx(metrics["acceptance_length"] * metrics["verify_steps"])
    events = json.loads((tmp_path / "profile_trace.json").read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert {"specdec.target_forward", "specdec.accept", "specdec.draft"} <= names


def test_no_profile_files_by_default(tiny_model_dir, tmp_path: Path) -> None:
    cfg = compose_config(["model=hf", f"model.path={tiny_model_dir}", "method=ngram", "workload=showcase",
                          "workload.max_new_tokens=4", "workload.prompts=[Hi]"])
    metrics = run_job(cfg, resolve(cfg), tmp_path, show_progress=False).metrics
    assert "profile" not in metrics and not list(tmp_path.glob("profile_*"))
