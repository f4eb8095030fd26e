"""Who may touch whose state: no module writes another object's private attribute, none but ``module.py`` reads
``PrunedDPO``'s, and no function takes the module as ``Any`` to reach into it (its collaborators are objects it
constructs, ``RunState``, ``OptimizerRecord``, ``GradientCheck``, ``TrainingLog``, or take typed protocols).

Every module of ``lit_prunedpo``, ``callbacks``, ``examples`` and ``scripts`` is parsed with ``ast``."""

from __future__ import annotations

import ast

from helpers import REPO

FILES = sorted(p for folder in ("lit_prunedpo", "callbacks", "lab", "examples")
               for p in (REPO / folder).rglob("*.py"))
MODULE = REPO / "lit_prunedpo" / "module.py"

#: the writes of another object's private attribute that stay, each with why it is the only way
ALLOWED_WRITES = {
    # torch's LRScheduler reports its rate (get_last_lr) from there; a changed base rate is applied over it
    "lit_prunedpo/optim.py: scheduler._last_lr",
    # a method of OnlineReference, on the new instance it builds
    "lit_prunedpo/reference/online.py: other._adapters_off_policy",
    # Lightning's loggers read their version lazily from there: a resume or a claimed run folder sets it first
    "lit_prunedpo/checkpoint/run_folder.py: logger._version",
    "lit_prunedpo/checkpoint/claims.py: logger._version",
    # where Lightning's own ModelParallelStrategy puts a LightningModule's device mesh
    "lit_prunedpo/distributed.py: self.lightning_module._device_mesh",
}


def private_writes(source: str) -> list[str]:
    """Every write (assignment, augmented or annotated, ``setattr`` with a literal name) of a private attribute of
    anything but ``self`` / ``cls``, as written."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and not _own(node.args[0])):
            found.append(f"setattr({ast.unparse(node.args[0])}, {node.args[1].value!r})")
        found += [ast.unparse(t) for t in targets if isinstance(t, ast.Attribute) and _private(t.attr)
                  and not _own(t.value)]
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(value: ast.expr) -> bool:
    return isinstance(value, ast.Name) and value.id in ("self", "cls")


def declared_private(source: str, cls: str) -> set[str]:
    """The private attributes class ``cls`` sets on ``self`` anywhere in its body."""
    body = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls)
    return {n.attr for n in ast.walk(body) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            and _own(n.value) and _private(n.attr)}


def test_the_checks_find_what_they_look_for():
    source = ("def f(module, other):\n    module._x = 1\n    a, other._y = 2, 3\n    module._n += 1\n"
              "    setattr(module, '_z', 4)\n    self._ok = module.__dict__\n")
    assert sorted(private_writes(source)) == ["module._n", "module._x", "other._y", "setattr(module, '_z')"]
    assert declared_private("class A:\n    def f(self):\n        self._a, self.b = 1, 2\n", "A") == {"_a"}
    assert {"_layout_choice", "_sharded", "_eval_mode_warning"} <= declared_private(MODULE.read_text(), "PrunedDPO")


def test_no_module_writes_another_objects_private_attribute():
    found = {f"{p.relative_to(REPO)}: {w}" for p in FILES for w in private_writes(p.read_text())}
    assert not found - ALLOWED_WRITES, f"writes of another object's private attribute: {sorted(found - ALLOWED_WRITES)}"
    assert not ALLOWED_WRITES - found, f"allowed writes that are gone (drop them): {sorted(ALLOWED_WRITES - found)}"


def test_only_the_module_reads_its_private_state():
    private = declared_private(MODULE.read_text(), "PrunedDPO")
    found = [f"{p.relative_to(REPO)}:{n.lineno}: {ast.unparse(n)}" for p in FILES if p != MODULE
             for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Attribute) and n.attr in private and not _own(n.value)]
    assert not found, f"PrunedDPO's private state read outside module.py: {found}"


def friend_functions(source: str) -> list[str]:
    """Functions that take a parameter named like the module (``module``, ``pl_module``) annotated ``Any``."""
    return [node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for arg in node.args.args + node.args.kwonlyargs
            if arg.arg in ("module", "pl_module") and arg.annotation is not None
            and ast.unparse(arg.annotation) == "Any"]


def test_no_function_takes_the_module_as_any():
    assert friend_functions("def f(module: Any, x: Any): ...\ndef g(module: 'PrunedDPO'): ...\n") == ["f"]
    found = [f"{p.relative_to(REPO)}: {name}" for p in FILES for name in friend_functions(p.read_text())]
    assert not found, f"functions that take the module as Any (type it, or give them what they use): {found}"
