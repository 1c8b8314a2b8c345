"""resolve(): every rule, explicit opt-in vs auto, and all violations reported together."""
from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from specdec_cli.cli.output import tree_nodes_label
from specdec_cli.config.compose import compose_config
from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.hardware import Hardware
from specdec_cli.config.matrix import METHODS, MODEL_BASED, NON_SPECULATIVE, PLANNED, RETRIEVAL
from specdec_cli.config.schema import RunConfig
from specdec_cli.config.validate import resolve
from specdec_cli.errors import ConfigError

CPU = Hardware(cuda=False, flashinfer_problem="flashinfer needs a CUDA device")
GPU = Hardware(cuda=True, flashinfer_problem=None)
GPU_NO_FLASHINFER = Hardware(cuda=True, flashinfer_problem="flashinfer is not importable")
SAMPLERS = ("greedy", "temperature", "topk", "topp", "topk_topp")
WORKLOADS = ("quick", "mt_bench", "repetitive", "mixed")


@functools.cache
def _config(overrides: tuple[str, ...]) -> RunConfig:
    return compose_config(list(overrides))


def effective(*overrides: str, hw: Hardware = CPU) -> EffectiveConfig:
    return resolve(_config(overrides), hw)


def violations(*overrides: str, hw: Hardware = CPU) -> list[str]:
    with pytest.raises(ConfigError) as info:
        resolve(_config(overrides), hw)
    return info.value.violations


def _combine(method: str, sampler: str, rejection: str, workload: str) -> RunConfig:
    """A combination built from cached per-option slices (composing each one is slow)."""
    return dataclasses.replace(
        _config(()),
        method=_config((f"method={method}",)).method,
        sampler=_config((f"sampler={sampler}",)).sampler,
        rejection=_config((f"rejection={rejection}",)).rejection,
        workload=_config((f"workload={workload}",)).workload,
    )


@pytest.mark.parametrize("method", METHODS)
def test_valid_combinations_resolve(method: str) -> None:
    for sampler in SAMPLERS:
        for workload in WORKLOADS:
            for rejection in ("auto", "off"):
                result = resolve(_combine(method, sampler, rejection, workload), CPU)
                assert result.rejection == (rejection == "auto" and method in MODEL_BASED)
                assert result.device == "cpu" and result.backend == "torch"
            on = _combine(method, sampler, "on", workload)
            if method in MODEL_BASED:
                assert resolve(on, CPU).rejection
            else:
                with pytest.raises(ConfigError, match=f"method={method} does not support rejection"):
                    resolve(on, CPU)


@pytest.mark.parametrize("method", RETRIEVAL)
def test_rejection_on_is_refused_for_retrieval_drafters(method: str) -> None:
    (line,) = violations(f"method={method}", "rejection=on")
    assert f"method={method}" in line and "rejection sampling" in line and "one-hot q" in line


@pytest.mark.parametrize("method", [*RETRIEVAL, *NON_SPECULATIVE])
def test_rejection_auto_turns_off_silently_with_a_reason(method: str) -> None:
    result = effective(f"method={method}", "sampler=topk")
    assert not result.rejection
    assert any(r.startswith(f"rejection=auto -> off: method={method}") for r in result.reasons)


def test_rejection_off_is_strict_acceptance_without_a_reason() -> None:
    result = effective("method=eagle3", "rejection=off", "sampler=topk")
    assert not result.rejection and not any("rejection" in r for r in result.reasons)


def test_all_greedy_takes_the_fast_path_but_keeps_the_method_support() -> None:
    greedy = effective("method=eagle3", "sampler=greedy")
    assert greedy.rejection and greedy.all_greedy
    assert any("argmax fast path" in r for r in greedy.reasons)
    mixed = effective("method=eagle3", "workload=mixed")
    assert mixed.rejection and not mixed.all_greedy
    assert not effective("method=eagle3", "workload=jsonl", f"workload.path={__file__}").all_greedy


THINKING = ("method.begin_thinking_token_id=5", "method.end_thinking_token_id=6")


def test_relaxed_acceptance_rules() -> None:
    auto = effective("method=mtp", "method.relaxed_acceptance=true", *THINKING, "sampler=topk")
    assert auto.relaxed_acceptance and not auto.rejection
    assert any("relaxed acceptance" in r for r in auto.reasons)
    (line,) = violations("method=mtp", "method.relaxed_acceptance=true", "method.relaxed_everywhere=true",
                         "rejection=on")
    assert "rejection sampling cannot be combined with relaxed acceptance" in line
    (line,) = violations("method=eagle3", "method.relaxed_acceptance=true", "rejection=off")
    assert "method=eagle3 does not support relaxed acceptance: relaxed (thinking) acceptance is MTP-only" in line


def test_relaxed_acceptance_needs_thinking_ids_or_an_explicit_everywhere() -> None:
    (line,) = violations("method=mtp", "method.relaxed_acceptance=true", "sampler=topk")
    assert line.startswith("method.relaxed_acceptance=true applies only inside the thinking phase: set "
                           "method.begin_thinking_token_id and method.end_thinking_token_id, or "
                           "method.relaxed_everywhere=true")
    assert effective("method=mtp", "method.relaxed_acceptance=true", "method.relaxed_everywhere=true",
                     "sampler=topk").relaxed_acceptance
    (line,) = violations("method=mtp", "method.begin_thinking_token_id=5", "sampler=topk")
    assert "go together" in line
    (line,) = violations("method=mtp", "method.relaxed_acceptance=true", "method.relaxed_everywhere=true",
                         *THINKING, "sampler=topk")
    assert "contradicts" in line


def test_guided_decoding_is_refused_and_excludes_rejection() -> None:
    (line,) = violations("method=eagle3", "sampler.guided_decoding=json", "rejection=off")
    assert "method=eagle3 does not support guided decoding" in line
    lines = violations("method=eagle3", "sampler.guided_decoding=json", "rejection=on")
    assert any("grammar mask changes the target distribution" in line for line in lines)


def test_parallelism_rules() -> None:
    for option in ("tp2", "adp2"):
        assert effective("method=eagle3", f"parallelism={option}").rejection
    (line,) = violations("parallelism.tp=2", "parallelism.dp=2")
    assert "cannot be combined" in line
    (line,) = violations("method=eagle3", "parallelism=cp2", "rejection=off")
    assert "context parallelism" in line and "whole-vocabulary target rows" in line
    lines = violations("method=eagle3", "parallelism=cp2", "rejection=on")
    assert any(line.startswith("rejection sampling cannot be combined with context") for line in lines)
    (line,) = violations("method=none", "parallelism=cp2")
    assert PLANNED in line
    assert violations("parallelism.tp=0") == ["parallelism.tp=0 must be >= 1"]


def test_backend_resolution() -> None:
    assert effective("method=eagle3", "sampler=topk", hw=GPU).backend == "flashinfer"
    fallback = effective("method=eagle3", "sampler=topk", hw=GPU_NO_FLASHINFER)
    assert fallback.backend == "torch" and "rejection.backend=auto -> torch (flashinfer is not importable)" in fallback.reasons
    assert effective("method=eagle3", "rejection.backend=flashinfer", hw=GPU).backend == "flashinfer"
    (line,) = violations("method=eagle3", "rejection.backend=flashinfer")
    assert line == "rejection.backend=flashinfer is unavailable: flashinfer needs a CUDA device"
    (line,) = violations("method=ngram", "rejection.backend=flashinfer", hw=GPU)
    assert line.startswith("method=ngram does not support the flashinfer backend")
    (line,) = violations("method=eagle3", "rejection=off", "rejection.backend=flashinfer", hw=GPU)
    assert "rejection sampling is off" in line



def test_block_verification_resolution() -> None:
    """rejection.verification=block: block verification of chains on torch, traversal verification of trees;
    flashinfer is refused when explicit and yields when auto (reason recorded); a bad value or rejection=off is an
    error."""
    block = effective("method=eagle3", "sampler=temperature", "rejection.verification=block")
    assert block.rejection and block.verification == "block" and block.tree_topk == 2
    assert block.verification_label() == ", traversal verification"
    chain = effective("method=eagle3", "sampler=temperature", "rejection.verification=block", "method.tree_topk=1")
    assert chain.tree_topk == 1 and chain.verification_label() == ", block verification"
    assert effective("method=eagle3", "rejection.verification=block", "method.tree_topk=4").tree_topk == 4
    on_gpu = effective("method=eagle3", "sampler=temperature", "rejection.verification=block", hw=GPU)
    assert on_gpu.backend == "torch" and "rejection.backend=auto -> torch (rejection.verification=block)" in on_gpu.reasons
    (line,) = violations("method=eagle3", "rejection.verification=block", "rejection.backend=flashinfer", hw=GPU)
    assert "flashinfer's chain kernel verifies token by token" in line
    (line,) = violations("method=mtp", "rejection=off", "rejection.verification=block")
    assert line.startswith("rejection.verification=block is a rejection-sampling rule")
    assert violations("rejection.verification=blocks") == ["rejection.verification=blocks is not one of: auto, token, block"]


def test_verification_auto_is_block_for_chains_on_torch_and_for_trees() -> None:
    chain = effective("method=mtp", "sampler=temperature")
    assert chain.verification == "block" and any(r.startswith("rejection.verification=auto -> block") for r in chain.reasons)
    assert effective("method=mtp", "sampler=temperature", hw=GPU).verification == "token"  # flashinfer
    tree = effective("method=eagle3", "sampler=temperature")
    assert tree.tree_topk == 2 and tree.verification == "block"  # the auto tree: traversal verification
    assert any(r.startswith("rejection.verification=auto -> block: a draft tree is verified path by path")
               for r in tree.reasons)
    tree_on_gpu = effective("method=eagle3", "sampler=temperature", "engine.cuda_graphs=off", hw=GPU)
    assert tree_on_gpu.tree_topk == 2 and tree_on_gpu.verification == "block"  # trees are walked on the host
    assert effective("method=eagle3", "sampler=temperature", "engine.max_batch_size=2").verification == "block"
    assert effective("method=mtp", "rejection.verification=token").verification == "token"
    assert not any("verification" in r for r in effective("method=mtp", "rejection=off").reasons)

def test_device_resolution() -> None:
    assert effective(hw=GPU).device == "cuda"
    assert "model.device=auto -> cpu (no CUDA)" in effective().reasons
    assert violations("model.device=cuda") == ["model.device=cuda but no CUDA device is available"]
    assert "model.device=tpu is not one of: auto, cpu, cuda" in violations("model.device=tpu")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ("method=ngram method.num_draft_tokens=0", "method.num_draft_tokens=0 is out of range for method=ngram (1..16)"),
        ("method=eagle3 method.num_draft_tokens=17", "out of range for method=eagle3 (1..16)"),
        ("method=none method.num_draft_tokens=4", "out of range for method=none (0..0)"),
        ("++method.draft_len_schedule={2:3}", "the smallest batch size (2) must map to method.num_draft_tokens=4, got 3"),
        ("++method.draft_len_schedule={1:4,8:5}", "method.draft_len_schedule[8]=5 is outside 0..4"),
        ("++method.draft_len_schedule={1:4,8:-1}", "method.draft_len_schedule[8]=-1 is outside 0..4"),
        ("++method.draft_len_schedule={0:4}", "batch sizes must be >= 1"),
        ("method=none ++method.draft_len_schedule={1:0}", "method=none does not support dynamic draft length"),
        ("method.draft_policy=greedy", "method.draft_policy=greedy is not one of: sample, argmax"),
        ("method=ngram method.max_n=1", "method.max_n=1 must be >= method.min_n=2"),
        ("sampler.top_p=0", "sampler.top_p=0.0 must be in (0, 1]"),
        ("sampler.top_p=1.5", "sampler.top_p=1.5 must be in (0, 1]"),
        ("sampler.temperature=-1", "sampler.temperature=-1.0 must be >= 0"),
        ("sampler.top_k=-1", "sampler.top_k=-1 must be >= 0"),
        ("model.dtype=float64", "model.dtype=float64 is not one of"),
        ("method=eagle3 method.head_dtype=int4", "method.head_dtype=int4 is not one of: float32, bfloat16, int8"),
        ("method=mtp method.head_dtype=int8 model.device=cuda", "method.head_dtype=int8 (weight-only int8) runs on CPU only"),
        ("model=hf", "model=hf needs model.path="),
        ("model.path=/nonexistent/model.gguf", "model.path=/nonexistent/model.gguf does not exist"),
        (f"model.path={__file__}", "must be a HF directory or a .gguf file"),
        ("workload=jsonl", "workload.source=jsonl needs workload.path="),
        ("workload=jsonl workload.path=/nonexistent.jsonl", "workload.path=/nonexistent.jsonl does not exist"),
        (f"workload=quick workload.path={__file__}", "workload.path is not read by workload.source=builtin"),
        ("workload.source=web", "workload.source=web is not one of"),
        ("workload.max_new_tokens=0", "workload.max_new_tokens=0 must be > 0"),
        ("engine.max_batch_size=0", "engine.max_batch_size=0 must be > 0"),
        ("workload=quick engine.max_seq_len=64", "leaves no room for the prompt"),
        ("rejection.mode=maybe", "rejection.mode=maybe is not one of: auto, on, off"),
        ("rejection.backend=cuda", "rejection.backend=cuda is not one of: auto, torch, flashinfer"),
        ("method=ngram method.name=eagle3", "method.name=eagle3 does not match the chosen option (NgramMethodConfig)"),
        ("method.name=medusa", "method.name=medusa is not a method"),
        ("workload.sampler_mix=[{temprature:1.0}]", "workload.sampler_mix[0]: unknown key 'temprature'"),
        ("workload.sampler_mix=[{top_k:hot}]", "workload.sampler_mix[0].top_k='hot' must be a number"),
        ("workload.sampler_mix=[{top_p:2.0}]", "workload.sampler_mix[0].top_p=2.0 must be in (0, 1]"),
        ("workload.sampler_mix=[{max_new_tokens:0}]", "workload.sampler_mix[0].max_new_tokens=0 must be > 0"),
    ],
)
def test_each_rule(overrides: str, expected: str) -> None:
    lines = violations(*overrides.split())
    assert any(expected in line for line in lines), lines


def test_schedule_is_resolved_and_sorted() -> None:
    assert effective("method=eagle3").draft_len_schedule == {}  # always num_draft_tokens
    assert effective("method=none").draft_len_schedule == {}
    result = effective("method=eagle3", "++method.draft_len_schedule={8:0,1:4,4:2}")
    assert list(result.draft_len_schedule.items()) == [(1, 4), (4, 2), (8, 0)]


@pytest.mark.parametrize(("method", "max_batch"), [("eagle3", 2), ("mtp", 1), ("dflash", 1), ("pard", 1),
                                                  ("draft_target", 1)])
def test_auto_schedule_stops_model_drafters_above_a_small_batch_on_cpu(method: str, max_batch: int) -> None:
    result = effective(f"method={method}", "engine.max_batch_size=8")
    assert result.draft_len_schedule == {max_batch: 4}  # K up to that batch, no drafts above (results_batch_auto.md)
    assert any(r.startswith(f"method.draft_len_schedule=auto -> {{{max_batch}: 4}}") and "{8:4}" in r
               for r in result.reasons)


@pytest.mark.parametrize(("overrides", "hw"), [
    (("method=eagle3", "engine.max_batch_size=2"), CPU),  # never above eagle3's batch 2: nothing to schedule
    (("method=mtp",), CPU),  # batch 1
    (("method=eagle3", "engine.max_batch_size=8"), GPU),  # GPUs stay memory-bound at small batches
    (("method=suffix", "engine.max_batch_size=8"), CPU),  # retrieval drafts only where text repeats: level
    (("method=ngram", "engine.max_batch_size=8"), CPU),
    (("method=none", "engine.max_batch_size=8"), CPU),
])
def test_auto_schedule_leaves_other_runs_drafting_at_every_batch(overrides: tuple[str, ...], hw: Hardware) -> None:
    result = effective(*overrides, hw=hw)
    assert result.draft_len_schedule == {}
    assert not any(r.startswith("method.draft_len_schedule=auto") for r in result.reasons)


def test_an_explicit_schedule_overrides_the_auto_one() -> None:
    result = effective("method=eagle3", "engine.max_batch_size=8", "++method.draft_len_schedule={8:4}")
    assert result.draft_len_schedule == {8: 4}
    assert not any(r.startswith("method.draft_len_schedule=auto") for r in result.reasons)


def test_every_violation_is_reported_at_once() -> None:
    lines = violations(
        "method=ngram", "rejection=on", "sampler.top_p=0", "parallelism=tp2",
        "workload.max_new_tokens=0", "model.device=cuda", "method.num_draft_tokens=99",
    )
    assert len(lines) == 5
    assert {line.split("=")[0] for line in lines} >= {"method", "sampler.top_p", "model.device"}


def test_effective_config_is_json_ready() -> None:
    record = effective("method=eagle3", "sampler=topk").to_dict()
    assert set(record) == {
        "rejection", "relaxed_acceptance", "backend", "device", "draft_len_schedule", "all_greedy", "all_sampled", "reasons",
        "cuda_graphs", "suffix_enhancer", "head_dtype", "tree_topk", "tree_nodes", "sampled_tree_nodes",
        "verification",
    }
    json.dumps(record)


@pytest.mark.parametrize("overrides, hw, head_dtype", [
    (("method=eagle3",), CPU, "int8"),  # auto: int8 head on CPU with a float32 target, and said so
    (("method=eagle3", "method.head_dtype=float32"), CPU, "float32"),  # explicit wins
    (("method=eagle3", "model.dtype=bfloat16"), CPU, None),  # follows the target's dtype
    (("method=mtp",), CPU, None),  # not measured for other heads: follows model.dtype
    (("method=eagle3", "model.device=cuda"), GPU, None),  # int8 heads run on CPU only
])
def test_head_dtype_auto_resolution(overrides, hw, head_dtype) -> None:
    resolved = effective(*overrides, hw=hw)
    assert resolved.head_dtype == head_dtype
    assert any(r.startswith("method.head_dtype=auto -> int8") for r in resolved.reasons) == (
        head_dtype == "int8" and "method.head_dtype=float32" not in overrides)


@pytest.mark.parametrize("overrides, tree_topk, nodes", [
    # (greedy request's nodes, sampled request's nodes)
    (("method=eagle3",), 2, (8, 5)),  # auto at batch 1: topk * K greedy, the chain plus one sibling sampled
    (("method=eagle3", "sampler=temperature"), 2, (8, 5)),
    (("method=eagle3", "sampler=temperature", "method.num_draft_tokens=3"), 2, (6, 4)),
    (("method=eagle3", "sampler=temperature", "method.max_total_draft_tokens=7"), 2, (7, 7)),  # explicit nodes win
    (("method=eagle3", "sampler=temperature", "method.tree_topk=2"), 2, (8, 8)),  # explicit topk: topk * K
    (("method=eagle3", "workload=jsonl", f"workload.path={__file__}"), 2, (8, 5)),
    (("method=eagle3", "engine.max_batch_size=4"), 1, (0, 0)),  # a tree verifies one request at a time
    (("method=eagle3", "method.adaptive_min_accept=0.5"), 1, (0, 0)),  # the tree engine does not apply the skip
    (("method=eagle3", "method.tree_topk=1"), 1, (0, 0)),  # explicit wins
    (("method=eagle3", "method.tree_topk=4", "engine.max_batch_size=1"), 4, (16, 16)),
    (("method=mtp",), 1, (0, 0)),  # only EAGLE-3 expands a tree
])
def test_tree_topk_auto_resolution(overrides, tree_topk, nodes) -> None:
    resolved = effective(*overrides)
    assert (resolved.tree_topk, (resolved.tree_nodes, resolved.sampled_tree_nodes)) == (tree_topk, nodes)
    auto = [r for r in resolved.reasons if r.startswith("method.tree_topk=auto")]
    assert len(auto) == ("method=eagle3" in overrides and not any("tree_topk" in o for o in overrides))
    assert all(r.startswith(f"method.tree_topk=auto -> {tree_topk}: ") for r in auto)


@pytest.mark.parametrize("overrides, all_greedy, all_sampled", [
    ((), True, False),
    (("sampler=temperature",), False, True),
    (("sampler=temperature", "sampler.temperature=0"), True, False),
    (("workload=jsonl", f"workload.path={__file__}"), False, False),  # rows may carry their own temperature
])
def test_all_greedy_and_all_sampled(overrides, all_greedy, all_sampled) -> None:
    resolved = effective("method=eagle3", *overrides)
    assert (resolved.all_greedy, resolved.all_sampled) == (all_greedy, all_sampled)
    assert tree_nodes_label(resolved) == {(True, False): "8", (False, True): "5", (False, False): "8 greedy / 5 sampled"}[
        (all_greedy, all_sampled)]
