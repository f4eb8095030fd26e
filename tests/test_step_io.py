"""The step's typed ends live in ``lit_prunedpo.step_io``; the old module name still gives them, and says so."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from lit_prunedpo import step_io


def test_the_old_module_name_gives_the_same_classes_and_warns(monkeypatch):
    monkeypatch.delitem(sys.modules, "lit_prunedpo.step", raising=False)
    with pytest.warns(FutureWarning, match="lit_prunedpo.step is now lit_prunedpo.step_io"):
        old = importlib.import_module("lit_prunedpo.step")
    assert (old.StepParts, old.StepOutput) == (step_io.StepParts, step_io.StepOutput)


def test_the_package_itself_no_longer_imports_the_old_name():
    # the library and its lab load without touching the alias (it would warn every user otherwise)
    code = ("import sys, lit_prunedpo, lit_prunedpo.module, lit_prunedpo.bench.harness, lit_prunedpo.study.runner; "
            "sys.exit('lit_prunedpo.step' in sys.modules)")
    done = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
