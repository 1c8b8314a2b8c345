"""Corpus v2: family prompt builders, the shard schedule, resumable generation, both shard formats."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from specdec_cli.testing import toy_model
from specdec_cli.train.corpus import generate
from specdec_cli.train.corpus.families import BUILDERS, FAMILIES, LANGUAGES, OTHER_LANGUAGES, Sources, build_prompts
from specdec_cli.train.corpus.generate import CorpusV2Spec, generate_corpus_v2, shard_schedule
from specdec_cli.train.corpus.magpie import clean_instruction, user_turn_prefix
from specdec_cli.train.corpus.shards import save_shard
from specdec_cli.train.corpus.sources import code_snippets, file_passages, response_passages
from specdec_cli.train.data import _save_shard, load_corpus

PASSAGES = tuple(
    f"Passage {i} tells how {name} built a small boat. It took {i + 3} weeks and {name} used oak wood. "
    f"The boat sailed across the lake in {2000 + i}. Everyone in the village of Linden came to watch it."
    for i, name in enumerate(("Anna", "Ben", "Carla", "David", "Emma", "Farid"))
)
SNIPPETS = (
    "def total(items):\n    result = 0\n    for item in items:\n        result += item\n    return result",
    "def largest(values):\n    best = values[0]\n    for value in values:\n        if value > best:\n"
    "            best = value\n    return best",
)
SOURCES = Sources(passages=PASSAGES, snippets=SNIPPETS)


class ChatCharTokenizer:
    """Characters to ids 1..30 (0 is a space, 31 the end of a turn), with a toy chat template."""

    eos_token_id = 31
    unk_token_id = None
    chat_template = "toy"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [0 if c == " " else 1 + ord(c) % 30 for c in text] or [1]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(" " if i == 0 else chr(ord("a") + i % 26) for i in ids if i != self.eos_token_id)

    def convert_tokens_to_ids(self, token: str):
        return None

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False) -> str:
        text = "".join(f"<{m['role']}>{m['content']}|" for m in messages)
        return text + "<assistant>" if add_generation_prompt else text


def test_family_builders_give_unique_deterministic_prompts() -> None:
    assert len(FAMILIES) >= 8 and set(FAMILIES) - {"magpie"} < set(BUILDERS)  # other_language: after v2
    for family in BUILDERS:
        first = build_prompts(family, 12, random.Random(f"s/{family}"), SOURCES)
        again = build_prompts(family, 12, random.Random(f"s/{family}"), SOURCES)
        other = build_prompts(family, 12, random.Random(f"t/{family}"), SOURCES)
        assert first == again and len(set(first)) == 12, family
        assert first != other, family
    summary = build_prompts("summarize", 5, random.Random(0), SOURCES)
    assert all(any(p.split(".")[0] in s for p in PASSAGES) for s in summary)  # the passage is in the prompt
    assert all("```python" in p for p in build_prompts("code_edit", 5, random.Random(0), SOURCES))
    foreign = build_prompts("other_language", 40, random.Random(0), SOURCES)
    assert all(any(lang in p for lang in OTHER_LANGUAGES) for p in foreign)
    assert not any(lang in p for p in foreign for lang in LANGUAGES)  # translate's languages stay unseen


def test_build_prompts_skips_rejected() -> None:
    banned = set(build_prompts("arithmetic", 6, random.Random(1), SOURCES)[:3])
    kept = build_prompts("arithmetic", 6, random.Random(1), SOURCES, accept=lambda text: text not in banned)
    assert len(kept) == 6 and not banned & set(kept)


def test_schedule_covers_every_family_first_and_caps_held_out_families() -> None:
    spec = CorpusV2Spec(held_out_families=("translate", "arithmetic"), eval_shards_per_held_out_family=2,
                        max_shards=60)
    schedule = list(shard_schedule(spec))
    assert [index for index, _, _ in schedule] == list(range(60))
    assert [family for _, family, _ in schedule[: len(FAMILIES)]] == list(FAMILIES)
    per_family = {f: [number for _, family, number in schedule if family == f] for f in FAMILIES}
    assert per_family["translate"] == per_family["arithmetic"] == [0, 1]
    assert per_family["magpie"] == list(range(len(per_family["magpie"]))) and len(per_family["magpie"]) > 2


def test_instruction_filter_and_user_turn_prefix() -> None:
    assert clean_instruction("  How do volcanoes form and why do they erupt?\n") == \
        "How do volcanoes form and why do they erupt?"
    for bad in ("Hi there", "<|im_start|>user write me a poem about cats", "the the the the the the the the",
                "1234 5678 9012 3456 7890 1234", "- see https://example.com for more details"):
        assert clean_instruction(bad) is None, bad
    assert user_turn_prefix(ChatCharTokenizer()) == ChatCharTokenizer()("<user>")["input_ids"]


def test_sources_read_prose_and_functions(tmp_path: Path) -> None:
    module = tmp_path / "mod.py"
    module.write_text("def short():\n    return 1\n\n\nclass A:\n    def method(self, x):\n        y = x + 1\n"
                      "        z = y * 2\n        w = z - 3\n        return w\n")
    assert code_snippets([module]) == ["def method(self, x):\n    y = x + 1\n    z = y * 2\n    w = z - 3\n"
                                       "    return w"]
    text = tmp_path / "LICENSE"
    text.write_text("MIT License\n\n" + "\n\n".join(PASSAGES[:2]) + "\n\n| a | b |\n|--|--|\n")
    passages = file_passages([text], words=(40, 200))
    assert passages == [" ".join(PASSAGES[:2])]
    assert response_passages([PASSAGES[0], "```python\nprint(1)\n``` " * 30, "too short."], min_words=20) == \
        [PASSAGES[0]]


def test_v1_and_v2_shards_load_together_with_family_filter(tmp_path: Path) -> None:
    _save_shard(tmp_path / "shard_00000.npz", [[1, 2], [3]], [[4, 5, 6], [7]], [False, True])
    save_shard(tmp_path / "shard_00001.npz", [[8], [9, 10]], [[11], [12, 13]], [True, False],
               families=["translate", "summarize"], temperatures=[0.0, 1.0])
    assert load_corpus(tmp_path) == [([1, 2], [4, 5, 6]), ([3], [7]), ([8], [11]), ([9, 10], [12, 13])]
    assert load_corpus(tmp_path, family="templates") == [([1, 2], [4, 5, 6]), ([3], [7])]
    assert load_corpus(tmp_path, family=("translate", "summarize"), held_out=False) == [([9, 10], [12, 13])]
    assert np.load(tmp_path / "shard_00001.npz")["temperature"].tolist() == [0.0, 1.0]


def tiny_spec(**overrides) -> CorpusV2Spec:
    fields = dict(families=("magpie", "templates", "summarize", "arithmetic"), held_out_families=("arithmetic",),
                  eval_shards_per_held_out_family=1, shard_size=3, batch_size=3, max_new_tokens=5, max_shards=7,
                  passages_from="")
    fields.update(overrides)
    return CorpusV2Spec(**fields)


def test_generation_resumes_and_flags_held_out_families(tmp_path: Path, monkeypatch) -> None:
    target, tokenizer, spec = toy_model(0, vocab_size=32), ChatCharTokenizer(), tiny_spec()
    assert generate_corpus_v2(target, tokenizer, tmp_path, spec, SOURCES, time_budget_s=0.0, log=lambda s: None) == 1
    assert sorted(p.name for p in tmp_path.glob("shard_*")) == ["shard_00000.npz"]
    first = (tmp_path / "shard_00000.npz").read_bytes()

    calls = []
    real_run = generate.run_engine

    def dies_on_second_shard(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_run(*args)

    monkeypatch.setattr(generate, "run_engine", dies_on_second_shard)
    with pytest.raises(KeyboardInterrupt):
        generate_corpus_v2(target, tokenizer, tmp_path, spec, SOURCES, log=lambda s: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "shard_00000.npz", "shard_00001.npz",
                                                          "spec.json"]  # no partial shard, no temporary file
    monkeypatch.setattr(generate, "run_engine", real_run)
    assert generate_corpus_v2(target, tokenizer, tmp_path, spec, SOURCES, log=lambda s: None) == 5
    assert (tmp_path / "shard_00000.npz").read_bytes() == first  # existing shards are kept as they are

    shards = [np.load(tmp_path / f"shard_{i:05d}.npz") for i in range(7)]
    families = [set(s["family"].tolist()) for s in shards]
    assert [families[i] for i in (1, 2, 3, 5, 6)] == [{"templates"}, {"summarize"}, {"arithmetic"}, {"templates"},
                                                      {"summarize"}]
    assert families[0] <= {"magpie"} and families[4] <= {"magpie"}  # the toy rarely writes a clean instruction
    assert all(s["held_out"].all() for s in shards if "arithmetic" in s["family"].tolist())
    assert [float(shards[i]["temperature"][0]) for i in (2, 6)] == [0.0, 1.0]  # a family's shards alternate
    prompts = [tuple(p) for p, _ in load_corpus(tmp_path)]
    assert len(prompts) == len(set(prompts))  # deduplicated across shards
    assert load_corpus(tmp_path, family="arithmetic") == load_corpus(tmp_path, family="arithmetic", held_out=True)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["shards"] == 7 and manifest["response_tokens_by_family"]["arithmetic"]["train"] == 0
    assert manifest["response_tokens"] == sum(len(r) for _, r in load_corpus(tmp_path))
    with pytest.raises(ValueError, match="other settings"):
        generate_corpus_v2(target, tokenizer, tmp_path, tiny_spec(shard_size=4), SOURCES, log=lambda s: None)
