"""``specdec report``'s pure pipeline on synthetic result trees: collect -> rows -> files."""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import stat
from pathlib import Path

import pytest

from specdec_cli.config.compose import compose_config
from specdec_cli.errors import ConfigError
from specdec_cli.report.collect import collect_runs
from specdec_cli.report.rows import build_rows, method_label, sampler_label
from specdec_cli.report.sweep import build_report, write_report
from specdec_cli.report.tables import to_csv, to_markdown
from report.report_trees import results_record, write_job

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_collect_finds_runs_and_lists_the_failed_job(sweep_dir: Path) -> None:
    collection = collect_runs(sweep_dir)
    assert [run.run for run in collection.runs] == ["0", "1", "2", "3", "5"]
    (missing,) = collection.missing
    assert missing.run == "4" and missing.status.startswith("failed or not run")
    assert missing.overrides == ("method=draft_target", "sampler=topk", "method.self_speculative_layers=4")


def test_collect_tells_dry_runs_and_unreadable_results_apart(tmp_path: Path) -> None:
    write_job(tmp_path / "ok", ["method=none"], results_record("none", "greedy"))
    (write_job(tmp_path / "dry", ["dry_run=true"], None) / "effective.json").write_text("{}")
    (write_job(tmp_path / "broken", ["method=ngram"], None) / "results.json").write_text("{not json")
    status = {m.run: m.status for m in collect_runs(tmp_path).missing}
    assert status["dry"] == "dry run (effective.json only)"
    assert status["broken"].startswith("unreadable results.json")


def test_a_directory_without_results_is_an_input_error(tmp_path: Path) -> None:
    write_job(tmp_path / "0", ["method=eagle3"], None)
    with pytest.raises(ConfigError) as info:
        collect_runs(tmp_path)
    (line,) = info.value.violations
    assert "no results.json found" in line and "method=eagle3" in line
    with pytest.raises(ConfigError, match="not a directory"):
        collect_runs(tmp_path / "nowhere")


def test_rows_have_labels_effective_rejection_and_speedups(sweep_dir: Path) -> None:
    rows = build_rows(collect_runs(sweep_dir).runs)
    table = [(r.run, r.method, r.sampler, r.k, r.rejection, r.speedup) for r in rows]
    assert table == [
        ("0", "none", "greedy", 0, "off", pytest.approx(1.0)),
        ("1", "none", "topk(T=1,k=20)", 0, "off", pytest.approx(1.0)),
        ("5", "draft_target(self=4)", "greedy", 4, "on (greedy)", pytest.approx(2.1)),
        ("2", "ngram", "greedy", 4, "off", pytest.approx(1.5)),
        ("3", "ngram", "topk(T=1,k=20)", 4, "off", pytest.approx(1.5)),
    ]
    ngram = rows[3]
    assert ngram.acceptance_length == 2.5 and ngram.acceptance_rate == pytest.approx(0.375)
    assert ngram.per_position == (0.6, 0.4, 0.3, 0.2)


def test_speedup_is_blank_without_a_matching_baseline(tmp_path: Path) -> None:
    write_job(tmp_path / "a" / "0", [], results_record("none", "greedy", tokens_per_s=100.0))
    write_job(tmp_path / "a" / "1", [], results_record("ngram", "topk", tokens_per_s=150.0))  # other sampler
    write_job(tmp_path / "b" / "0", [], results_record("ngram", "greedy", tokens_per_s=150.0))  # other sweep
    write_job(tmp_path / "a" / "2", [], results_record("ngram", "greedy", workload="mt_bench"))
    rows = {r.run: r for r in build_rows(collect_runs(tmp_path).runs)}
    assert rows["a/0"].speedup == pytest.approx(1.0)
    assert rows["a/1"].speedup is None and rows["b/0"].speedup is None and rows["a/2"].speedup is None


def test_labels() -> None:
    assert method_label({"name": "draft_target", "self_speculative_layers": 4}) == "draft_target(self=4)"
    assert method_label({"name": "draft_target", "draft_path": "/m/draft.gguf", "draft_policy": "argmax"}) == (
        "draft_target(draft,argmax)"
    )
    assert method_label({"name": "ngram", "draft_policy": "argmax"}) == "ngram"
    assert method_label({"name": "eagle3", "tree_topk": 4}) == "eagle3(tree=4)"
    assert method_label({"name": "eagle3", "tree_topk": None}, {"tree_topk": 2}) == "eagle3(tree=2)"  # auto, resolved
    assert method_label({"name": "eagle3", "tree_topk": None}, {"tree_topk": 1}) == "eagle3"
    assert method_label({"name": "eagle3", "tree_topk": 1}) == "eagle3"


def test_labels_name_the_knobs_a_sweep_varies() -> None:
    """A sweep over draft_confidence / the suffix enhancer / the skip rule / the node budget gives rows that say
    which is which; values equal to the method's composed default (eagle3's draft_confidence 0.3) stay out."""
    default = dataclasses.asdict(compose_config(["method=eagle3"]).method)
    assert method_label(default, {"tree_topk": 2}) == "eagle3(tree=2)"
    variant = {**default, "tree_topk": 4, "draft_confidence": 0.5, "suffix_enhancer": False, "suffix_min_match": 5,
               "max_total_draft_tokens": 12}
    assert method_label(variant) == "eagle3(tree=4,conf=0.5,sfx=off,min_match=5,nodes=12)"
    ngram = dataclasses.asdict(compose_config(["method=ngram", "method.adaptive_min_accept=0.5"]).method)
    assert method_label(ngram) == "ngram(skip=0.5)"
    assert method_label({"name": "eagle3", "draft_confidence": 0.0}) == "eagle3(conf=0)"
    assert sampler_label({"name": "temperature", "temperature": 0.0}) == "temperature(T=0)"
    assert sampler_label({"name": "topk_topp", "temperature": 0.7, "top_k": 50, "top_p": 0.9}) == (
        "topk_topp(T=0.7,k=50,p=0.9)"
    )


def test_markdown_and_csv(sweep_dir: Path) -> None:
    summary = build_report(sweep_dir)
    markdown = to_markdown("title", summary.rows, summary.missing, ["plot.png"])
    assert "| 2 | ngram | greedy | quick | 4 | off | 2.50 | 37.5% | 150.0 | 1.50× |" in markdown
    assert "- `4`: failed or not run (no results.json); overrides: `method=draft_target sampler=topk" in markdown
    assert "![plot.png](plot.png)" in markdown
    lines = list(csv.DictReader(io.StringIO(to_csv(summary.rows, summary.missing))))
    assert [line["run"] for line in lines] == ["0", "1", "5", "2", "3", "4"]
    assert float(lines[2]["speedup"]) == pytest.approx(2.1) and lines[2]["num_draft_tokens"] == "4"
    assert lines[5]["status"].startswith("failed") and lines[5]["acceptance_length"] == ""
    assert lines[0]["speedup"] == "1" and lines[3]["per_position_acceptance"] == "0.6000 0.4000 0.3000 0.2000"


def test_write_report_writes_tables_and_non_empty_pngs(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    written = write_report(build_report(sweep_dir), out)
    names = sorted(p.name for p in written)
    assert names == ["acceptance_speedup.png", "accepted_per_step.png", "per_position_acceptance.png", "report.csv",
                     "report.md", "time_breakdown.png", "tokens_per_s_vs_k.png"]
    for path in written:
        assert path.parent == out and path.stat().st_size > 0
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 5000
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporaries
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((out / "report.md").stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_plots_without_speculative_runs_still_render(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps(results_record("none", "greedy")))
    written = write_report(build_report(tmp_path), tmp_path)
    assert all(p.stat().st_size > 0 for p in written)
    assert build_report(tmp_path).rows[0].run == "."


def test_latency_columns_and_step_histogram(tmp_path: Path) -> None:
    record = results_record("ngram", "greedy")
    latency = {"ttft_s": {"mean": 0.2, "p50": 0.1, "p95": 0.3, "p99": 0.4},
               "tpot_s": {"mean": 0.02, "p50": 0.02, "p95": 0.05, "p99": 0.06},
               "itl_s": {"mean": 0.01, "p50": 0.008, "p95": 0.04, "p99": 0.05}}
    record["metrics"].update(latency, accepted_per_step=[5, 3, 2, 0, 1])
    write_job(tmp_path / "spec", ["method=ngram"], record)
    write_job(tmp_path / "old", ["method=none"], results_record("none", "greedy"))  # written before latency
    summary = build_report(tmp_path)
    markdown = to_markdown("t", summary.rows, summary.missing, [])
    assert "| TTFT ms | TPOT ms | ITL ms |" in markdown and "| 100.0 / 300.0 | 20.0 / 50.0 | 8.0 / 40.0 |" in markdown
    lines = list(csv.DictReader(io.StringIO(to_csv(summary.rows, summary.missing))))
    spec = next(line for line in lines if line["run"] == "spec")
    old = next(line for line in lines if line["run"] == "old")
    assert float(spec["ttft_p95_s"]) == 0.3 and float(spec["itl_p50_s"]) == 0.008
    assert spec["accepted_per_step"] == "5 3 2 0 1" and old["ttft_p50_s"] == "" and old["accepted_per_step"] == ""
    (histogram,) = [p for p in write_report(summary, tmp_path / "out") if p.name == "accepted_per_step.png"]
    assert histogram.read_bytes()[:8] == PNG_SIGNATURE and histogram.stat().st_size > 5000


def test_time_breakdown_becomes_milliseconds_per_token_and_a_stacked_bar(tmp_path: Path) -> None:
    record = results_record("eagle3", "greedy")
    record["metrics"].update(generated_tokens=200, time_breakdown_s={"target_forward": 1.0, "draft": 0.2,
                                                                      "accept": 0.1, "other": 0.1})
    write_job(tmp_path / "spec", ["method=eagle3"], record)
    old = results_record("none", "greedy")
    old["metrics"].pop("time_breakdown_s", None)  # written before the breakdown existed
    write_job(tmp_path / "old", ["method=none"], old)
    summary = build_report(tmp_path)
    by_run = {row.run: row for row in summary.rows}
    assert by_run["spec"].ms_per_token == (("target_forward", 5.0), ("draft", 1.0), ("accept", 0.5), ("other", 0.5))
    assert by_run["old"].ms_per_token == ()
    (plot,) = [p for p in write_report(summary, tmp_path / "out") if p.name == "time_breakdown.png"]
    assert plot.read_bytes()[:8] == PNG_SIGNATURE and plot.stat().st_size > 5000
