"""The engine on the embedded SmolLM2-135M target (bounded: a few prompts, few tokens)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec_cli.config.schema import (
    DflashMethodConfig,
    DraftTargetMethodConfig,
    Eagle3MethodConfig,
    MethodConfig,
    MtpMethodConfig,
    NgramMethodConfig,
    NoneMethodConfig,
    PardMethodConfig,
    SuffixMethodConfig,
    WorkloadConfig,
)
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import encode_prompt, load_prompts, repetitive_prompts
from specdec_cli.models import load_model
from specdec_cli.models.fast_linear import Linear
from specdec_cli.models.quantize import Int8Linear, quantize_model
from specdec_cli.run.drive import run_requests

pytestmark = pytest.mark.realmodel


@pytest.fixture(scope="module")
def embedded():
    return load_model(None)


def _generate(embedded, method: MethodConfig, prompts: list[str], max_new: int,
              stats: dict | None = None) -> list[list[int]]:
    model, tokenizer = embedded
    deps = DrafterDeps(model, 2, 512, model.arch.vocab_size, torch.device("cpu"), torch.float32)
    engine = SpecEngine(model, build_drafter(method, deps),
                        EngineOptions(max_batch_size=2, max_seq_len=512, max_draft_len=method.num_draft_tokens))
    requests = [Request(id=str(i), prompt_token_ids=encode_prompt(tokenizer, p, chat=True),
                        params=SamplingParams(0.0), max_new_tokens=max_new, eos_token_ids=(tokenizer.eos_token_id,))
                for i, p in enumerate(prompts)]
    run_requests(engine, requests)
    if stats is not None:
        stats.update(engine.stats.summary())
    return [r.output_token_ids for r in requests]


def test_greedy_speculative_equals_autoregressive_on_the_embedded_model(embedded) -> None:
    prompts = repetitive_prompts(2)
    baseline = _generate(embedded, NoneMethodConfig(), prompts, 40)
    for method in (NgramMethodConfig(), SuffixMethodConfig(use_global_pool=True),
                   DraftTargetMethodConfig(self_speculative_layers=4, num_draft_tokens=2)):
        assert _generate(embedded, method, prompts, 40) == baseline, method.name


SHIPPED = {"eagle3": Eagle3MethodConfig, "mtp": MtpMethodConfig, "draft_target": DraftTargetMethodConfig,
           "pard": PardMethodConfig, "dflash": DflashMethodConfig}
#: greedy acceptance length floors at K=4, about half the gain measured in benchmarks/results_learned.md
#: (an untrained draft reaches ~1.03; on these two prompts: eagle3 1.55, mtp 1.41, draft_target 1.38,
#: pard 1.29, dflash 1.48)
MIN_ACCEPTANCE_LENGTH = {"eagle3": 1.2, "mtp": 1.2, "draft_target": 1.2, "pard": 1.15, "dflash": 1.25}


@pytest.fixture(scope="module")
def chat_prompts() -> list[str]:
    return [p.text for p in load_prompts(WorkloadConfig(source="mt_bench", num_prompts=2))]


@pytest.fixture(scope="module")
def chat_baseline(embedded, chat_prompts) -> list[list[int]]:
    return _generate(embedded, NoneMethodConfig(), chat_prompts, 32)


@pytest.mark.parametrize("method", list(SHIPPED))
def test_shipped_drafts_are_lossless_and_accepted(embedded, chat_prompts, chat_baseline, method: str) -> None:
    """The drafts shipped for the embedded target load with no flag, keep greedy output identical to
    autoregressive decoding, and are accepted (see ``MIN_ACCEPTANCE_LENGTH``)."""
    stats: dict = {}
    assert _generate(embedded, SHIPPED[method](num_draft_tokens=4), chat_prompts, 32, stats) == chat_baseline
    assert stats["acceptance_length"] > MIN_ACCEPTANCE_LENGTH[method], stats


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_int8_draft_heads_are_lossless_and_accepted(embedded, chat_prompts, chat_baseline, method: str) -> None:
    """``method.head_dtype=int8``: every linear of the head is weight-only int8 and greedy output is unchanged."""
    model = embedded[0]
    deps = DrafterDeps(model, 1, 256, model.arch.vocab_size, torch.device("cpu"), torch.float32)
    head = build_drafter(SHIPPED[method](head_dtype="int8", suffix_enhancer=False), deps).head
    assert not any(isinstance(m, Linear) for m in head.modules())
    assert any(isinstance(m, Int8Linear) for m in head.modules())
    stats: dict = {}
    assert _generate(embedded, SHIPPED[method](num_draft_tokens=4, head_dtype="int8"), chat_prompts, 32,
                     stats) == chat_baseline
    assert stats["acceptance_length"] > MIN_ACCEPTANCE_LENGTH[method], stats


def test_int8_target_greedy_speculative_equals_its_own_autoregressive(chat_prompts) -> None:
    """``model.dtype=int8``: the int8 target is row-invariant (its verify of K+1 tokens rounds each token as its
    decode does), so drafted greedy output equals the int8 target's own autoregressive output, at batch 2."""
    model, tokenizer = load_model(None)
    quantize_model(model)
    assert not any(isinstance(m, Linear) for m in model.modules())
    int8 = (model, tokenizer)
    baseline = _generate(int8, NoneMethodConfig(), chat_prompts, 32)
    stats: dict = {}
    assert _generate(int8, SHIPPED["eagle3"](num_draft_tokens=4, head_dtype="int8"), chat_prompts, 32,
                     stats) == baseline
    assert stats["acceptance_length"] > MIN_ACCEPTANCE_LENGTH["eagle3"], stats


def test_the_default_greedy_eagle3_job_runs_the_auto_tree_and_matches_autoregressive(tmp_path: Path) -> None:
    """`make run`'s job in small: method=eagle3 at greedy resolves tree_topk=auto to a tree, runs the tree engine,
    and its output equals the autoregressive baseline's."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "specdec_cli", "run", "method=eagle3", "baseline=true", "workload=showcase",
           "workload.num_prompts=2", "workload.max_new_tokens=24", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["effective"]["tree_topk"] == 2 and results["config"]["method"]["tree_topk"] is None
    assert any(r.startswith("method.tree_topk=auto -> 2") for r in results["effective"]["reasons"])
    assert results["metrics"]["baseline_identical"] is True
    assert results["metrics"]["acceptance_length"] > 1.2
    assert "tree: topk 2, 8 nodes" in proc.stdout


def test_resolved_auto_head_dtype_reaches_the_head_and_an_explicit_one_wins(embedded) -> None:
    """``EffectiveConfig.head_dtype`` (auto: int8 for EAGLE-3 on CPU) arrives through ``DrafterDeps.head_dtype``;
    an explicit ``method.head_dtype`` overrides it."""
    model = embedded[0]
    deps = DrafterDeps(model, 1, 256, model.arch.vocab_size, torch.device("cpu"), torch.float32, head_dtype="int8")
    auto = build_drafter(SHIPPED["eagle3"](suffix_enhancer=False), deps).head
    explicit = build_drafter(SHIPPED["eagle3"](head_dtype="float32", suffix_enhancer=False), deps).head
    assert any(isinstance(m, Int8Linear) for m in auto.modules())
    assert not any(isinstance(m, Int8Linear) for m in explicit.modules())


def test_specdec_run_end_to_end(tmp_path: Path) -> None:
    """`specdec run` on the embedded default writes results.json and outputs.jsonl as documented."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "specdec_cli", "run", "method=ngram", "workload=repetitive",
           "workload.num_prompts=2", "workload.max_new_tokens=24", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    metrics = results["metrics"]
    for key in ("acceptance_length", "acceptance_rate", "per_position_acceptance", "generated_tokens",
                "target_forwards", "wall_s", "tokens_per_s"):
        assert key in metrics
    assert results["effective"]["rejection"] is False and results["effective"]["reasons"]
    assert 1.0 <= metrics["acceptance_length"] <= 5.0
    rows = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert set(rows[0]) == {"id", "prompt", "prompt_token_ids", "output_token_ids", "output_text", "steps",
                            "finish_reason", "acceptance_length", "ttft_s", "tpot_s"}
    assert all(r["acceptance_length"] >= 1.0 and r["ttft_s"] > 0 for r in rows)
    assert all(0 < len(r["output_token_ids"]) <= 24 for r in rows)
