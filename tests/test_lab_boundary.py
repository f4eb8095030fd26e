"""The laboratory (``lit_prunedpo_lab.study``, ``lit_prunedpo_lab.bench``) is a client of the library's public API.

Every module of the lab is parsed with ``ast``; every import of ``lit_prunedpo`` counts (top-level, inside a
function: the lab imports lazily, under ``if TYPE_CHECKING``). From outside its own package (and the lab packages
:data:`lit_prunedpo.public_api.LAB` lets it use), a lab module imports only a module of
:data:`lit_prunedpo.public_api.PUBLIC_MODULES` and only names in that module's ``__all__``.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import Callable, NamedTuple

from helpers import REPO

from lit_prunedpo.public_api import LAB, PUBLIC_MODULES

class Import(NamedTuple):
    """One imported name: ``from module import name``, or ``import module`` (``name`` None)."""

    line: int
    module: str
    name: str | None


class Offence(NamedTuple):
    line: int
    module: str
    name: str | None
    why: str


def imports(source: str, importer: str, is_package: bool = False) -> list[Import]:
    """Every import of the module ``importer`` anywhere in its ``source``, relative ones resolved."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [Import(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                anchor = importer.split(".") if is_package else importer.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                module = ".".join([*anchor, *([module] if module else [])])
            out += [Import(node.lineno, module, alias.name) for alias in node.names]
    return out


def _within(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def lab_package(module: str) -> str | None:
    """The lab package (a key of ``LAB``) that ``module`` belongs to, or None."""
    return next((lab for lab in LAB if _within(module, [lab])), None)


@functools.cache
def public_names(module: str) -> frozenset[str]:
    """The ``__all__`` of the public ``module`` (imported)."""
    return frozenset(vars(importlib.import_module(module))["__all__"])


def offences(source: str, importer: str, is_package: bool = False,
             names: Callable[[str], frozenset[str]] = public_names) -> list[Offence]:
    """The imports of the lab module ``importer`` that break the rule (module docstring); ``names(module)`` is a
    public module's ``__all__``."""
    own = lab_package(importer)
    assert own is not None, f"{importer} is not in the lab"
    allowed_lab = (own, *LAB[own])
    found = []
    for line, module, name in imports(source, importer, is_package):
        if module.split(".")[0] not in ("lit_prunedpo", "lit_prunedpo_lab"):
            continue
        # the module, or for ``from package import submodule`` the submodule
        targets = [module] if name is None else [module, f"{module}.{name}"]
        if _within(targets[0], allowed_lab) or (name is not None and lab_package(targets[1]) in allowed_lab):
            continue
        if lab_package(targets[0]) or (name is not None and lab_package(targets[1])):
            why = f"{own} may import of the lab only {', '.join(allowed_lab)} (lit_prunedpo.public_api.LAB)"
        elif module not in PUBLIC_MODULES:
            why = f"{module} is not a public module (lit_prunedpo.public_api.PUBLIC_MODULES)"
        elif name is None or name == "*" or name in names(module) or targets[1] in PUBLIC_MODULES:
            continue
        else:
            why = f"{name} is not in {module}.__all__"
        found.append(Offence(line, module, name, why))
    return found


def lab_files() -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the lab."""
    out = {}
    for lab in LAB:
        for path in sorted((REPO / "lab" / lab.replace(".", "/")).rglob("*.py")):
            parts = list(path.relative_to(REPO / "lab").with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def lab_offences() -> list[tuple[Path, Offence]]:
    return [(path, offence) for name, path in lab_files().items()
            for offence in offences(path.read_text(), name, path.name == "__init__.py")]


def _fake_names(module: str) -> frozenset[str]:
    return frozenset({"lit_prunedpo": {"PrunedDPO"}, "lit_prunedpo.step.plan": {"plan_step"}}.get(module, ()))


def test_the_check_finds_forbidden_imports():
    def found(source, importer="lit_prunedpo_lab.study.runner", is_package=False):
        return [(o.module, o.name) for o in offences(source, importer, is_package, names=_fake_names)]

    # a private module, a name a public module does not list, a module import of a private module
    assert found("from lit_prunedpo.module import PrunedDPO") == [("lit_prunedpo.module", "PrunedDPO")]
    assert found("from lit_prunedpo.step.plan import _group, plan_step") == [("lit_prunedpo.step.plan", "_group")]
    assert found("import lit_prunedpo.data.synthetic") == [("lit_prunedpo.data.synthetic", None)]
    assert found("from lit_prunedpo import module") == [("lit_prunedpo", "module")]
    # inside a function, and under TYPE_CHECKING, count too
    assert found("def f():\n    if True:\n        from lit_prunedpo.module import PrunedDPO\n")
    assert found("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lit_prunedpo.module import X\n")
    # the bench may not use the study
    assert found("from lit_prunedpo_lab.study.curves import time_ratio", "lit_prunedpo_lab.bench.report")
    assert found("from lit_prunedpo_lab import study", "lit_prunedpo_lab.bench.report")
    # public names, public modules, the lab's own modules (relative ones too), the study's use of the bench
    assert not found("from lit_prunedpo import PrunedDPO\nfrom lit_prunedpo.step.plan import plan_step\n"
                     "import lit_prunedpo.step.plan\nimport torch\nfrom lit_prunedpo.step import plan")
    assert not found("from lit_prunedpo_lab.study.arms import Arm\nfrom .curves import time_ratio\n"
                     "from . import memory")
    assert not found("from lit_prunedpo_lab.bench import cost\nfrom lit_prunedpo_lab.bench.cost import ModelDims")
    assert not found("from .cost import ModelDims", "lit_prunedpo_lab.bench", is_package=True)


def test_the_lab_imports_only_the_public_api():
    files = lab_files()
    assert {"lit_prunedpo_lab.study.runner", "lit_prunedpo_lab.bench.harness"} <= set(files)  # the scan sees the lab
    seen = list(lab_offences())
    assert not seen, "the lab (lit_prunedpo_lab.study, lit_prunedpo_lab.bench) imports beyond the public API " \
        "(lit_prunedpo/public_api.py says the rule):\n" + "\n".join(
            f"  {path.relative_to(REPO)}:{o.line}: {o.module} {o.name or '(module)'}: {o.why}" for path, o in seen)


def test_the_library_imports_nothing_of_the_lab():
    """The lab is its own distribution (``lab/``): what a user installs to train never imports it, not even lazily."""
    seen = [f"{path.relative_to(REPO)}:{i.line}: {i.module}"
            for folder in ("lit_prunedpo", "callbacks") for path in sorted((REPO / folder).rglob("*.py"))
            for i in imports(path.read_text(), f"lit_prunedpo.{path.stem}", path.name == "__init__.py")
            if i.module.split(".")[0] == "lit_prunedpo_lab"]
    assert not seen, "the library imports the lab:\n" + "\n".join(seen)
    assert not (REPO / "lit_prunedpo" / "study").exists() and not (REPO / "lit_prunedpo" / "bench").exists()


def test_the_lab_uses_the_public_api():
    """Not vacuous: the lab does import the library, through its public modules."""
    used = {i.module for name, path in lab_files().items()
            for i in imports(path.read_text(), name, path.name == "__init__.py")}
    assert {"lit_prunedpo.step.plan", "lit_prunedpo.step.execute", "lit_prunedpo.data"} <= used


def test_every_public_module_lists_names_it_has():
    assert len(set(PUBLIC_MODULES)) == len(PUBLIC_MODULES)
    for module in PUBLIC_MODULES:
        assert not lab_package(module), f"{module}: the lab is no part of the public API"
        assert not any(part.startswith("_") for part in module.split(".")), f"{module}: a private module"
        mod = importlib.import_module(module)
        assert "__all__" in vars(mod), f"{module} is public (lit_prunedpo.public_api) but has no __all__"
        listed = vars(mod)["__all__"]
        assert all(isinstance(n, str) for n in listed) and len(set(listed)) == len(listed), module
        missing = [n for n in listed if not hasattr(mod, n)]
        assert not missing, f"{module}.__all__ lists names it does not have: {missing}"
        private = [n for n in listed if n.startswith("_")]
        assert not private, f"{module}.__all__ lists private names: {private}"
