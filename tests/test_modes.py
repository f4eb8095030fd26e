"""The pruning modes (``lit_prunedpo.modes``): every shipped overlay loads into the samplers the CLI gives
``PrunedDPO``, each mode is defined once (no other sampler table in the package, the examples or the tests
carries a mode's name), and a bad overlay or name is refused naming what is wrong."""

from __future__ import annotations

import ast
import re

import pytest

from lit_prunedpo import modes, samplers
from lit_prunedpo.cli import build_cli
from lit_prunedpo.modes import load_mode, load_modes, mode_names
from lit_prunedpo.step.plan import exact_samplers

from helpers import MODES, REPO

SAMPLER_BASES = (samplers.PrefixSampler, samplers.PositionSampler, samplers.BranchSampler)
SAMPLER_CLASSES = {
    name for name, obj in vars(samplers).items()
    if isinstance(obj, type) and issubclass(obj, SAMPLER_BASES) and obj not in SAMPLER_BASES
}
SCANNED = ("lit_prunedpo", "examples", "tests")


def described(sampler) -> tuple[str, dict]:
    """A sampler's class and arguments; a sampler it wraps (``ExactTargetLogits(positions=...)``) described in turn."""
    return type(sampler).__name__, {k: described(v) if isinstance(v, SAMPLER_BASES) else v for k,
                                    v in vars(sampler).items()}


def test_every_overlay_in_configs_modes_is_a_mode():
    shipped = {p.stem for p in (REPO / "configs/modes").glob("*.yaml")}
    assert set(mode_names()) == shipped and set(MODES) <= shipped
    assert set(load_modes()) == shipped


@pytest.mark.parametrize("name", mode_names())
def test_mode_is_what_the_cli_instantiates(name, tmp_path):
    """The loader's triple equals the CLI's for ``--config configs/quickstart.yaml --config
    configs/modes/<name>.yaml``."""
    mode = load_mode(name)
    assert mode.path == REPO / "configs/modes" / f"{name}.yaml" and mode.description
    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(mode.path),
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    model = cli.model
    assert [described(s) for s in mode.samplers] == [
        described(s) for s in (model.prefix_sampler, model.position_sampler, model.branch_sampler)]
    assert tuple(mode.module_kwargs().values()) == mode.samplers


def test_vanilla_is_the_exact_step_and_each_call_builds_new_samplers():
    assert [described(s) for s in load_mode("vanilla").samplers] == [described(s) for s in exact_samplers()]
    first, second = load_mode("all").samplers, load_mode("all").samplers
    assert all(a is not b for a, b in zip(first, second, strict=True))
    assert [described(s) for s in first] == [described(s) for s in second]


def test_unknown_mode_names_the_shipped_ones():
    with pytest.raises(ValueError, match=r"unknown mode 'fast'.*the shipped modes are all, .*vanilla"):
        load_mode("fast")


@pytest.mark.parametrize("text, message", [
    ("model:\n  beta: 0.2\n", r"sets only the samplers .*found model\.beta"),
    ("trainer:\n  max_steps: 3\n", r"holds only model\..*found top-level keys \['trainer'\]"),
    ("model:\n  branch_sampler:\n    class_path: lit_prunedpo.samplers.FullPrefix\n",
     r"(?s)branch_sampler.*FullPrefix does not correspond to a subclass of BranchSampler"),
])
def test_bad_overlay_is_refused_naming_file_and_key(text, message, tmp_path, monkeypatch):
    """An overlay that sets more than the samplers, or a sampler of the wrong kind, is refused naming the file."""
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setattr(modes, "modes_dir", lambda: tmp_path)
    with pytest.raises(ValueError, match=message) as raised:
        load_mode("bad")
    assert str(tmp_path / "bad.yaml") in str(raised.value)


# ------------------------------------------------------------------------------ one definition per mode
def _names_a_mode(node: ast.AST) -> str | None:
    """The mode a string constant names: the whole string, or its first word (``"all (configs/...)"``); or the
    first mode a list or tuple of them names (``ids=[...]``)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return next(filter(None, map(_names_a_mode, node.elts)), None)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        words = re.split(r"[\s(,:]+", node.value.strip().lower(), maxsplit=1)
        for candidate in (node.value.strip().lower(), words[0]):
            if candidate in set(mode_names()):
                return candidate
    return None


def _builds_samplers(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            callee = sub.func.attr if isinstance(sub.func, ast.Attribute) else getattr(sub.func, "id", None)
            if callee in SAMPLER_CLASSES:
                return True
    return False


def mode_tables(source: str) -> list[tuple[int, str]]:
    """``(line, mode)`` of every place that pairs a mode's name with sampler constructors: a dict entry, a call's
    argument or keyword, or a tuple/list element beside them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        pairs: list[tuple[ast.AST, list[ast.AST]]] = []
        if isinstance(node, ast.Dict):
            pairs = [(k, [v]) for k, v in zip(node.keys, node.values) if k is not None]
        elif isinstance(node, ast.Call):
            # pytest.mark.parametrize's first argument names the test's parameter ("branch"), it labels nothing
            labelled = node.args[1:] if getattr(node.func, "attr", None) == "parametrize" else node.args
            args = [*labelled, *(k.value for k in node.keywords)]
            pairs = [(a, [b for b in args if b is not a]) for a in args]
            # a keyword whose value is one call names that argument's role (check_unbiased(position=...)); a table
            # entry pairs the name with several samplers (a tuple, a lambda, a dict)
            pairs += [(ast.Constant(k.arg), [k.value]) for k in node.keywords
                      if k.arg and not isinstance(k.value, ast.Call)]
        elif isinstance(node, (ast.Tuple, ast.List)):
            pairs = [(e, [o for o in node.elts if o is not e]) for e in node.elts]
        for key, values in pairs:
            mode = _names_a_mode(key)
            if mode and any(_builds_samplers(v) for v in values):
                found.append((node.lineno, mode))
    return found


def test_scan_finds_a_mode_table():
    """The scan recognises the shapes the duplicated tables had (dict of lambdas, dict of kwargs, parametrize)."""
    assert mode_tables('M = {"all": lambda: (SharedFractionPrefix(0.5), BernoulliPositions(0.25), RandomBranch())}')
    assert mode_tables('M = {"branch": dict(branch_sampler=RandomBranch(0.5))}')
    assert mode_tables('M = {"all (configs/modes/all.yaml)": (s.SharedFractionPrefix(0.5),)}')
    assert mode_tables('p = pytest.param("position", BernoulliPositions(0.25))')
    assert mode_tables('rows = [("sequence", SharedFractionPrefix(0.3))]')
    assert mode_tables('@pytest.mark.parametrize("m", [RandomBranch(0.5)], ids=["branch"])\ndef f(m): pass')
    assert not mode_tables('M = {"prefix 0.3": SharedFractionPrefix(0.3), "all": load_mode("all")}')
    assert not mode_tables('@pytest.mark.parametrize("branch", [RandomBranch(0.3)])\ndef f(branch): pass')
    assert not mode_tables('check_unbiased(position=StratifiedPositions(0.5), branch=RandomBranch(0.5))')
    assert mode_tables('MODES = dict(branch=(FullPrefix(), AllPositions(), RandomBranch(0.5)))')


def test_no_other_sampler_table_carries_a_mode_name():
    """Each mode is defined once, in configs/modes/: a table elsewhere that names a mode and spells its samplers
    out is a second definition that can drift (the bench's ``all`` once differed from the shipped one)."""
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {mode!r}"
        for folder in SCANNED for path in sorted((REPO / folder).rglob("*.py"))
        for line, mode in mode_tables(path.read_text())
    ]
    assert not offenders, ("sampler tables named after a shipped mode (use lit_prunedpo.modes.load_mode, or a name "
                           "that is not a mode's): " + "; ".join(offenders))
