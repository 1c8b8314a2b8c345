"""Workloads: where prompts come from, turned into engine requests.

``builtin`` (a few chat prompts), ``mt_bench`` (MT-Bench first turns, bundled),
``jsonl`` (a user file: one object per line with ``prompt`` and optional ``id``,
``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``) and ``repetitive``
(synthetic copy/edit tasks whose answers repeat the prompt: where n-gram methods shine).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from specdec_cli.config.schema import SamplerConfig, WorkloadConfig
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.errors import ConfigError

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
class PromptSpec:
    id: str
    text: str
    overrides: dict[str, Any]


def _mt_bench(path: Optional[str]) -> list[PromptSpec]:
    source = Path(path) if path else resources.files("specdec_cli.data").joinpath("mt_bench_questions.jsonl")
    lines = source.read_text(encoding="utf-8").splitlines()
    return [PromptSpec(f"mt_bench_{row['question_id']}", row["turns"][0], {}) for row in map(json.loads, lines) if row]


def _jsonl(path: str) -> list[PromptSpec]:
    specs, problems = [], []
    allowed = {"id", "prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed"}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"{path}:{number}: not valid JSON ({err.msg})")
            continue
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            problems.append(f"{path}:{number}: each line needs a string field 'prompt'")
            continue
        unknown = set(row) - allowed
        if unknown:
            problems.append(f"{path}:{number}: unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
            continue
        overrides = {k: v for k, v in row.items() if k not in ("id", "prompt")}
        specs.append(PromptSpec(str(row.get("id", f"line_{number}")), row["prompt"], overrides))
    if problems:
        raise ConfigError(problems)
    if not specs:
        raise ConfigError([f"{path}: no prompts found"])
    return specs


def load_prompts(cfg: WorkloadConfig) -> list[PromptSpec]:
    if cfg.source == "builtin":
        specs = [PromptSpec(f"quick_{i}", text, {}) for i, text in enumerate(BUILTIN_PROMPTS)]
    elif cfg.source == "mt_bench":
        specs = _mt_bench(cfg.path)
    elif cfg.source == "repetitive":
        specs = [PromptSpec(f"repeat_{i}", t, {}) for i, t in enumerate(repetitive_prompts(max(cfg.num_prompts, 1)))]
    elif cfg.source == "jsonl":
        specs = _jsonl(cfg.path or "")
    else:
        raise ConfigError([f"workload.source={cfg.source!r} is not one of builtin, mt_bench, jsonl, repetitive"])
    return specs[: cfg.num_prompts] if cfg.num_prompts > 0 else specs


def build_requests(cfg: WorkloadConfig, sampler: SamplerConfig, tokenizer, *, chat: bool) -> list[Request]:
    """Tokenise the workload's prompts into requests with per-request sampling and seeds."""
    base = SamplingParams(sampler.temperature, sampler.top_k, sampler.top_p)
    eos = tuple(t for t in {tokenizer.eos_token_id} if t is not None)
    requests = []
    for index, spec in enumerate(load_prompts(cfg)):
        overrides = dict(cfg.sampler_mix[index % len(cfg.sampler_mix)]) if cfg.sampler_mix else {}
        overrides.update(spec.overrides)
        max_new = int(overrides.pop("max_new_tokens", cfg.max_new_tokens))
        seed = int(overrides.pop("seed", sampler.seed + index))
        params = replace(base, seed=seed, **{k: type(getattr(base, k))(v) for k, v in overrides.items()})
        requests.append(Request(
            id=spec.id, prompt=spec.text, prompt_token_ids=encode_prompt(tokenizer, spec.text, chat=chat),
            params=params, max_new_tokens=max_new, stop=tuple(cfg.stop), eos_token_ids=eos,
        ))
    return requests


def encode_prompt(tokenizer, text: str, *, chat: bool) -> list[int]:
    """Token ids of a prompt, through the tokenizer's chat template when asked and available."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])
