"""Tensor parallelism over 2 gloo ranks: same tokens as one process, and the right gathers.

One spawned group runs every configuration (spawning ranks dominates the cost); each run is
compared with the single-process run of the same configuration, token for token.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from toy_run import Methods, Paths, Reference, outputs, results, run_config

from specdec_cli.parallel.launch import spawn_ranks

GREEDY = ("none", "ngram", "suffix", "self_spec", "eagle3", "mtp", "pard", "dflash")
SAMPLED = ["sampler=temperature", "sampler.temperature=0.8", "rejection=on"]
# run name -> (method, extra overrides, shard a separate draft model whatever its size)
RUNS: dict[str, tuple[str, list[str], bool]] = {
    **{name: (name, [], False) for name in GREEDY},
    "self_spec_sampled": ("self_spec", SAMPLED, False),
    "self_spec_argmax_drafts": ("self_spec", [*SAMPLED, "method.draft_policy=argmax"], False),
    "draft_model_replicated": ("draft_model", SAMPLED, False),
    "draft_model_sharded": ("draft_model", [], True),
    "eagle3_sampled": ("eagle3", SAMPLED, False),
}


@pytest.fixture(scope="module")
def tp_runs(toy_paths: Paths, methods: Methods, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from rank_jobs import run_jobs  # the ranks import it by this name too

    root = tmp_path_factory.mktemp("tp")
    jobs, dirs = [], {}
    for name, (method, extra, shard_draft) in RUNS.items():
        cfg, effective = run_config(toy_paths, *methods[method], *extra, "parallelism=tp2")
        dirs[name] = root / name
        jobs.append((cfg, effective, dirs[name], shard_draft))
    spawn_ranks(run_jobs, (jobs,), world_size=2)
    return dirs


@pytest.mark.parametrize("name", list(RUNS))
def test_same_tokens_as_one_process(name: str, tp_runs: dict[str, Path], methods: Methods,
                                    reference: Reference) -> None:
    method, extra, _ = RUNS[name]
    expected = reference(*methods[method], *extra)
    got = outputs(tp_runs[name])
    assert [row["id"] for row in got] == [row["id"] for row in expected]
    assert [row["output_token_ids"] for row in got] == [row["output_token_ids"] for row in expected]
    record = results(tp_runs[name])
    assert record["parallel"]["mode"] == "tensor_parallel" and record["parallel"]["world_size"] == 2


def collectives(tp_runs: dict[str, Path], name: str) -> dict[str, int]:
    return results(tp_runs[name])["parallel"]["collectives"]


def test_target_rows_are_all_gathered_and_retrieval_drafts_need_no_gather(tp_runs: dict[str, Path]) -> None:
    for name in ("none", "ngram", "suffix"):
        counts = collectives(tp_runs, name)
        assert counts["target.all_logits"] > 0 and counts["all_reduce"] > 0
        assert not any(kind.startswith("draft.") for kind in counts), counts


def test_greedy_drafts_gather_only_argmax_pairs(tp_runs: dict[str, Path]) -> None:
    for name in ("self_spec", "self_spec_argmax_drafts", "draft_model_sharded"):
        counts = collectives(tp_runs, name)
        assert counts["draft.argmax_pairs"] > 0 and "draft.all_logits" not in counts, (name, counts)


def test_sampled_drafts_all_gather_their_logits(tp_runs: dict[str, Path]) -> None:
    counts = collectives(tp_runs, "self_spec_sampled")
    assert counts["draft.all_logits"] > 0 and "draft.argmax_pairs" not in counts
    assert results(tp_runs["self_spec_sampled"])["effective"]["rejection"]


def test_replicated_draft_heads_are_never_gathered(tp_runs: dict[str, Path]) -> None:
    """A small separate draft model and the feature heads (EAGLE-3's reduced vocabulary included)
    hold whole logits on every rank."""
    for name in ("draft_model_replicated", "eagle3", "eagle3_sampled", "mtp", "pard", "dflash"):
        counts = collectives(tp_runs, name)
        assert not any(kind.startswith("draft.") for kind in counts), (name, counts)
        assert results(tp_runs[name])["metrics"]["proposed_drafts"] > 0
