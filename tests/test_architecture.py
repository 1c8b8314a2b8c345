"""The package's shape: no import cycle between specdec_cli modules, no module over 300 lines.

The import graph is read from the source (``ast``), not by importing: every ``import`` statement
counts, including the lazy ones inside functions, since a lazy import still closes a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import specdec_cli

PACKAGE_DIR = Path(specdec_cli.__file__).parent
MAX_LINES = 300


def module_files() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of specdec_cli (packages by ``__init__``)."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The specdec_cli modules ``name`` imports: ``import a.b``, ``from a.b import c`` (``c`` when it
    is a module, else ``a.b``) and relative imports, resolved against ``known``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {name: imported_modules(name, path, known) for name, path in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in sorted(graph[node]):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_graph_reader_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    source = tmp_path / "b.py"
    source.write_text("def f():\n    from specdec_cli.a import thing\n    from . import c\n")
    known = {"specdec_cli.a", "specdec_cli.c", "specdec_cli.b"}
    assert imported_modules("specdec_cli.b", source, known) == {"specdec_cli.a", "specdec_cli.c"}
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert find_cycles(import_graph()) == []


def test_no_module_over_300_lines() -> None:
    """Reports every offender at once (split by responsibility, not by line count)."""
    offenders = {
        name: count for name, path in module_files().items()
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert offenders == {}, f"modules over {MAX_LINES} lines: {offenders}"
