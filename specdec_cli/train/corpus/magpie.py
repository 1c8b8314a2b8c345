"""Instructions the target writes itself (the "Magpie" technique, Xu et al., 2024).

The target's chat template is rendered up to the start of a user message (after its default
system turn, if any) and fed as raw tokens; the target samples what a user would type there,
stopping at the end-of-turn token. Clean, non-trivial, distinct ones become prompts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.models import Transformer
from specdec_cli.train.corpus.shards import run_engine

_MARKER = "\uffffMAGPIE\uffff"


@dataclass(frozen=True)
class MagpieSettings:
    temperature: float = 1.0
    top_p: float = 0.95
    max_tokens: int = 64
    candidates_per_prompt: int = 2  # samples drawn per instruction wanted, per attempt
    attempts: int = 3


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user message's text begins."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-written instructions need a tokenizer with a chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARKER}], tokenize=False)
    return list(tokenizer(text[: text.index(_MARKER)], add_special_tokens=False)["input_ids"])


def end_of_turn_ids(tokenizer) -> tuple[int, ...]:
    """Ids that end a turn: the EOS and the template's end-of-turn marker where it has one."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    unknown = getattr(tokenizer, "unk_token_id", None)
    return tuple(sorted(i for i in ids if i is not None and i != unknown))


def clean_instruction(text: str) -> Optional[str]:
    """The instruction stripped, or None when it is empty, trivial, garbled or templated."""
    text = text.strip()
    words = text.split()
    if not 4 <= len(words) <= 120 or len(text) < 20 or "<|" in text or "http" in text:
        return None
    if sum(c.isalpha() for c in text) / len(text) < 0.6 or not text[0].isalnum():
        return None
    if max(words.count(w) for w in set(words)) > max(4, len(words) // 3):  # a loop, not a question
        return None
    return text


def _normal(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def self_instructions(target: Transformer, tokenizer, count: int, *, seed: int, batch_size: int,
                      accept: Callable[[str], bool] = lambda text: True,
                      settings: MagpieSettings = MagpieSettings()) -> list[str]:
    """Up to ``count`` distinct instructions sampled from the target's user turn (``accept`` filters)."""
    prefix, stop = user_turn_prefix(tokenizer), end_of_turn_ids(tokenizer)
    kept: dict[str, str] = {}  # normalised -> text
    for attempt in range(settings.attempts):
        wanted = count - len(kept)
        if wanted <= 0:
            break
        requests = [
            Request(id=f"magpie{i}", prompt_token_ids=list(prefix), max_new_tokens=settings.max_tokens,
                    params=SamplingParams(settings.temperature, 0, settings.top_p,
                                          seed=seed * 1_000_003 + attempt * 10_007 + i),
                    eos_token_ids=stop)
            for i in range(wanted * settings.candidates_per_prompt)
        ]
        run_engine(target, requests, batch_size)
        for request in requests:
            if request.finish_reason != "eos" or len(kept) == count:
                continue
            text = clean_instruction(tokenizer.decode(request.output_token_ids, skip_special_tokens=True))
            if text is not None and _normal(text) not in kept and accept(text):
                kept[_normal(text)] = text
    return list(kept.values())
