"""Task families of corpus v2: each builds one prompt from a seeded ``random.Random`` and the sources.

Copy-heavy families (summarize, rewrite, extract, context_qa, translate) wrap passages the
target itself wrote (or prose shipped in installed packages); the code families wrap real
stdlib functions; ``arithmetic`` draws multi-step word problems; ``templates`` is the v1
template set; ``other_language`` (added after v2) asks for answers in languages translate does not
use. ``magpie`` (instructions the target writes itself) lives in ``magpie.py``:
its prompts come from the model, not from a builder here.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from specdec_cli.train.prompts import NAMES, one_template_prompt

MAGPIE = "magpie"
LANGUAGES = ("French", "German", "Spanish")  # translate's
# other_language's: none of translate's, so that the held-out translate family stays unseen in task and language
OTHER_LANGUAGES = ("Italian", "Portuguese", "Dutch", "Swedish", "Polish")


@dataclass(frozen=True)
class Sources:
    """Raw material of the passage and code families: prose passages and Python functions."""

    passages: tuple[str, ...]
    snippets: tuple[str, ...]


def _words(text: str, low: int, high: int, rng: random.Random) -> str:
    """``text`` cut to at most a random ``low..high`` words, at a sentence end where one is near."""
    spans = [m.end() for m in re.finditer(r"\S+", text)]
    limit = rng.randint(low, high)
    if len(spans) <= limit:
        return text.strip()
    cut = text[: spans[limit - 1]]
    end = max(cut.rfind(". "), cut.rfind(".\n"), cut.rfind("! "), cut.rfind("? "))
    if end > 0 and len(cut[: end + 1].split()) >= low:
        cut = cut[: end + 1]
    return cut.strip()


def _passage(rng: random.Random, sources: Sources, low: int = 60, high: int = 200) -> str:
    return _words(rng.choice(sources.passages), low, high, rng)


def _around(rng: random.Random, instruction: str, passage: str) -> str:
    """The instruction before or after the passage (both orders occur in real prompts)."""
    if rng.random() < 0.7:
        return f"{instruction}\n\n{passage}"
    return f"{passage}\n\n{instruction}"


def summarize(rng: random.Random, sources: Sources) -> str:
    count = rng.randint(1, 4)
    instruction = rng.choice((
        f"Summarize the following text in {count} sentence{'s' * (count > 1)}:",
        "Write a short summary of this passage:",
        "Give a one-paragraph summary of the text below.",
        f"Summarize this in {count + 2} bullet points:",
        "What is the main idea of the following text? Answer in a few sentences.",
        "TL;DR of the following:",
    ))
    return _around(rng, instruction, _passage(rng, sources))


def _with_typos(text: str, rng: random.Random) -> str:
    """A few swapped letters and dropped characters, for the fix-the-grammar task."""
    words = text.split(" ")
    for index in rng.sample(range(len(words)), k=min(len(words), max(1, len(words) // 12))):
        word = words[index]
        if len(word) > 3:
            cut = rng.randrange(1, len(word) - 2)
            words[index] = word[:cut] + word[cut + 1] + word[cut] + word[cut + 2 :] if rng.random() < 0.5 \
                else word[:cut] + word[cut + 1 :]
    return " ".join(words)


def rewrite(rng: random.Random, sources: Sources) -> str:
    passage = _passage(rng, sources, 40, 150)
    kind = rng.randrange(7)
    if kind == 0:
        return _around(rng, "Fix the spelling and grammar mistakes in this text:", _with_typos(passage, rng))
    instruction = (
        "Rewrite the following text in simpler words.",
        "Paraphrase this passage:",
        "Rewrite the following text in a more formal tone:",
        f"Rewrite this text so that {rng.choice(('a child', 'a beginner', 'a teenager'))} can understand it:",
        "Make the following text shorter without losing its meaning:",
        "Rewrite the text below in the first person:",
    )[kind - 1]
    return _around(rng, instruction, passage)


def extract(rng: random.Random, sources: Sources) -> str:
    count = rng.randint(3, 6)
    instruction = rng.choice((
        "List all the names of people, places and organisations mentioned in this text:",
        "Extract every number in the following text and say what it refers to:",
        f"List the {count} key points of the passage below.",
        "Make a list of the important keywords in this text:",
        "Which facts does the following text state? List them one per line.",
        "Extract the main claims of this passage as a numbered list:",
        "Quote the most important sentence of the text below and explain why.",
    ))
    return _around(rng, instruction, _passage(rng, sources))


def _subject(passage: str, rng: random.Random) -> str:
    """A salient word of ``passage`` to ask about (a long or capitalised word)."""
    words = [w.strip(".,;:!?()\"'*") for w in passage.split()]
    salient = [w for w in words if len(w) > 6 or (w[:1].isupper() and len(w) > 3)] or words
    return rng.choice(salient)


def context_qa(rng: random.Random, sources: Sources) -> str:
    passages = [_passage(rng, sources, 40, 110) for _ in range(rng.randint(1, 3))]
    subject = _subject(rng.choice(passages), rng)
    question = rng.choice((
        f"What does the context say about {subject}?",
        f"According to the context, why is {subject} mentioned?",
        f"Using only the information above, explain what is said about {subject}.",
        f"Which passage mentions {subject}, and what does it say?",
        "What is the main point of the context? Quote it where you can.",
    ))
    context = "\n\n".join(f"[{i + 1}] {p}" for i, p in enumerate(passages)) if len(passages) > 1 else passages[0]
    header = rng.choice(("Answer the question using only the context below.",
                         "Read the documents and answer the question.", "Context:"))
    return f"{header}\n\n{context}\n\nQuestion: {question}"


def translate(rng: random.Random, sources: Sources) -> str:
    language = rng.choice(LANGUAGES)
    instruction = rng.choice((
        f"Translate the following text into {language}:",
        f"Translate this passage to {language}.",
        f"Please translate into {language}:",
        f"How would you say this in {language}?",
    ))
    return _around(rng, instruction, _passage(rng, sources, 30, 120))


def other_language(rng: random.Random, sources: Sources) -> str:
    """An instruction answered in a language other than English (and other than translate's): the target
    writing Italian, Portuguese, ... so a drafter meets non-English output without seeing translation."""
    language = rng.choice(OTHER_LANGUAGES)
    if rng.random() < 0.6:
        request = rng.choice((f"Answer in {language}.", f"Please reply in {language}.",
                              f"Write your answer in {language}.", f"Respond only in {language}."))
        return f"{one_template_prompt(rng, math=False)} {request}"
    kind = rng.choice(("a short story", "a paragraph", "a letter to a friend", "a short poem", "a description",
                       "a dialogue", "a list of tips"))
    topic = one_template_prompt(rng, math=False).rstrip(".?!")
    return f"Write {kind} in {language}. The subject: {topic[0].lower()}{topic[1:]}."


def _fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def _identifiers(code: str) -> list[str]:
    names = set(re.findall(r"\b([a-z_][a-z0-9_]{1,})\s*=[^=]", code)) | set(re.findall(r"\bfor ([a-z_]\w*) in", code))
    return sorted(n for n in names if n not in {"self", "cls", "_"})


def code_edit(rng: random.Random, sources: Sources) -> str:
    code = rng.choice(sources.snippets)
    names = _identifiers(code)
    kind = rng.randrange(7 if names else 6)
    if kind == 6:
        old = rng.choice(names)
        new = rng.choice(("value", "result", "item", "current", "data", "tmp", f"{old}_new", f"my_{old}"))
        return f"Rename the variable `{old}` to `{new}` in this code:\n\n{_fenced(code)}"
    instruction = (
        "Add type hints to this Python function:",
        "Add a docstring to this function:",
        "Explain what this code does, step by step:",
        "Add comments to this function that explain each step:",
        "Refactor this function to make it easier to read:",
        "Is there a bug in this code? Review it:",
    )[kind]
    return f"{instruction}\n\n{_fenced(code)}"


def code_continue(rng: random.Random, sources: Sources) -> str:
    lines = rng.choice(sources.snippets).split("\n")
    head = "\n".join(lines[: max(2, int(len(lines) * rng.uniform(0.3, 0.7)))])
    instruction = rng.choice(("Continue this Python function:", "Complete the following code:",
                              "Finish writing this function:", "Write the rest of this function:"))
    return f"{instruction}\n\n{_fenced(head)}"


ITEMS = ("loaves of bread", "apples", "tickets", "boxes", "books", "plants", "bottles", "chairs", "shirts", "eggs")


def arithmetic(rng: random.Random, sources: Sources) -> str:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c, d = rng.randint(12, 90), rng.randint(3, 15), rng.randint(2, 9), rng.randint(2, 30)
    price = rng.choice((2, 3, 4, 5, 7, 8, 12, 15))
    problem = rng.choice((
        f"A shop has {a} {item}. It receives {b} deliveries of {c} {item} each and then sells {d}. "
        f"How many {item} does it have now?",
        f"{name} buys {b} {item} at {price} dollars each and pays with a {price * b + d} dollar bill. "
        f"How much change does {name} get, and how many {item} could {name} buy with {a} dollars?",
        f"A factory makes {a} {item} per hour for {c} hours a day. How many {item} does it make in {b} days, "
        f"and how many days would it need for {a * c * (b + d)} {item}?",
        f"{name} saves {b} dollars every week and spends {c} dollars every month. How much has {name} saved "
        f"after {d} weeks (count 4 weeks as a month)?",
        f"Compute ({a} + {b}) x {c} - {d} / {rng.choice((1, 2))}.",
        f"A train travels {a} km in {c} hours, then {b * c} km in {b} hours. What is its average speed over "
        f"the whole trip?",
        f"There are {a} students. {b} groups of {c} go on a trip and the rest split evenly into {rng.randint(2, 5)} "
        f"classrooms (round down). How many students are in each classroom?",
    ))
    request = rng.choice(("Solve it step by step.", "Show each step of your calculation.",
                          "Explain your reasoning step by step, then give the final answer.",
                          "Think step by step and write the answer at the end."))
    return f"{problem} {request}"


def templates(rng: random.Random, sources: Sources) -> str:
    return one_template_prompt(rng, math=False)


BUILDERS: dict[str, Callable[[random.Random, Sources], str]] = {
    "templates": templates, "summarize": summarize, "rewrite": rewrite, "extract": extract,
    "context_qa": context_qa, "translate": translate, "code_edit": code_edit, "code_continue": code_continue,
    "arithmetic": arithmetic, "other_language": other_language,
}
#: the v2 corpus's families, in schedule order (``other_language`` came after it: ``--families`` picks it)
FAMILIES = (MAGPIE, "templates", "summarize", "rewrite", "extract", "context_qa", "translate", "code_edit",
            "code_continue", "arithmetic")


def build_prompts(family: str, count: int, rng: random.Random, sources: Sources,
                  accept: Callable[[str], bool] = lambda text: True) -> list[str]:
    """Up to ``count`` distinct prompts of ``family`` that ``accept`` (e.g. not seen before) lets through."""
    builder = BUILDERS[family]
    prompts: dict[str, None] = {}
    for _ in range(50 * count):
        if len(prompts) == count:
            break
        text = builder(rng, sources)
        if text not in prompts and accept(text):
            prompts[text] = None
    return list(prompts)
