"""``baseline=true``: the job also runs method=none on the same requests and records the speed-up."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_cli.cli import output
from specdec_cli.config.compose import compose_config
from specdec_cli.config.validate import resolve
from specdec_cli.errors import ConfigError
from specdec_cli.run.job import run_job

SHORT = ("workload=showcase", "workload.max_new_tokens=12",
         "workload.prompts=[Repeat: one two three one two three,Count from one to ten]")


def _run(tiny_model_dir, tmp_path: Path, *overrides: str):
    cfg = compose_config(["model=hf", f"model.path={tiny_model_dir}", "method=ngram", "baseline=true",
                          *SHORT, *overrides])
    return run_job(cfg, resolve(cfg), tmp_path, show_progress=False)


def test_baseline_writes_metrics_speedup_and_the_identity_check(tiny_model_dir, tmp_path: Path) -> None:
    result = _run(tiny_model_dir, tmp_path)
    metrics = json.loads((tmp_path / "results.json").read_text())["metrics"]
    baseline = metrics["baseline"]
    assert baseline["generated_tokens"] == metrics["generated_tokens"] == 24
    assert baseline["target_forwards"] >= metrics["target_forwards"]  # drafted steps never take more forwards
    assert metrics["speedup"] == pytest.approx(metrics["tokens_per_s"] / baseline["tokens_per_s"])
    assert metrics["baseline_identical"] is True  # greedy: speculative output == autoregressive output
    assert result.metrics == metrics


def test_sampled_runs_record_no_identity_check(tiny_model_dir, tmp_path: Path) -> None:
    metrics = _run(tiny_model_dir, tmp_path, "sampler=temperature").metrics
    assert "baseline" in metrics and "speedup" in metrics and "baseline_identical" not in metrics


def test_no_baseline_by_default(tiny_model_dir, tmp_path: Path) -> None:
    metrics = _run(tiny_model_dir, tmp_path, "baseline=false").metrics
    assert not {"baseline", "speedup", "baseline_identical"} & metrics.keys()


def test_parallel_runs_refuse_a_baseline_and_a_profile_at_validation() -> None:
    cfg = compose_config(["parallelism=tp2", "baseline=true", "profile=true"])
    with pytest.raises(ConfigError) as caught:
        resolve(cfg)
    assert caught.value.violations == [
        "baseline=true runs in a single process; parallelism=tp2 has no autoregressive baseline (use parallelism=single)",
        "profile=true runs in a single process; parallelism=tp2 is not profiled (one trace per process) "
        "(use parallelism=single)",
    ]


def test_the_summary_shows_baseline_and_speedup(tiny_model_dir, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    result = _run(tiny_model_dir, tmp_path)
    output.print_run_summary(result, str(tmp_path))
    printed = capsys.readouterr().out
    assert f"{result.metrics['baseline']['tokens_per_s']:.1f} tokens/s" in printed
    assert f"{result.metrics['speedup']:.2f}x tokens/s over autoregressive" in printed
    tpot_ms, baseline_tpot_ms = (1e3 * m["tpot_s"]["mean"] for m in (result.metrics, result.metrics["baseline"]))
    assert f"{tpot_ms:.1f} ms vs {baseline_tpot_ms:.1f} ms autoregressive ({baseline_tpot_ms / tpot_ms:.2f}x)" in printed
    assert "greedy output = autoregressive" in printed and "yes" in printed
