"""Raw material for the passage and code families, all found offline on this machine.

Passages: the target's own answers from an existing corpus (decoded), plus prose paragraphs
from license texts shipped with installed packages and the OS (used only as passages).
Code: functions of 5..30 lines from the Python standard library's sources.
"""
from __future__ import annotations

import ast
import re
import sysconfig
import textwrap
from pathlib import Path
from typing import Iterable

PASSAGE_WORDS = (60, 200)
SNIPPET_LINES = (5, 30)


def _is_prose(text: str) -> bool:
    """Mostly letters and spaces, sentences, no code fences or tables."""
    if "```" in text or "|--" in text or "<|" in text:
        return False
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return letters / max(1, len(text)) > 0.9 and text.count(".") >= 2


def response_passages(texts: Iterable[str], min_words: int = PASSAGE_WORDS[0]) -> list[str]:
    """Decoded responses that read as prose and have at least ``min_words`` words (trimmed later)."""
    passages = dict.fromkeys(t.strip() for t in texts if len(t.split()) >= min_words and _is_prose(t))
    return list(passages)


def prose_files() -> list[Path]:
    """License and notice texts of installed packages and of the OS, sorted."""
    site = Path(sysconfig.get_paths()["purelib"])
    found = [*site.glob("*.dist-info/LICEN[CS]E*"), *site.glob("*.dist-info/licenses/**/*"),
             *site.glob("*/LICEN[CS]E*"), *Path("/usr/share/common-licenses").glob("*")]
    return sorted(p for p in set(found) if p.is_file() and p.stat().st_size < 200_000)


def file_passages(paths: Iterable[Path], words: tuple[int, int] = PASSAGE_WORDS) -> list[str]:
    """Runs of consecutive prose paragraphs of ``words[0]..words[1]`` words, deduplicated."""
    passages: dict[str, None] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        run: list[str] = []
        for paragraph in re.split(r"\n\s*\n", text):
            paragraph = " ".join(paragraph.split())
            if not _is_prose(paragraph):
                run = [] if len(paragraph.split()) > 3 else run  # a heading does not break a run
                continue
            run.append(paragraph)
            if len(" ".join(run).split()) >= words[0]:
                passage = " ".join(run)
                if len(passage.split()) <= words[1] * 2:
                    passages.setdefault(passage)
                run = []
    return list(passages)


def stdlib_files() -> list[Path]:
    """Top-level modules of the running interpreter's standard library, sorted."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def code_snippets(paths: Iterable[Path], lines: tuple[int, int] = SNIPPET_LINES) -> list[str]:
    """Functions and methods of ``lines[0]..lines[1]`` lines (dedented, comments kept), deduplicated."""
    snippets: dict[str, None] = {}
    for path in paths:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError, OSError):
            continue
        source_lines = source.split("\n")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.end_lineno is None:
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if lines[0] <= node.end_lineno - first + 1 <= lines[1]:
                code = textwrap.dedent("\n".join(source_lines[first - 1 : node.end_lineno]))
                if code.isascii():
                    snippets.setdefault(code)
    return list(snippets)
