"""``lit-prunedpo-lab``, the laboratory's one command: each subcommand runs the command of the same job with its
arguments (its main sees that command's name, so a record written through the lab stores the name the records
reproduce with), ``--help`` lists them, and anything else is one error line, status 2."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from lit_prunedpo_lab import console

MAINS = {"bench": "lit_prunedpo_lab.bench.cli", "scaling": "lit_prunedpo_lab.bench.scaling_cli",
         "study": "lit_prunedpo_lab.study.cli", "map": "lit_prunedpo_lab.study.map_cli",
         "paper": "lit_prunedpo_lab.study.paper_cli"}


@pytest.mark.parametrize("sub", sorted(MAINS))
def test_each_subcommand_runs_its_commands_main_with_its_arguments(sub, monkeypatch):
    seen = []
    monkeypatch.setattr(importlib.import_module(MAINS[sub]), "main", lambda: seen.append(list(sys.argv)) or 0)
    monkeypatch.setattr(sys, "argv", ["lit-prunedpo-lab", sub, "--out", "x", "--quick"])
    assert console.lab() == 0  # what the command's main returned: the entry point's exit status
    assert seen == [[console.LAB[sub][0], "--out", "x", "--quick"]]


def test_help_lists_the_subcommands(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lit-prunedpo-lab", "--help"])
    assert console.lab() is None
    out = capsys.readouterr().out
    assert out.startswith("usage: lit-prunedpo-lab {bench,scaling,study,map,paper}")
    assert all(f"  {name} " in out for name in console.LAB)


@pytest.mark.parametrize("argv, said", [([], "a subcommand is required"), (["train"], "unknown subcommand 'train'")])
def test_no_or_an_unknown_subcommand_is_one_error_line_and_status_2(argv, said, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lit-prunedpo-lab", *argv])
    with pytest.raises(SystemExit) as stop:
        console.lab()
    err = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and [line for line in err if "error:" in line] == [
        f"lit-prunedpo-lab: error: {said} (choose from bench, scaling, study, map, paper)"]


def test_the_command_reaches_a_subcommands_help():
    """``python -m lit_prunedpo_lab``, and the installed ``lit-prunedpo-lab`` where the lab is installed
    (``pip install -e ./lab``; the suite's own ``.[test]`` installs the library alone)."""
    script = Path(sys.executable).parent / "lit-prunedpo-lab"
    for command in ([sys.executable, "-m", "lit_prunedpo_lab"], *([[str(script)]] if script.exists() else [])):
        run = subprocess.run([*command, "study", "--help"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.startswith("usage: lit-prunedpo-study"), run.stderr[-2000:]


def test_each_subcommand_names_the_installed_command_of_its_entry_point():
    import tomllib

    lab = tomllib.loads((Path(__file__).parents[2] / "lab" / "pyproject.toml").read_text())["project"]["scripts"]
    for sub, (command, entry, _) in console.LAB.items():
        assert lab[command] == f"lit_prunedpo_lab.console:{entry.__name__}", sub
    assert lab["lit-prunedpo-lab"] == "lit_prunedpo_lab.console:lab"
    library = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert not set(library) & set(lab), "a command installed by both distributions"


def test_the_labs_own_errors_end_in_one_line_not_a_traceback(monkeypatch, capsys):
    """The lab's checks are raised in its own package, not the library's: its commands name that package to the
    runner, so a lab check's error (here the map's spec check, reached from the map command) is one ``error:``
    line, status 1, as a library command's would be; a library runner without ``own`` keeps the traceback."""
    from lit_prunedpo.cli.user_errors import user_error_line
    from lit_prunedpo_lab.study import map_cli
    from lit_prunedpo_lab.study.map_spec import parse_spec

    def bad_spec():
        parse_spec({"modes": ["position"], "blocks": [{"task": "generated", "head_share": 2.0}]})

    monkeypatch.setattr(map_cli, "main", bad_spec)
    monkeypatch.setattr(sys, "argv", ["lit-prunedpo-study-map"])
    monkeypatch.delenv("LIT_PRUNEDPO_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as stop:
        console.study_map()
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 1 and len(err) == 1 and err[0].startswith("error: ") and "head_share" in err[0], err
    with pytest.raises(ValueError) as raised:
        bad_spec()
    assert user_error_line(raised.value) is None and user_error_line(raised.value, console.OWN) == err[0][7:]
