"""The package's modules use one another through public names: no module imports an underscore-prefixed name
(or module) that belongs to another package of lit_prunedpo, so a private name can change without breaking the
harnesses (the bench once imported ``callbacks._memory``)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

# installed package -> source folder (docs/architecture.md, "Packaging: callbacks/ and configs/")
FOLDERS = {"lit_prunedpo": REPO / "lit_prunedpo", "lit_prunedpo.callbacks": REPO / "callbacks",
           "lit_prunedpo_lab": REPO / "lab" / "lit_prunedpo_lab"}


#: the top-level packages whose private names are checked: the library and the lab
ROOTS = ("lit_prunedpo", "lit_prunedpo_lab")


def module_name(path: Path) -> str:
    """The dotted name ``path`` is installed as (a package's ``__init__`` is the package)."""
    for package, folder in sorted(FOLDERS.items(), key=lambda kv: -len(str(kv[1]))):
        if path.is_relative_to(folder):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise AssertionError(path)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str, importer: str, is_package: bool = False) -> list[str]:
    """``owner.name`` of every underscore name (module or attribute) of lit_prunedpo that the module ``importer``
    imports from outside the package that owns it (a package's own modules may share its private names)."""
    here = importer if is_package else importer.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] not in ROOTS:
                continue
            parts = target.split(".")
            for i, part in enumerate(parts):
                owner = ".".join(parts[:i])
                # the private part's owner must be the importer's own package (or the importer itself)
                if _private(part) and not (here == owner or here.startswith(owner + ".") and owner not in ROOTS
                                           or importer == owner):
                    found.append(target)
                    break
    return found


def test_scan_finds_private_imports():
    assert private_imports("from lit_prunedpo.callbacks._memory import PeakMemoryMeter",
                           "lit_prunedpo_lab.bench.harness") == ["lit_prunedpo.callbacks._memory.PeakMemoryMeter"]
    assert private_imports("from lit_prunedpo.callbacks import _memory", "lit_prunedpo_lab.study.runner")
    assert private_imports("from lit_prunedpo_lab.bench.presets import _llama", "lit_prunedpo_lab.study.map_tasks")
    assert private_imports("import lit_prunedpo.data._x", "lit_prunedpo.module")
    # a package's modules share its private names; public names are fine anywhere
    assert not private_imports("from . import _memory", "lit_prunedpo.callbacks.peak_memory")
    assert not private_imports("from lit_prunedpo.callbacks._memory import MB", "lit_prunedpo.callbacks.peak_memory")
    assert not private_imports("from ._memory import PeakMemoryMeter", "lit_prunedpo.callbacks", is_package=True)
    assert not private_imports("from lit_prunedpo.callbacks import PeakMemoryMeter", "lit_prunedpo_lab.bench.harness")


def test_no_module_imports_another_packages_private_names():
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for folder in FOLDERS.values() for path in sorted(folder.rglob("*.py"))
        for name in private_imports(path.read_text(), module_name(path), path.name == "__init__.py")
    ]
    assert not offenders, "imports of another package's private names (make them public, or use a public one): " + \
        "; ".join(offenders)
