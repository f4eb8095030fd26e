"""The built wheel ships every module and config on disk, so a subpackage or YAML added later cannot be left out.

An editable install imports from the source tree and hides a missing package; only a built wheel shows it (a
hand-written package list once lacked ``lit_prunedpo.reference`` and every command of the installed wheel failed).
The wheel is built from a copy of the files the build reads (``pip wheel --no-build-isolation --no-deps``: no
network, and no stale ``build/`` folder of an earlier build in the checkout can add files that are gone).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

#: Source folder -> where its files land in the wheel (setup.py maps the two top-level folders into the package).
SHIPPED = {"lit_prunedpo": "lit_prunedpo", "callbacks": "lit_prunedpo/callbacks", "configs": "lit_prunedpo/configs"}
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md")
JUNK = shutil.ignore_patterns("__pycache__", "*.pyc")


def source_files() -> dict[str, str]:
    """Every file in the shipped folders (``__pycache__`` aside): its path in the wheel -> its path here."""
    files = {}
    for folder, target in SHIPPED.items():
        for path in (REPO / folder).rglob("*"):
            relative = path.relative_to(REPO / folder)
            if path.is_file() and "__pycache__" not in relative.parts and path.suffix != ".pyc":
                files[f"{target}/{relative.as_posix()}"] = path.relative_to(REPO).as_posix()
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> set[str]:
    """The names in a wheel built from the checkout's files."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_FILES:
        shutil.copy(REPO / name, src / name)
    for folder in SHIPPED:
        shutil.copytree(REPO / folder, src / folder, ignore=JUNK)
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = Path(out).glob("*.whl")
    with zipfile.ZipFile(path) as archive:
        return set(archive.namelist())


def test_the_source_tree_has_what_the_wheel_is_checked_for():
    files = source_files()
    assert "lit_prunedpo/reference/__init__.py" in files and "lit_prunedpo/callbacks/__init__.py" in files
    assert "lit_prunedpo/configs/quickstart.yaml" in files and "lit_prunedpo/configs/modes/all.yaml" in files


def test_every_module_and_config_is_in_the_wheel(wheel):
    """Every package (its ``__init__.py``), module and YAML under the shipped folders, subfolders included."""
    missing = sorted(source for name, source in source_files().items() if name not in wheel)
    assert not missing, f"not in the built wheel: {missing}"


def test_nothing_lands_outside_the_package(wheel):
    # top-level "callbacks" or "configs" packages in site-packages would clash with any other project's
    top = {name.split("/")[0] for name in wheel}
    assert {t for t in top if not t.endswith(".dist-info")} == {"lit_prunedpo"}
