"""Workloads: where prompts come from, validated without a tokenizer, then turned into requests.

``builtin`` (a few chat prompts), ``mt_bench`` / ``spec_bench`` (first turns of MT-Bench, bundled, or of a
file of ``{"question_id", "category", "turns"}`` lines), ``jsonl`` (a user file: one object per line with ``prompt``
(a string) or ``messages`` (a chat: ``[{"role", "content"}, ...]``, the last from the user), and
optional ``id``, ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``),
``repetitive`` (synthetic copy/edit tasks whose answers repeat the prompt: where n-gram methods shine)
and ``inline`` (the prompts listed in the workload's own config, ``workload.prompts``).

Two stages, so that bad input fails before any model loads: ``read_workload`` parses and
validates (every problem of every row, one ``file:line: ...`` line each, in one ``ConfigError``);
``build_requests`` tokenises the rows; ``check_requests`` refuses requests that cannot fit.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

from specdec_cli.config.schema import SamplerConfig, WorkloadConfig
from specdec_cli.errors import SAMPLING_FIELDS, ConfigError, sampling_problems

if TYPE_CHECKING:  # read_workload runs without torch (dry runs, ``specdec check``)
    from specdec_cli.engine.request import Request

BUILTIN_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Give three tips for staying healthy.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash table is to a beginner.",
    "Write a short poem about the sea.",
    "List the planets of the solar system in order from the sun.",
    "What are the main differences between a cat and a dog as pets?",
    "Describe how to make a cup of tea, step by step.",
)

_ITEMS = ("apples", "bread", "milk", "eggs", "rice", "cheese", "tomatoes", "onions", "butter", "coffee")
_NAMES = ("total_price", "order_value", "basket_sum", "cart_total", "invoice_amount", "bill_total")


def _code(i: int) -> str:
    name = _NAMES[i % len(_NAMES)]
    return (f"def {name}(items):\n    total = 0\n    for item in items:\n"
            f"        total = total + item.price * item.count\n    return total\n")


def repetitive_prompts(count: int) -> list[str]:
    """Deterministic copy/edit tasks whose answers mostly repeat text from the prompt."""
    prompts = []
    for i in range(count):
        items = ", ".join(_ITEMS[(i + j) % len(_ITEMS)] for j in range(6))
        variants = (
            f"Repeat this shopping list exactly, one item per line: {items}.",
            f"Rename the function to compute_total and keep everything else the same:\n```python\n{_code(i)}```",
            f"Copy the following sentence three times: The {_ITEMS[i % 10]} are on the table next to the {_ITEMS[(i + 3) % 10]}.",
            f"Add a docstring to this function and return the full code:\n```python\n{_code(i)}```",
        )
        prompts.append(variants[i % len(variants)])
    return prompts


@dataclass(frozen=True)
class WorkloadRow:
    """One validated prompt: ``text`` (for a chat row, its turns as ``role: content`` lines),
    ``messages`` (the chat, else None) and its per-request sampling ``overrides``."""

    id: str
    text: str
    overrides: dict[str, Any]
    messages: Optional[tuple[dict[str, str], ...]] = None
    category: Optional[str] = None  # MT-Bench / Spec-Bench question category (per-category metrics)


ROLES = ("system", "user", "assistant")
JSONL_FORMAT = ("one JSON object per line with 'prompt' (a string) or 'messages' ([{role, content}, ...]), "
                f"optional 'id' and {', '.join(SAMPLING_FIELDS)}")
MT_BENCH_FORMAT = 'one JSON object per line with "question_id" and "turns" (a list of strings)'
SPEC_BENCH_FORMAT = 'one JSON object per line with "question_id", "category" and "turns" (a list of strings)'
QUESTION_FORMATS = {"mt_bench": ("MT-Bench", MT_BENCH_FORMAT), "spec_bench": ("Spec-Bench", SPEC_BENCH_FORMAT)}


def _lines(path: Path, expected: str, problems: list[str]) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines; unreadable or non-UTF-8 lines become problems."""
    try:
        data = path.read_bytes()
    except OSError as err:
        problems.append(f"{path}: cannot read the workload file ({err.strerror or err})")
        return []
    lines, offset = [], 0
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            problems.append(f"{path}:{number}: not UTF-8 (byte 0x{raw[err.start]:02x} at byte offset "
                            f"{offset + err.start} of the file); save the file as UTF-8")
            text = ""
        offset += len(raw) + 1
        if text.strip():
            lines.append((number, text))
    if lines and lines[0][1].lstrip().startswith("["):
        problems.append(f"{path}: a JSON array; expected JSON Lines: {expected}")
        return []
    return lines


def _objects(path: Path, expected: str, problems: list[str]) -> Iterable[tuple[int, str, dict[str, Any]]]:
    """(line number, ``file:line``, object) per line that is a JSON object; other lines become problems."""
    for number, line in _lines(path, expected, problems):
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"{where}: not valid JSON ({err.msg}); expected {expected}")
            continue
        if not isinstance(row, dict):
            problems.append(f"{where}: a JSON {type(row).__name__}, not an object; expected {expected}")
            continue
        yield number, where, row


def _questions(source: str, path: Optional[str], problems: list[str]) -> list[WorkloadRow]:
    """First turns of MT-Bench (``path`` None: the bundled copy) or Spec-Bench questions, with their category."""
    file = Path(path) if path else resources.files("specdec_cli.data").joinpath("mt_bench_questions.jsonl")
    label, expected = QUESTION_FORMATS[source]
    rows: list[WorkloadRow] = []
    first_line: dict[str, int] = {}
    for number, where, row in _objects(file, expected, problems):
        turns, category = row.get("turns"), row.get("category", "" if source == "spec_bench" else None)
        if "question_id" not in row or not isinstance(turns, list) or not turns:
            hint = "; use workload.source=jsonl for a prompts file" if "prompt" in row or "messages" in row else ""
            problems.append(f"{where}: expected {label} format: {expected}{hint}")
        elif not isinstance(turns[0], str) or not turns[0].strip():
            problems.append(f"{where}: empty first turn")
        elif category is not None and not (isinstance(category, str) and category.strip()):
            problems.append(f'{where}: "category" must be a non-empty string')
        else:
            _append_unique(rows, WorkloadRow(f"{source}_{row['question_id']}", turns[0], {}, category=category),
                           number, first_line, where, problems)
    if not rows and not problems:
        problems.append(f"{file}: no {label} questions found; expected {expected}")
    return rows


def _jsonl(path: str, problems: list[str]) -> list[WorkloadRow]:
    rows: list[WorkloadRow] = []
    first_line: dict[str, int] = {}
    for number, where, row in _objects(Path(path), JSONL_FORMAT, problems):
        row_problems = _row_problems(row, where)
        problems += row_problems
        if not row_problems:
            overrides = {key: row[key] for key in SAMPLING_FIELDS if key in row}
            messages = tuple(row["messages"]) if "messages" in row else None
            text = row["prompt"] if messages is None else "\n".join(f"{m['role']}: {m['content']}" for m in messages)
            _append_unique(rows, WorkloadRow(str(row.get("id", f"line_{number}")), text, overrides, messages),
                           number, first_line, where, problems)
    if not rows and not problems:
        problems.append(f"{path}: no prompts found; expected {JSONL_FORMAT}")
    return rows


def _row_problems(row: dict[str, Any], where: str) -> list[str]:
    """Every problem of one JSONL row: its prompt or messages, id, sampling fields, unknown keys."""
    if "turns" in row and "prompt" not in row and "messages" not in row:
        return [f"{where}: MT-Bench format (turns); use workload.source=mt_bench, or give 'prompt'"]
    if "prompt" not in row and "messages" not in row:
        return [f"{where}: each line needs a string field 'prompt' (or 'messages'); expected {JSONL_FORMAT}"]
    out = []
    unknown = sorted(set(row) - {"id", "prompt", "messages", *SAMPLING_FIELDS})
    if unknown:
        out.append(f"{where}: unknown field(s) {unknown}; allowed: id, prompt, messages, {', '.join(SAMPLING_FIELDS)}")
    if "prompt" in row and "messages" in row:
        out.append(f"{where}: give either 'prompt' or 'messages', not both")
    elif "messages" in row:
        out += _messages_problems(row["messages"], where)
    elif not isinstance(row["prompt"], str):
        out.append(f"{where}: prompt={row['prompt']!r} must be a string")
    elif not row["prompt"].strip():
        out.append(f"{where}: empty prompt")
    if "id" in row and not (isinstance(row["id"], int) and not isinstance(row["id"], bool)
                            or isinstance(row["id"], str) and row["id"].strip()):
        out.append(f"{where}: id={row['id']!r} must be a non-empty string or an integer")
    return out + sampling_problems({k: v for k, v in row.items() if k in SAMPLING_FIELDS}, f"{where}: ")


def _messages_problems(messages: object, where: str) -> list[str]:
    if not isinstance(messages, list) or not messages:
        return [f"{where}: 'messages' must be a non-empty list of {{role, content}} objects"]
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            out.append(f"{where}: messages[{i}] must be an object with exactly 'role' and 'content'")
        elif message["role"] not in ROLES:
            out.append(f"{where}: messages[{i}].role={message['role']!r} is not one of {', '.join(ROLES)}")
        elif not isinstance(message["content"], str) or not message["content"].strip():
            out.append(f"{where}: messages[{i}].content must be a non-empty string")
    if not out and messages[-1]["role"] != "user":
        out.append(f"{where}: the last message must be from the user (the model answers it)")
    return out


def _append_unique(rows: list[WorkloadRow], row: WorkloadRow, number: int, first_line: dict[str, int],
                   where: str, problems: list[str]) -> None:
    """Append ``row`` unless its id was already used (then a problem naming the first line)."""
    if row.id in first_line:
        problems.append(f"{where}: duplicate id {row.id!r} (first on line {first_line[row.id]})")
    else:
        first_line[row.id] = number
        rows.append(row)


def read_workload(cfg: WorkloadConfig) -> list[WorkloadRow]:
    """The workload's rows, parsed and validated without a tokenizer (call it before loading a model).

    Raises one ``ConfigError`` listing every problem (capped at ``MAX_LINES`` lines)."""
    problems: list[str] = []
    if cfg.source == "builtin":
        rows = [WorkloadRow(f"quick_{i}", text, {}) for i, text in enumerate(BUILTIN_PROMPTS)]
    elif cfg.source in QUESTION_FORMATS:
        rows = _questions(cfg.source, cfg.path if cfg.source == "mt_bench" else cfg.path or "", problems)
    elif cfg.source == "repetitive":
        rows = [WorkloadRow(f"repeat_{i}", t, {}) for i, t in enumerate(repetitive_prompts(max(cfg.num_prompts, 1)))]
    elif cfg.source == "jsonl":
        rows = _jsonl(cfg.path or "", problems)
    elif cfg.source == "inline":
        rows = [WorkloadRow(f"{cfg.name}_{i}", text, {}) for i, text in enumerate(cfg.prompts)]
        problems += [f"workload.prompts[{i}] is empty" for i, text in enumerate(cfg.prompts) if not text.strip()]
    else:
        raise ConfigError([f"workload.source={cfg.source!r} is not one of builtin, mt_bench, jsonl, repetitive, "
                           "inline, spec_bench"])
    if problems:
        raise ConfigError.capped(problems)
    return rows[: cfg.num_prompts] if cfg.num_prompts > 0 else rows


load_prompts = read_workload  # the name benchmarks and older callers use


def build_requests(cfg: WorkloadConfig, sampler: SamplerConfig, tokenizer, *, chat: bool,
                   rows: Optional[list[WorkloadRow]] = None) -> list[Request]:
    """Tokenise the workload's rows (``rows``, else ``read_workload(cfg)``) into requests with
    per-request sampling and seeds."""
    from specdec_cli.engine.request import Request, SamplingParams

    base = SamplingParams(sampler.temperature, sampler.top_k, sampler.top_p)
    eos = tuple(t for t in {tokenizer.eos_token_id} if t is not None)
    requests = []
    for index, row in enumerate(read_workload(cfg) if rows is None else rows):
        overrides = dict(cfg.sampler_mix[index % len(cfg.sampler_mix)]) if cfg.sampler_mix else {}
        overrides.update(row.overrides)
        max_new = int(overrides.pop("max_new_tokens", cfg.max_new_tokens))
        seed = int(overrides.pop("seed", sampler.seed + index))
        params = replace(base, seed=seed, **{k: type(getattr(base, k))(v) for k, v in overrides.items()})
        token_ids = (encode_prompt(tokenizer, row.text, chat=chat) if row.messages is None
                     else encode_messages(tokenizer, list(row.messages), chat=chat))
        requests.append(Request(
            id=row.id, prompt=row.text, prompt_token_ids=token_ids,
            params=params, max_new_tokens=max_new, stop=tuple(cfg.stop), eos_token_ids=eos, category=row.category,
        ))
    return requests


def encode_prompt(tokenizer, text: str, *, chat: bool) -> list[int]:
    """Token ids of a prompt, through the tokenizer's chat template when asked and available."""
    return encode_messages(tokenizer, [{"role": "user", "content": text}], chat=chat)


def encode_messages(tokenizer, messages: list[dict[str, str]], *, chat: bool) -> list[int]:
    """Token ids of a chat, through the tokenizer's chat template when asked and available, else of
    its contents joined by newlines."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer("\n".join(m["content"] for m in messages))["input_ids"])


def check_fits(prompt_len: int, max_new_tokens: int, max_seq_len: int,
               max_position_embeddings: Optional[int]) -> Optional[str]:
    """Why a request of ``prompt_len`` tokens generating up to ``max_new_tokens`` cannot run, or None:
    an empty prompt, more than ``max_seq_len`` (engine.max_seq_len) or more positions than the model
    was trained for (``max_position_embeddings``; None: no limit)."""
    needed = prompt_len + max_new_tokens
    if prompt_len == 0:
        return "empty prompt (0 tokens)"
    if needed > max_seq_len:
        return (f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds max_seq_len {max_seq_len} "
                "(raise engine.max_seq_len or lower max_new_tokens)")
    if max_position_embeddings is not None and needed > max_position_embeddings:
        return (f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                f"max_position_embeddings {max_position_embeddings} (its output would be garbage past it)")
    return None


def check_requests(requests: list[Request], *, max_seq_len: int, max_position_embeddings: Optional[int]) -> None:
    """Raise one ``ConfigError`` naming every request that ``check_fits`` refuses."""
    problems = [f"request {r.id}: {why}" for r in requests
                if (why := check_fits(len(r.prompt_token_ids), r.max_new_tokens, max_seq_len, max_position_embeddings))]
    if problems:
        raise ConfigError.capped(problems)
