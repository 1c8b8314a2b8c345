"""Attention data parallelism over 2 gloo ranks: every request finishes exactly once, with the
tokens a single process produces, for every method; a rank without requests leaves cleanly."""
from __future__ import annotations

from pathlib import Path

import pytest
from toy_run import Methods, Paths, Reference, outputs, results, run_config

from specdec_cli.config.matrix import METHODS
from specdec_cli.parallel.launch import spawn_ranks

RUNS = ("none", "ngram", "suffix", "self_spec", "draft_model", "eagle3", "mtp", "pard", "dflash")


@pytest.fixture(scope="module")
def adp_runs(toy_paths: Paths, methods: Methods, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from rank_jobs import run_jobs  # the ranks import it by this name too

    root = tmp_path_factory.mktemp("adp")
    runs = {name: [*methods[name], "parallelism=adp2"] for name in RUNS}
    runs["one_request"] = [*methods["ngram"], "parallelism=adp2", "workload.num_prompts=1"]
    jobs = [(*run_config(toy_paths, *overrides), root / name, False) for name, overrides in runs.items()]
    spawn_ranks(run_jobs, (jobs,), world_size=2)
    return {name: root / name for name in runs}


def test_every_method_is_covered() -> None:
    assert {"draft_target" if name in ("self_spec", "draft_model") else name for name in RUNS} == set(METHODS)


@pytest.mark.parametrize("name", RUNS)
def test_same_tokens_as_one_process_each_request_once(name: str, adp_runs: dict[str, Path], methods: Methods,
                                                      reference: Reference) -> None:
    expected = reference(*methods[name])
    got = outputs(adp_runs[name])
    assert [row["id"] for row in got] == [row["id"] for row in expected]  # once each, in workload order
    assert [row["output_token_ids"] for row in got] == [row["output_token_ids"] for row in expected]
    record = results(adp_runs[name])
    assert record["parallel"]["requests_per_rank"] == [3, 2]
    assert record["metrics"]["num_requests"] == len(expected)
    assert record["metrics"]["generated_tokens"] == sum(len(row["output_token_ids"]) for row in expected)


def test_no_draft_logits_cross_ranks(adp_runs: dict[str, Path]) -> None:
    for name in RUNS:
        assert results(adp_runs[name])["parallel"]["collectives"] == {}, name


def test_a_rank_without_requests_leaves_cleanly(adp_runs: dict[str, Path], methods: Methods,
                                                reference: Reference) -> None:
    record = results(adp_runs["one_request"])
    assert record["parallel"]["requests_per_rank"] == [1, 0]
    (row,) = outputs(adp_runs["one_request"])
    assert row["output_token_ids"] == reference(*methods["ngram"])[0]["output_token_ids"]
