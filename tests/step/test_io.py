"""The step's typed ends live in ``lit_prunedpo.step.io`` and the step package gives them; the modules that moved into
``lit_prunedpo/step/`` still answer to their old names, warning, as the same module objects."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import lit_prunedpo.step
from lit_prunedpo.moved import MOVED
from lit_prunedpo.step import io


def test_the_step_package_gives_its_ends():
    assert (lit_prunedpo.step.StepParts, lit_prunedpo.step.StepOutput) == (io.StepParts, io.StepOutput)
    with pytest.raises(AttributeError, match="no attribute 'plan_step'"):
        lit_prunedpo.step.plan_step  # noqa: B018 (a stage's names stay in its module)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_name_is_the_new_module_and_warns(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    new = importlib.import_module(MOVED[old])
    with pytest.warns(FutureWarning, match=f"{old} is now {MOVED[old]}; import from there"):
        moved = importlib.import_module(old)
    assert moved is new
    assert new.__spec__.name == MOVED[old]  # the new module keeps its own spec (the import system overwrites it)


def test_the_old_names_are_the_modules_that_moved():
    # each old name's file is gone and each new one exists: the table cannot name a module that did not move
    root = importlib.import_module("lit_prunedpo").__path__[0]
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not (Path(root) / f"{old.rpartition('.')[2]}.py").exists(), old


def test_the_package_itself_no_longer_imports_an_old_name():
    # the library and its lab load without touching the old names (they would warn every user otherwise)
    code = ("import sys, lit_prunedpo, lit_prunedpo.module, lit_prunedpo_lab.bench.harness, "
            "lit_prunedpo_lab.study.runner, "
            f"lit_prunedpo.callbacks; sys.exit(sorted(set({sorted(MOVED)!r}) & set(sys.modules)) or 0)")
    done = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
