"""The package's modules import one another in one direction: no cycle in the import graph.

Every module of ``lit_prunedpo`` and ``callbacks`` is parsed with ``ast``; every import between two of them counts
(top-level, inside a function, under ``if TYPE_CHECKING``), so a cycle cannot hide behind a function-local import.
A package's ``__init__`` is a module too (``import lit_prunedpo.x`` runs it).
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

#: folder -> the package it ships as (docs/architecture.md, "Packaging: callbacks/ and configs/")
PACKAGES = {"lit_prunedpo": "lit_prunedpo", "callbacks": "lit_prunedpo.callbacks",
            "lab/lit_prunedpo_lab": "lit_prunedpo_lab"}


def module_names() -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the packages."""
    names = {}
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = [package, *path.relative_to(REPO / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names[".".join(parts)] = path
    return names


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (``from a import b`` counts ``a.b`` when that is
    a module, else ``a``; a name inside a module counts as that module)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
            if any(t not in known for t in targets):  # a name defined in ``base`` itself, not a submodule
                targets.append(base)
        else:
            continue
        for target in targets:
            # the longest known module that the target is or lies in
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    known = set(names)
    return {name: imported_modules(name, path, known) for name, path in names.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_finder_names_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_every_import_counts():
    graph = import_graph()
    assert "lit_prunedpo.batch" in graph["lit_prunedpo.step.plan"]
    assert "lit_prunedpo.module" in graph["lit_prunedpo.cli"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
