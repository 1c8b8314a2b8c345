"""Familiar names: vLLM's ``speculative_config`` JSON as one override, mapped onto the ``method`` group.

``++speculative_config='{"method": "eagle3", "model": "ckpt", "num_speculative_tokens": 4}'`` becomes
``method=eagle3 method.checkpoint='ckpt' method.num_draft_tokens=4``. ``expand_aliases`` rewrites an
override list before Hydra composes it (``specdec run`` and ``compose_config`` call it); overrides after
the alias win, as with any Hydra override. The README's name table also lists SGLang's and TensorRT-LLM's names.
"""
from __future__ import annotations

import json
from typing import Any

import yaml

from specdec_cli.config.methods import TABLE
from specdec_cli.errors import ConfigError

ALIAS_KEY = "speculative_config"
# vLLM's speculative_config["method"] -> specdec's method (specdec's own names are accepted too)
VLLM_METHODS = {
    "ngram": "ngram",
    "suffix": "suffix",
    "eagle3": "eagle3",
    "mtp": "mtp",
    "deepseek_mtp": "mtp",
    "qwen3_next_mtp": "mtp",
    "ernie_mtp": "mtp",
    "mimo_mtp": "mtp",
    "glm4_moe_mtp": "mtp",
    "longcat_flash_mtp": "mtp",
    "pangu_ultra_moe_mtp": "mtp",
    "draft_model": "draft_target",
    **{name: name for name in TABLE},
}
UNSUPPORTED = {"eagle": "EAGLE-1/2 heads (use eagle3)", "medusa": "Medusa heads", "mlp_speculator": "MLP speculators"}
# vLLM key -> specdec method field, and the methods whose schema has it (None: every method)
VLLM_KEYS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "num_speculative_tokens": ("num_draft_tokens", None),
    "prompt_lookup_min": ("min_n", ("ngram",)),
    "prompt_lookup_max": ("max_n", ("ngram",)),
}
MODEL_FIELD = {"draft_target": "draft_path", "eagle3": "checkpoint", "mtp": "checkpoint", "pard": "checkpoint",
               "dflash": "checkpoint"}  # what vLLM's "model" becomes, per method


def expand_aliases(overrides: list[str]) -> list[str]:
    """``overrides`` with every ``[+|++]speculative_config=<JSON>`` replaced by the method overrides it means.

    Raises ``ConfigError`` (exit 2) for a value that is not a JSON object, an unknown method or unknown keys."""
    expanded: list[str] = []
    for override in overrides:
        key, sep, value = override.lstrip("+").partition("=")
        expanded += method_overrides(parse_alias(value)) if sep and key == ALIAS_KEY else [override]
    return expanded


def parse_alias(value: str) -> dict[str, Any]:
    """The ``speculative_config`` value as a dict: JSON, or Hydra's unquoted ``{method: eagle3}`` form."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = None
    if not isinstance(parsed, dict):
        raise ConfigError([f"{ALIAS_KEY}={value} is not a JSON object (e.g. "
                           f'{ALIAS_KEY}=\'{{"method": "ngram", "num_speculative_tokens": 4}}\')'])
    return parsed


def method_overrides(spec: dict[str, Any]) -> list[str]:
    """vLLM's speculative_config dict -> Hydra overrides of the ``method`` group."""
    problems = []
    vllm_method = spec.get("method", "draft_model" if "model" in spec else None)
    method = VLLM_METHODS.get(str(vllm_method))
    if vllm_method is None:
        problems.append(f'{ALIAS_KEY}: give "method" (one of: {", ".join(VLLM_METHODS)})')
    elif method is None:
        why = f"{UNSUPPORTED[vllm_method]} are not supported" if vllm_method in UNSUPPORTED else "unknown method"
        problems.append(f"{ALIAS_KEY}: method={vllm_method!r}: {why} (choose one of: {', '.join(VLLM_METHODS)})")
    unknown = sorted(set(spec) - {"method", "model", *VLLM_KEYS})
    if unknown:
        problems.append(f"{ALIAS_KEY}: unknown key(s) {', '.join(unknown)} "
                        f"(known: method, model, {', '.join(VLLM_KEYS)})")
    if problems or method is None:
        raise ConfigError(problems)
    out = [f"method={method}"]
    if "model" in spec:
        if method not in MODEL_FIELD:
            problems.append(f"{ALIAS_KEY}: method={vllm_method} takes no draft model (drop \"model\")")
        else:
            out.append(f"method.{MODEL_FIELD[method]}={_quoted(spec['model'])}")
    for vllm_key, (field, methods) in VLLM_KEYS.items():
        if vllm_key not in spec:
            continue
        value = spec[vllm_key]
        if methods is not None and method not in methods:
            problems.append(f"{ALIAS_KEY}: {vllm_key} applies to method={' or '.join(methods)} only")
        elif isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{ALIAS_KEY}: {vllm_key}={value!r} must be an integer")
        else:
            out.append(f"method.{field}={value}")
    if problems:
        raise ConfigError(problems)
    return out


def _quoted(value: Any) -> str:
    """A Hydra override value that keeps ``value`` a string whatever characters it holds."""
    return "'" + str(value).replace("'", "\\'") + "'"
