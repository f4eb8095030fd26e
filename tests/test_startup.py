"""The command starts at once where it can: ``import lit_prunedpo``, ``lit-prunedpo --help``, ``export --help`` and
``configs`` import none of the heavy libraries (torch, lightning, transformers, ...), which cost seconds of CPU
before anything happens. A correctness check, not a timing: each runs in a fresh interpreter, and the
modules it imported are read from ``python -X importtime`` (every module the process imported, one line each).

The top-level help is written by a parser without lightning (``lit_prunedpo.cli.top_level_parser``): it must say
what LightningCLI's own parser says.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import REPO

#: the libraries that cost start-up time; none is needed before a Trainer subcommand or an export runs
HEAVY = ("torch", "lightning", "lightning_fabric", "pytorch_lightning", "torchmetrics", "transformers", "datasets",
         "peft", "matplotlib", "pyarrow", "pandas", "huggingface_hub", "safetensors")

LIGHT = {
    "import lit_prunedpo": ["-c", "import lit_prunedpo"],
    "import lit_prunedpo.cli": ["-c", "import lit_prunedpo.cli"],
    "import lit_prunedpo.callbacks": ["-c", "import lit_prunedpo.callbacks"],
    "import lit_prunedpo.export": ["-c", "import lit_prunedpo.export"],
    "-m lit_prunedpo --help": ["-m", "lit_prunedpo", "--help"],
    "-m lit_prunedpo": ["-m", "lit_prunedpo"],  # no subcommand: LightningCLI's error, from the light parser
    "-m lit_prunedpo export --help": ["-m", "lit_prunedpo", "export", "--help"],
    "-m lit_prunedpo configs": ["-m", "lit_prunedpo", "configs"],
    "-m lit_prunedpo fit --help": ["-m", "lit_prunedpo", "fit", "--help"],  # the brief help (lit_prunedpo.cli.fit_help)
}


def imported_modules(args: list[str], cwd) -> tuple[set[str], subprocess.CompletedProcess]:
    """The top-level names of every module ``python -X importtime ARGS`` imported, and the finished process."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)
    names = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", done.stderr,
                                                          re.M)}
    return names, done


def test_the_import_log_is_read():
    names, done = imported_modules(["-c", "import json"], REPO)
    assert done.returncode == 0 and "json" in names


def test_a_fit_imports_what_the_check_looks_for(tmp_path):
    """The check would pass vacuously if the names were wrong: the real work imports them."""
    names, done = imported_modules(["-m", "lit_prunedpo", "fit", "--print_config"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"torch", "lightning", "transformers", "datasets"} <= names


@pytest.mark.parametrize("args", LIGHT.values(), ids=LIGHT.keys())
def test_imports_and_help_load_no_heavy_library(args, tmp_path):
    names, done = imported_modules(args, tmp_path)
    assert done.returncode in (0, 2), done.stderr[-3000:]  # 2: the missing subcommand's usage error
    heavy = sorted(set(HEAVY) & names)
    assert not heavy, f"python {' '.join(args)} imported {heavy}"


def test_the_light_help_is_lightningclis(capsys):
    """``lit-prunedpo --help`` from ``top_level_parser`` says exactly what LightningCLI's parser says."""
    from lit_prunedpo.cli import build_cli, main

    with pytest.raises(SystemExit) as light:
        main(["--help"])
    fast = capsys.readouterr().out
    with pytest.raises(SystemExit) as full:
        build_cli(["--help"])
    assert light.value.code == full.value.code == 0
    assert fast == capsys.readouterr().out
    assert re.findall(r"^    (\w+) ", fast, re.M) == ["fit", "validate", "test", "export", "configs"]


def test_no_subcommand_is_the_same_error(capsys):
    from lit_prunedpo.cli import build_cli, main

    with pytest.raises(SystemExit) as light:
        main([])
    fast = capsys.readouterr().err
    with pytest.raises(SystemExit) as full:
        build_cli([])
    assert light.value.code == full.value.code == 2
    assert fast == capsys.readouterr().err and 'expected "subcommand"' in fast
