"""The built wheel ships every module and config on disk, so a subpackage or YAML added later cannot be left out.

An editable install imports from the source tree and hides a missing package; only a built wheel shows it (a
hand-written package list once lacked ``lit_prunedpo.reference`` and every command of the installed wheel failed).
The wheel is built from a copy of the files the build reads (``pip wheel --no-build-isolation --no-deps``: no
network, and no stale ``build/`` folder of an earlier build in the checkout can add files that are gone).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

#: Source folder -> where its files land in the wheel (docs/architecture.md, "Packaging: callbacks/ and configs/").
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
    # top-level "callbacks" or "configs" packages in site-packages would clash with any other project's; and the lab
    # is its own distribution: what a user installs to train holds none of it
    top = {name.split("/")[0] for name in wheel}
    assert {t for t in top if not t.endswith(".dist-info")} == {"lit_prunedpo"}
    assert not any(name.startswith(("lit_prunedpo/study/", "lit_prunedpo/bench/")) for name in wheel)


def test_the_lab_is_a_wheel_of_its_own_with_every_module(tmp_path):
    """``lab/`` builds ``lit-prunedpo-lab``: the package ``lit_prunedpo_lab`` with every module on disk, nothing
    else, requiring the library it measures."""
    src, out = tmp_path / "lab", tmp_path / "dist"
    shutil.copytree(REPO / "lab", src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("lit_prunedpo_lab-*.whl")
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    on_disk = {p.relative_to(REPO / "lab").as_posix() for p in (REPO / "lab" / "lit_prunedpo_lab").rglob("*.py")}
    assert {n for n in names if ".dist-info/" not in n} == on_disk and len(on_disk) > 45
    assert "Requires-Dist: lit-prunedpo==0.1.0" in requires


# --- a source checkout maps the two folders itself (docs/architecture.md, "Packaging: callbacks/ and configs/") ----

#: prints where each of the package's parts came from, one per line
WHERE = ("import sys, lit_prunedpo, lit_prunedpo.callbacks, lit_prunedpo.configs.modes;"
         "from lit_prunedpo.cli.packaged_configs import configs_folder;"
         "print(lit_prunedpo.__file__, lit_prunedpo.callbacks.__file__, configs_folder(),"
         " *lit_prunedpo.configs.modes.__path__, type(sys.meta_path[0]).__name__, sep='\\n')")


def imported_from(pythonpath: Path, cwd: Path) -> list[str]:
    """``WHERE``'s lines, run with ``PYTHONPATH=pythonpath`` from ``cwd``."""
    done = subprocess.run([sys.executable, "-c", WHERE], cwd=cwd, env={**os.environ, "PYTHONPATH": str(pythonpath)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_repository_imports_its_own_folders():
    import lit_prunedpo.callbacks
    import lit_prunedpo.configs

    assert Path(lit_prunedpo.callbacks.__file__).resolve() == REPO / "callbacks/__init__.py"
    assert Path(lit_prunedpo.configs.__file__).resolve() == REPO / "configs/__init__.py"


def test_a_checkout_on_pythonpath_imports_its_own_folders(tmp_path):
    """A git worktree run with ``PYTHONPATH=<worktree>`` uses its own callbacks/ and configs/, though this
    environment may have another checkout installed editable, whose mapping would lend it that one's."""
    checkout = (tmp_path / "checkout").resolve()
    for folder in SHIPPED:
        shutil.copytree(REPO / folder, checkout / folder, ignore=JUNK)
    (tmp_path / "empty").mkdir()
    *files, first_finder = imported_from(checkout, tmp_path / "empty")
    assert [Path(f).resolve() for f in files] == [checkout / "lit_prunedpo/__init__.py",
                                                  checkout / "callbacks/__init__.py", checkout / "configs",
                                                  checkout / "configs/modes"]
    assert first_finder == "_SourceCheckoutFinder"


def test_an_installed_layout_needs_no_finder(tmp_path):
    """The wheel's layout (the folders inside the package): the finder stays off, and a top-level callbacks/ beside
    the package (another project's, in site-packages) is never taken for the package's."""
    site = (tmp_path / "site").resolve()
    shutil.copytree(REPO / "lit_prunedpo", site / "lit_prunedpo", ignore=JUNK)
    for folder in ("callbacks", "configs"):
        shutil.copytree(REPO / folder, site / "lit_prunedpo" / folder, ignore=JUNK)
        (site / folder).mkdir()
        (site / folder / "__init__.py").write_text("raise ImportError('not lit_prunedpo')\n")
    *files, first_finder = imported_from(site, tmp_path)
    package = site / "lit_prunedpo"
    assert [Path(f).resolve() for f in files] == [package / "__init__.py", package / "callbacks/__init__.py",
                                                  package / "configs", package / "configs/modes"]
    assert first_finder != "_SourceCheckoutFinder"


# --- the shipped configs by name: after `pip install .` the working folder has no configs/ -------------

#: every shipped YAML by its name under configs/: quickstart, modes/branch, losses/ipo, ...
SHIPPED_NAMES = sorted(p.relative_to(REPO / "configs").with_suffix("").as_posix()
                       for p in (REPO / "configs").rglob("*.yaml"))


def test_the_packaged_configs_are_the_shipped_ones():
    from lit_prunedpo.cli import shipped_configs

    found = shipped_configs()
    assert list(found) == SHIPPED_NAMES and {"quickstart", "modes/branch", "losses/ipo"} <= set(found)
    assert all(path.read_bytes() == (REPO / "configs" / f"{name}.yaml").read_bytes() for name, path in found.items())


@pytest.mark.parametrize("name", SHIPPED_NAMES)
def test_every_shipped_config_is_found_by_its_name(name, tmp_path, monkeypatch):
    from lit_prunedpo.cli import resolve_config

    monkeypatch.chdir(tmp_path)  # an empty folder, as after a non-editable install
    shipped = (REPO / "configs" / f"{name}.yaml").read_bytes()
    for spelling in (name, f"{name}.yaml", f"configs/{name}.yaml"):  # the last: the README's and each YAML's own
        path, said = resolve_config(spelling)
        assert Path(path).read_bytes() == shipped, spelling
        where = "" if spelling == name else f"{spelling} not in the working folder: "
        assert said == f"config: {where}using the packaged {name} {path}"


@pytest.mark.parametrize("folder", ["repo", "empty"])
def test_a_renamed_configs_old_name_runs_the_new_file_and_says_so(folder, tmp_path, monkeypatch):
    from lit_prunedpo.cli.packaged_configs import RENAMED, resolve_config

    monkeypatch.chdir(REPO if folder == "repo" else tmp_path)  # the checkout no longer holds the old file either
    for old, new in RENAMED.items():
        assert old not in SHIPPED_NAMES and new in SHIPPED_NAMES
        for spelling in (old, f"configs/{old}.yaml"):
            path, said = resolve_config(spelling)
            assert Path(path).read_bytes() == (REPO / "configs" / f"{new}.yaml").read_bytes()
            assert f"{old} was renamed {new} (use that name): using the packaged {new}" in said


def test_a_config_in_the_working_folder_wins(tmp_path, monkeypatch):
    from lit_prunedpo.cli import resolve_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/quickstart.yaml").write_text("seed_everything: 1\n")
    (tmp_path / "quickstart").write_text("seed_everything: 2\n")
    assert resolve_config("configs/quickstart.yaml") == ("configs/quickstart.yaml", None)
    assert resolve_config("quickstart") == ("quickstart", None)
    # inline YAML, URLs and absolute paths are LightningCLI's to read
    for value in ("{trainer: {max_steps: 2}}", "trainer.max_steps: 2", "s3://bucket/x.yaml", "/no/such/file.yaml"):
        assert resolve_config(value) == (value, None)


def test_an_unknown_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    from lit_prunedpo.cli import resolve_config

    monkeypatch.chdir(tmp_path)
    for value in ("quickstrat", "configs/modes/brunch.yaml", "my.yaml"):
        with pytest.raises(ValueError,
                           match=f"--config {value}: no such file in {tmp_path}, nor a shipped config") as err:
            resolve_config(value)
        assert ", ".join(SHIPPED_NAMES) in str(err.value)


def test_every_config_argument_is_resolved(tmp_path, monkeypatch):
    from lit_prunedpo.cli import resolve_config_args

    monkeypatch.chdir(tmp_path)
    args, said = resolve_config_args(["fit", "-c", "quickstart", "--config=modes/branch", "--config",
                                      "{seed_everything: 3}", "--trainer.max_steps", "2"])
    assert args == ["fit", "-c", str(REPO / "configs/quickstart.yaml"),
                    f"--config={REPO / 'configs/modes/branch.yaml'}",
                    "--config", "{seed_everything: 3}", "--trainer.max_steps", "2"]
    assert len(said) == 2


def test_the_configs_command_lists_and_copies(tmp_path, monkeypatch, capsys):
    from lit_prunedpo.cli import main

    main(["configs"])
    listed = capsys.readouterr().out
    assert all(re.search(rf"^  {re.escape(name)} +lit-prunedpo fit --config ", listed, re.M) for name in SHIPPED_NAMES)
    monkeypatch.chdir(tmp_path)
    main(["configs", "--copy", "configs"])
    copied = sorted(p.relative_to(tmp_path / "configs").with_suffix("").as_posix()
                    for p in (tmp_path / "configs").rglob("*.yaml"))
    assert copied == SHIPPED_NAMES and f"copied {len(copied)} configs into configs" in capsys.readouterr().out
    main(["configs", "--copy", "configs"])  # again: the same files, nothing to refuse
    edited = tmp_path / "configs/modes/branch.yaml"
    edited.write_text(edited.read_text() + "# mine\n")
    (tmp_path / "configs/quickstart.yaml").unlink()
    with pytest.raises(FileExistsError,
                       match=f"not overwriting 1 file.*{re.escape(str(Path('configs/modes/branch.yaml')))}"):
        main(["configs", "--copy", "configs"])
    assert edited.read_text().endswith("# mine\n") and not (tmp_path / "configs/quickstart.yaml").exists()


def test_configs_copy_onto_a_full_disk_is_one_line_and_leaves_no_half_file(tmp_path, monkeypatch, capsys):
    import errno

    from lit_prunedpo.cli import packaged_configs
    from lit_prunedpo.cli import main
    from lit_prunedpo.cli.user_errors import run_command

    real = shutil.copyfile

    def full_at_auto_pruning(source, dest):
        if Path(dest).name.startswith("auto_pruning.yaml"):
            Path(dest).write_bytes(b"")  # what the disk took before it was full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(source, dest)

    monkeypatch.setattr(packaged_configs.shutil, "copyfile", full_at_auto_pruning)
    with pytest.raises(SystemExit) as stop:
        run_command(lambda: main(["configs", "--copy", str(tmp_path / "c")]))
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 1 and len(err.splitlines()) == 1
    first = tmp_path / "c/auto_pruning.yaml"  # the first file copied, in name order
    assert err.startswith(f"error: --copy {tmp_path / 'c'}: cannot write {first}: disk full (ENOSPC")
    assert [p.name for p in (tmp_path / "c").iterdir() if p.name.startswith("auto_pruning")] == []
    monkeypatch.undo()
    main(["configs", "--copy", str(tmp_path / "c")])  # once there is room: copied, nothing refused as differing
    assert (tmp_path / "c/auto_pruning.yaml").read_bytes() == (REPO / "configs/auto_pruning.yaml").read_bytes()
