"""Workloads become requests; stop conditions end them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdec_cli.config.schema import NoneMethodConfig, SamplerConfig, WorkloadConfig
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.workload import JSONL_FORMAT, build_requests, check_fits, check_requests, read_workload
from specdec_cli.errors import ConfigError
from specdec_cli.testing import toy_model


def run_requests(engine: SpecEngine, requests: list[Request]) -> None:
    for request in requests:
        engine.add_request(request)
    while engine.has_work():
        engine.step()


class CharTokenizer:
    """A character-level tokenizer over 'a'..'p' (16 ids), no chat template."""

    eos_token_id = 15
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % 15 for c in text if not c.isspace()][:40] or [0]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def test_builtin_mt_bench_and_repetitive_prompts() -> None:
    assert len(read_workload(WorkloadConfig(source="builtin", num_prompts=3))) == 3
    mt_bench = read_workload(WorkloadConfig(source="mt_bench", num_prompts=0))
    assert len(mt_bench) == 80 and mt_bench[0].id == "mt_bench_81"
    repetitive = read_workload(WorkloadConfig(source="repetitive", num_prompts=6))
    assert len({p.text for p in repetitive}) == 6


def test_jsonl_workload_with_per_request_sampling(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "hello", "temperature": 0.5, "max_new_tokens": 7}) + "\n\n"
                    + json.dumps({"prompt": "world"}) + "\n")
    requests = build_requests(WorkloadConfig(source="jsonl", path=str(path), num_prompts=0, max_new_tokens=9),
                              SamplerConfig(name="greedy", seed=5), CharTokenizer(), chat=True)
    assert [r.id for r in requests] == ["a", "line_3"]
    assert requests[0].params == SamplingParams(0.5, 0, 1.0, seed=5) and requests[0].max_new_tokens == 7
    assert requests[1].params.temperature == 0.0 and requests[1].params.seed == 6


def test_jsonl_problems_are_reported_together(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": 3}\nnot json\n{"prompt": "x", "colour": 1}\n')
    with pytest.raises(ConfigError) as err:
        read_workload(WorkloadConfig(source="jsonl", path=str(path)))
    assert len(err.value.violations) == 3 and all(str(path) in v for v in err.value.violations)


def test_sampler_mix_cycles_over_requests() -> None:
    workload = WorkloadConfig(source="builtin", num_prompts=4,
                              sampler_mix=[{"temperature": 0.0}, {"temperature": 1.0, "top_k": 5}])
    requests = build_requests(workload, SamplerConfig(name="greedy"), CharTokenizer(), chat=False)
    assert [r.params.temperature for r in requests] == [0.0, 1.0, 0.0, 1.0]
    assert requests[3].params.top_k == 5


def test_eos_and_stop_strings_end_requests() -> None:
    model = toy_model(0, vocab_size=16)
    tokenizer = CharTokenizer()
    engine = SpecEngine(model, None, EngineOptions(max_batch_size=2, max_seq_len=64),
                        decode=lambda ids: tokenizer.decode(ids))
    free = Request(id="free", prompt_token_ids=[1, 2, 3], params=SamplingParams(0.0), max_new_tokens=20)
    run_requests(engine, [free])
    text = tokenizer.decode(free.output_token_ids)
    stop = text[3:5]
    eos = free.output_token_ids[2]
    engine = SpecEngine(model, None, EngineOptions(max_batch_size=2, max_seq_len=64), decode=tokenizer.decode)
    by_stop = Request(id="s", prompt_token_ids=[1, 2, 3], params=SamplingParams(0.0), max_new_tokens=20, stop=(stop,))
    by_eos = Request(id="e", prompt_token_ids=[1, 2, 3], params=SamplingParams(0.0), max_new_tokens=20,
                     eos_token_ids=(eos,))
    run_requests(engine, [by_stop, by_eos])
    assert by_stop.finish_reason == "stop" and by_stop.output_text == text[: text.find(stop)]
    first = free.output_token_ids.index(eos)
    assert by_eos.finish_reason == "eos" and by_eos.output_token_ids == free.output_token_ids[: first + 1]
    assert free.finish_reason == "length"


def test_request_that_cannot_fit_is_refused() -> None:
    engine = SpecEngine(toy_model(0, vocab_size=16), None, EngineOptions(max_batch_size=1, max_seq_len=8))
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        engine.add_request(Request(id="x", prompt_token_ids=[1] * 5, params=SamplingParams(), max_new_tokens=4))


def _problems(tmp_path: Path, content: str | bytes, source: str = "jsonl", name: str = "w.jsonl") -> list[str]:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as err:
        read_workload(WorkloadConfig(source=source, path=str(path), num_prompts=0))
    return err.value.violations


def test_empty_and_whitespace_prompts_are_refused(tmp_path: Path) -> None:
    lines = _problems(tmp_path, '{"prompt": ""}\n{"prompt": "ok"}\n{"prompt": " \\n\\t"}\n')
    assert lines == [f"{tmp_path / 'w.jsonl'}:1: empty prompt", f"{tmp_path / 'w.jsonl'}:3: empty prompt"]


@pytest.mark.parametrize("field,value,expected", [
    ("max_new_tokens", 0, "max_new_tokens=0 must be an integer >= 1"),
    ("max_new_tokens", 2.5, "max_new_tokens=2.5 must be an integer >= 1"),
    ("top_p", 5, "top_p=5 must be a number in (0, 1]"),
    ("top_p", 0, "top_p=0 must be a number in (0, 1]"),
    ("top_k", -1, "top_k=-1 must be an integer >= 0"),
    ("temperature", "hot", "temperature='hot' must be a number >= 0"),
    ("temperature", True, "temperature=True must be a number >= 0"),
    ("seed", 2**64, f"seed={2**64} must be an integer in [0, 2**63 - 1]"),
    ("seed", -1, "seed=-1 must be an integer in [0, 2**63 - 1]"),
])
def test_per_row_fields_are_validated(tmp_path: Path, field: str, value: object, expected: str) -> None:
    (line,) = _problems(tmp_path, json.dumps({"prompt": "hi", field: value}) + "\n")
    assert line.startswith(f"{tmp_path / 'w.jsonl'}:1: {expected}")


def test_every_problem_of_a_row_is_named(tmp_path: Path) -> None:
    lines = _problems(tmp_path, json.dumps({"prompt": "", "colour": 1, "top_k": -2, "id": None}) + "\n")
    assert len(lines) == 4
    assert any("unknown field(s) ['colour']" in line for line in lines)
    assert any("id=None must be a non-empty string or an integer" in line for line in lines)


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    rows = [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"}, {"prompt": "w"},
            {"id": "line_4", "prompt": "v"}]
    lines = _problems(tmp_path, "".join(json.dumps(r) + "\n" for r in rows))
    assert lines == [f"{tmp_path / 'w.jsonl'}:3: duplicate id 'a' (first on line 1)",
                     f"{tmp_path / 'w.jsonl'}:5: duplicate id 'line_4' (first on line 4)"]


def test_non_utf8_file_names_line_and_byte_offset(tmp_path: Path) -> None:
    (line,) = _problems(tmp_path, b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    assert line.startswith(f"{tmp_path / 'w.jsonl'}:2: not UTF-8 (byte 0xe9 at byte offset 32 of the file)")


def test_empty_mt_bench_file_is_refused(tmp_path: Path) -> None:
    (line,) = _problems(tmp_path, "\n\n", source="mt_bench", name="q.jsonl")
    assert line.startswith(f"{tmp_path / 'q.jsonl'}: no MT-Bench questions found")


def test_files_in_another_format_name_the_expected_one(tmp_path: Path) -> None:
    (prompts,) = _problems(tmp_path, '{"prompt": "hi"}\n', source="mt_bench")
    assert "expected MT-Bench format" in prompts and "use workload.source=jsonl" in prompts
    (questions,) = _problems(tmp_path, '{"question_id": 1, "turns": ["hi"]}\n')
    assert "MT-Bench format (turns); use workload.source=mt_bench" in questions
    (other,) = _problems(tmp_path, '{"text": "hi"}\n')
    assert "needs a string field 'prompt'" in other and "'messages'" in other
    (array,) = _problems(tmp_path, '[\n  {"prompt": "hi"}\n]\n')
    assert array == f"{tmp_path / 'w.jsonl'}: a JSON array; expected JSON Lines: {JSONL_FORMAT}"
    (scalar,) = _problems(tmp_path, '"hi"\n')
    assert "a JSON str, not an object" in scalar


def test_problems_are_capped(tmp_path: Path) -> None:
    lines = _problems(tmp_path, '{"prompt": ""}\n' * 25)
    assert len(lines) == 21 and lines[-1] == "... and 5 more problems"


def test_chat_rows_are_validated_and_encoded_with_the_template(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"id": "c", "messages": chat, "seed": 3}) + "\n")
    (row,) = read_workload(WorkloadConfig(source="jsonl", path=str(path)))
    assert row.messages == tuple(chat) and row.text == "system: be brief\nuser: hi"

    class TemplateTokenizer(CharTokenizer):
        chat_template = "any"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    (request,) = build_requests(WorkloadConfig(source="jsonl", path=str(path)), SamplerConfig(name="greedy"),
                                TemplateTokenizer(), chat=True)
    assert request.prompt_token_ids == TemplateTokenizer()("<system>bebrief<user>hi<assistant>")["input_ids"]
    assert request.params.seed == 3
    bad = [{"messages": []}, {"messages": [{"role": "bot", "content": "x"}]},
           {"messages": [{"role": "user", "content": ""}]}, {"messages": [{"role": "user"}]},
           {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
           {"prompt": "x", "messages": chat}]
    lines = _problems(tmp_path, "".join(json.dumps(r) + "\n" for r in bad))
    assert [line.split(": ", 1)[1] for line in lines] == [
        "'messages' must be a non-empty list of {role, content} objects",
        "messages[0].role='bot' is not one of system, user, assistant",
        "messages[0].content must be a non-empty string",
        "messages[0] must be an object with exactly 'role' and 'content'",
        "the last message must be from the user (the model answers it)",
        "give either 'prompt' or 'messages', not both",
    ]


def test_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        read_workload(WorkloadConfig(source="jsonl", path=str(tmp_path)))  # a directory
    assert err.value.violations == [f"{tmp_path}: cannot read the workload file (Is a directory)"]


@pytest.mark.parametrize("prompt_len,max_new,max_seq,max_pos,expected", [
    (10, 5, 64, 32, None),
    (0, 5, 64, 32, "empty prompt (0 tokens)"),
    (60, 5, 64, 128, "prompt (60 tokens) + max_new_tokens (5) exceeds max_seq_len 64"),
    (40, 5, 4096, 32, "prompt (40 tokens) + max_new_tokens (5) exceeds the model's max_position_embeddings 32"),
    (40, 5, 4096, None, None),
])
def test_check_fits(prompt_len: int, max_new: int, max_seq: int, max_pos: int | None, expected: str | None) -> None:
    why = check_fits(prompt_len, max_new, max_seq, max_pos)
    assert why == expected if expected is None else why.startswith(expected)


def test_check_requests_names_every_request_that_cannot_fit() -> None:
    requests = [Request(id=name, prompt_token_ids=[1] * n, params=SamplingParams(), max_new_tokens=4)
                for name, n in (("ok", 4), ("long", 30), ("empty", 0))]
    with pytest.raises(ConfigError) as err:
        check_requests(requests, max_seq_len=64, max_position_embeddings=16)
    assert [line.split(":")[0] for line in err.value.violations] == ["request long", "request empty"]
