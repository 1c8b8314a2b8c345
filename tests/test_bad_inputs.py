"""Bad input through ``specdec run`` as a user meets it: exit 2, one ``error:`` line per problem
(``file:line`` where there is one), no traceback, and no model loaded for a bad workload or config."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import specdec_cli.models.loading as loading
from specdec_cli.cli.main import main

QUIET = ("hydra/job_logging=disabled", "hydra/hydra_logging=disabled")


@dataclass
class Result:
    exit_code: int
    err: str

    @property
    def errors(self) -> list[str]:
        return self.err.splitlines()


@pytest.fixture
def specdec(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            tmp_path: Path) -> Callable[..., Result]:
    """``specdec("run", overrides...)`` in-process, into a fresh output directory."""
    monkeypatch.setenv("SPECDEC_DEBUG", "0")

    def invoke(*overrides: str) -> Result:
        argv = ["specdec", "run", *overrides, f"hydra.run.dir={tmp_path / 'out'}", *QUIET]
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as exit_info:
            main()
        captured = capsys.readouterr()
        return Result(exit_info.value.code or 0, captured.err)

    return invoke


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading any model fails the test: bad input must be refused before."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the input was validated")

    monkeypatch.setattr(loading, "embedded_model_path", refuse)
    monkeypatch.setattr(loading, "load_hf_dir", refuse)


def _workload(path: Path, content: str | bytes, source: str = "jsonl") -> tuple[str, ...]:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return f"workload.source={source}", f"workload.path={path}", "workload.num_prompts=0"


def _assert_exit_2(result: Result, lines: list[str]) -> None:
    assert result.exit_code == 2, result.err
    assert "Traceback" not in result.err
    assert result.errors == [f"error: {line}" for line in lines]


def test_every_bad_row_is_one_line_before_any_model_loads(specdec, no_model_load, tmp_path: Path) -> None:
    rows = [{"prompt": ""}, {"prompt": "ok", "max_new_tokens": 0, "top_p": 5},
            {"prompt": "ok", "temperature": "hot"}, {"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}]
    path = tmp_path / "prompts.jsonl"
    result = specdec(*_workload(path, "".join(json.dumps(row) + "\n" for row in rows)))
    _assert_exit_2(result, [
        f"{path}:1: empty prompt",
        f"{path}:2: max_new_tokens=0 must be an integer >= 1",
        f"{path}:2: top_p=5 must be a number in (0, 1] (1 = off)",
        f"{path}:3: temperature='hot' must be a number >= 0 (0 = greedy)",
        f"{path}:5: duplicate id 'x' (first on line 4)",
    ])


def test_non_utf8_workload(specdec, no_model_load, tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    result = specdec(*_workload(path, b'{"prompt": "caf\xe9"}\n'))
    _assert_exit_2(result, [f"{path}:1: not UTF-8 (byte 0xe9 at byte offset 15 of the file); save the file as UTF-8"])


def test_empty_mt_bench_file(specdec, no_model_load, tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    result = specdec(*_workload(path, "", source="mt_bench"))
    assert result.exit_code == 2 and result.errors[0].startswith(f"error: {path}: no MT-Bench questions found")


def test_file_in_another_format(specdec, no_model_load, tmp_path: Path) -> None:
    path = tmp_path / "prompts.json"
    result = specdec(*_workload(path, '[{"prompt": "hi"}]\n'))
    assert result.exit_code == 2 and "Traceback" not in result.err
    (line,) = result.errors
    assert line.startswith(f"error: {path}: a JSON array; expected JSON Lines: one JSON object per line with 'prompt'")
    mt_bench = specdec(*_workload(path, '{"prompt": "hi"}\n', source="mt_bench"))
    assert mt_bench.exit_code == 2 and "expected MT-Bench format" in mt_bench.err and "KeyError" not in mt_bench.err


@pytest.mark.parametrize("seed", [str(2**64), str(2**63), "-1"])
def test_out_of_range_seed(specdec, no_model_load, seed: str) -> None:
    result = specdec(f"sampler.seed={seed}")
    assert result.exit_code == 2, result.err
    assert result.errors == [f"error: sampler.seed={seed} must be an integer in [0, 2**63 - 1] "
                             "(seeds are non-negative 63-bit ints)"]


def _checkpoint(directory: Path, config: dict) -> str:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return f"model.path={directory}"


@pytest.mark.parametrize("config,message", [
    ({"model_type": "llama", "quantization_config": {"quant_method": "fp8"}},
     "config.json: a quantized checkpoint (quantization_config: quant_method='fp8') is not supported"),
    ({"model_type": "llama", "quantization_config": {"quant_method": "awq", "bits": 4}},
     "config.json: a quantized checkpoint (quantization_config: quant_method='awq') is not supported"),
    ({"model_type": "gpt2"}, "config.json: model_type='gpt2' is not supported"),
])
def test_unusable_checkpoints_exit_2(specdec, tmp_path: Path, config: dict, message: str) -> None:
    result = specdec("model=hf", _checkpoint(tmp_path / "ckpt", config))
    assert result.exit_code == 2 and "Traceback" not in result.err
    (line,) = result.errors
    assert line.startswith(f"error: {tmp_path / 'ckpt'}/{message}")


def test_text_file_named_gguf_exits_2(specdec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / "model.gguf"
    fake.write_text("not a model\n")
    result = specdec("model=hf", f"model.path={fake}")
    assert result.exit_code == 2
    (line,) = result.errors
    assert line.startswith(f"error: {fake}: cannot read GGUF metadata")


def test_prompt_past_the_models_positions_exits_2(specdec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """engine.max_seq_len raised past SmolLM2's 8192 positions: the long prompt is refused, not run."""
    from specdec_cli.engine.engine import SpecEngine

    def refuse(self: SpecEngine) -> None:
        raise AssertionError("generation started for a request that cannot fit")

    monkeypatch.setattr(SpecEngine, "step", refuse)
    path = tmp_path / "long.jsonl"
    overrides = _workload(path, json.dumps({"id": "long", "prompt": "hello " * 9000}) + "\n")
    result = specdec(*overrides, "engine.max_seq_len=20000", "workload.max_new_tokens=8")
    assert result.exit_code == 2, result.err
    (line,) = result.errors
    assert line.startswith("error: request long: prompt (") and "exceeds the model's max_position_embeddings 8192" in line
