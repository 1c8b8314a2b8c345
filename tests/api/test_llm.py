"""The Python API: ``LLM`` composes and validates like ``specdec run``, loads once, and generates
exactly what ``specdec run`` writes for the same prompts (a tiny random checkpoint keeps it fast)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_cli import LLM, SamplingParams
from specdec_cli.cli.main import main
from specdec_cli.errors import ConfigError

QUIET = ("hydra/job_logging=disabled", "hydra/hydra_logging=disabled")
PROMPTS = ["Write a haiku about the sea.", "List three prime numbers.", "Say hello in French."]


def specdec_run(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """``specdec run <args>`` in-process: (exit code, stderr)."""
    monkeypatch.setenv("SPECDEC_DEBUG", "0")
    monkeypatch.setattr(sys, "argv", ["specdec", "run", *args, *QUIET])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code or 0, capsys.readouterr().err


@pytest.fixture(scope="module")
def overrides(tiny_model_dir: Path) -> list[str]:
    return [f"model.path={tiny_model_dir}", "method=ngram", "engine.max_batch_size=2"]


@pytest.fixture(scope="module")
def llm(overrides: list[str]) -> LLM:
    return LLM(overrides)


def test_greedy_generate_equals_specdec_run(llm, overrides, monkeypatch, capsys, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    code, err = specdec_run(monkeypatch, capsys, *overrides, "workload=jsonl", f"workload.path={prompts}",
                            "workload.max_new_tokens=12", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "run" / "outputs.jsonl").read_text().splitlines()]
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12))
    assert [o.token_ids for o in outputs] == [r["output_token_ids"] for r in rows]
    assert [o.text for o in outputs] == [r["output_text"] for r in rows]
    assert [o.prompt_token_ids for o in outputs] == [r["prompt_token_ids"] for r in rows]
    assert [o.metrics.steps for o in outputs] == [r["steps"] for r in rows]
    assert [o.metrics.acceptance_length for o in outputs] == [r["acceptance_length"] for r in rows]


@pytest.mark.parametrize("bad", [["method=ngram", "rejection=on"], ["method=medusa"], ["sampler.top_k=many"],
                                 ["method.foo=1"], ["engine.max_batch_size=0", "sampler.top_p=2"]])
def test_invalid_settings_raise_the_lines_the_cli_prints(bad, monkeypatch, capsys, tmp_path: Path) -> None:
    code, err = specdec_run(monkeypatch, capsys, *bad, "dry_run=true", f"hydra.run.dir={tmp_path}")
    with pytest.raises(ConfigError) as raised:
        LLM(bad)
    assert code == 2
    assert [f"error: {line}" for line in raised.value.violations] == err.splitlines()


def test_bad_prompts_and_params_raise_every_problem_before_generating(llm) -> None:
    with pytest.raises(ConfigError) as raised:
        llm.generate(["", "ok"], [SamplingParams(top_p=0), SamplingParams(max_tokens=0, seed=-1, stop=[""])])
    assert raised.value.violations == [
        "prompts[0] must be a non-empty string",
        "params[0]: top_p=0 must be a number in (0, 1] (1 = off)",
        "params[1]: max_tokens=0 must be an integer >= 1",
        "params[1]: seed=-1 must be an integer in [0, 2**63 - 1] (seeds are non-negative 63-bit ints)",
        "params[1]: stop=[''] must be a non-empty string or a list of them",
    ]
    with pytest.raises(ConfigError, match="2 SamplingParams for 1 prompts"):
        llm.generate("x", [SamplingParams(), SamplingParams()])
    with pytest.raises(ConfigError, match=r"exceeds max_seq_len 1024"):
        llm.generate("x", SamplingParams(max_tokens=5000))
    with pytest.raises(ConfigError, match=r"chat 0: the last message must be from the user"):
        llm.chat([{"role": "assistant", "content": "hi"}])


def test_per_prompt_params_seeds_and_stop(llm) -> None:
    hot = SamplingParams(temperature=1.0, top_k=50, seed=7, max_tokens=10)
    first, second, greedy = llm.generate(["Tell me a story."] * 3, [hot, hot, SamplingParams(max_tokens=4)])
    assert first.token_ids == second.token_ids and len(first.token_ids) == 10 and first.finish_reason == "length"
    assert len(greedy.token_ids) == 4
    stop = first.text[3:6]
    (cut,) = llm.generate("Tell me a story.", SamplingParams(temperature=1.0, top_k=50, seed=7, max_tokens=10,
                                                              stop=stop))
    assert cut.finish_reason == "stop" and cut.text == first.text[: first.text.find(stop)]


def test_chat_uses_the_chat_template_and_metrics_describe_the_request(llm) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    (out,) = llm.chat(messages, SamplingParams(max_tokens=6))
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt_token_ids == llm.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(llm.chat([messages, messages[1:]])) == 2
    m = out.metrics
    assert out.finish_reason == "length" and m.steps >= 1  # the first token comes from the prefill
    assert m.acceptance_length == pytest.approx((len(out.token_ids) - 1) / m.steps)
    assert 1.0 <= m.acceptance_length <= 5.0 and m.draft_tokens_accepted <= m.draft_tokens_proposed
    assert all(0.0 <= p <= 1.0 for p in m.per_position_acceptance)
    assert m.ttft_s > 0 and len(m.itl_s) == len(out.token_ids) - 1 and m.e2e_s >= m.ttft_s


def test_importing_specdec_cli_loads_no_torch() -> None:
    code = "import sys, specdec_cli; assert 'torch' not in sys.modules; assert 'LLM' in specdec_cli.__all__"
    subprocess.run([sys.executable, "-c", code], check=True)
