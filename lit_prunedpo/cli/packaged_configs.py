"""The configs the package ships (the repository's ``configs/``, packaged as ``lit_prunedpo.configs``), by name.

``--config`` takes a file, or a shipped config by its name under ``configs/`` (:func:`resolve_config`:
``--config quickstart``, ``--config modes/branch``, and ``--config configs/quickstart.yaml`` from a folder without
that file, as after ``pip install``); ``lit-prunedpo configs`` lists them or copies them into a folder to edit
(:func:`configs_main`). Standard library and jsonargparse only: the command's help and ``configs`` start fast.
"""

from __future__ import annotations

import os
import re
import shutil
from importlib import resources
from pathlib import Path

from jsonargparse import ArgumentParser

from lit_prunedpo.full_disk import DiskFull, describe_full, disk_full_errno, partial_path

CONFIGS_HELP = ("List the shipped configs (use one as --config NAME), or copy them into a folder to edit "
                "(--copy DIR); see: lit-prunedpo configs --help")


def configs_folder() -> Path:
    """The folder of the packaged configs (``lit_prunedpo.configs``: the repository's ``configs/``)."""
    return Path(str(resources.files("lit_prunedpo.configs")))


def quickstart_config() -> Path:
    """Path of the packaged ``configs/quickstart.yaml``."""
    return configs_folder() / "quickstart.yaml"


def shipped_configs() -> dict[str, Path]:
    """Every shipped YAML by its name, its path under ``configs/`` without ``.yaml`` (``quickstart``,
    ``modes/branch``, ``losses/ipo``) -> its file, sorted by name."""
    root = configs_folder()
    return dict(sorted((p.relative_to(root).with_suffix("").as_posix(), p) for p in root.rglob("*.yaml")))


#: shipped configs renamed: old name -> new name. The old name still runs the new file (a user's command or script
#: written before the rename keeps working) and the log line says the new name.
RENAMED = {"fast": "auto_pruning"}

#: a ``--config`` value written as a relative path or a name: letters, digits, ``_.-`` and ``/`` only. Inline YAML
#: (``{trainer: ...}``, ``key: value``) and URLs have other characters, an absolute path starts with ``/``.
_RELATIVE = re.compile(r"[\w.-]+(?:/[\w.-]+)*")


def resolve_config(value: str) -> tuple[str, str | None]:
    """The file a ``--config`` value names, and the line to log when that is a shipped config.

    A file (or folder) that exists is used as given: a config of the working folder always wins. A value that does
    not exist and is written as a relative path or a name is looked up among the shipped configs by its path under
    ``configs/``, with or without ``configs/`` in front and ``.yaml`` behind: ``quickstart``, ``modes/branch``,
    ``configs/modes/branch.yaml`` (the spelling the README and each YAML's first line use; after ``pip install`` the
    working folder has no ``configs/``); a renamed config's old name (:data:`RENAMED`) gives the new file and says
    so. Anything else (inline YAML, a URL, an absolute path) is left to
    LightningCLI.

    Raises:
        ValueError: a relative path or name that is neither a file here nor a shipped config; the message lists the
            shipped names.
    """
    if Path(value).expanduser().exists() or not _RELATIVE.fullmatch(value):
        return value, None
    shipped = shipped_configs()
    name = value.removeprefix("configs/").removesuffix(".yaml")
    renamed = ""
    if name in RENAMED:
        name, renamed = RENAMED[name], f"{name} was renamed {RENAMED[name]} (use that name): "
    if name in shipped:
        where = "" if value == name else f"{value} not in the working folder: "
        return str(shipped[name]), f"config: {where}{renamed}using the packaged {name} {shipped[name]}"
    raise ValueError(f"--config {value}: no such file in {os.getcwd()}, nor a shipped config; the shipped ones "
                     f"(--config NAME): {', '.join(shipped)} (lit-prunedpo configs --copy DIR copies them to edit)")


def resolve_config_args(args: list[str]) -> tuple[list[str], list[str]]:
    """``args`` with each ``-c``/``--config`` value through :func:`resolve_config`, and the lines to log."""
    out, said = [], []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-c", "--config") and i + 1 < len(args):
            path, line = resolve_config(args[i + 1])
            out += [arg, path]
            i += 2
        elif arg.startswith("--config="):
            path, line = resolve_config(arg.partition("=")[2])
            out.append(f"--config={path}")
            i += 1
        else:
            out.append(arg)
            i += 1
            continue
        if line is not None:
            said.append(line)
    return out, said


def _config_values(args: list[str]) -> list[str]:
    """The ``-c``/``--config`` values of ``args``, in order."""
    values = [value for flag, value in zip(args, args[1:]) if flag in ("-c", "--config")]
    return values + [a.partition("=")[2] for a in args if a.startswith("--config=")]


def _sets(config: object, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    return True


def overlay_error(args: list[str], message: str) -> str | None:
    """For a parse that failed with ``message`` (``the following arguments are required: fit.model.policy, ...``)
    when every ``--config`` in ``args`` sets none of the required arguments (a mode or loss overlay given alone),
    the error that says so and how to use them; else ``None``."""
    import yaml

    head = "the following arguments are required: "
    configs = _config_values(args)
    if not message.startswith(head) or not configs:
        return None
    missing = [key.partition(".")[2] if key.split(".")[0] in ("fit", "validate", "test") else key
               for key in message[len(head):].split(", ")]
    for path in configs:
        try:
            config = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            return None
        if any(_sets(config, key) for key in missing):
            return None
    root = configs_folder()
    names = [Path(c).relative_to(root).with_suffix("").as_posix() if Path(c).is_relative_to(root) else c
             for c in configs]
    given = " ".join(f"--config {name}" for name in names)
    what, it = ("this is an overlay", "it") if len(names) == 1 else ("these are overlays", "them")
    return (f"{given} sets none of the required {', '.join(missing)}: {what}: add {it} after a base config, e.g. "
            f"--config quickstart {given}")


def _copy_whole(source: Path, dest: Path, target: Path) -> None:
    """Copy ``source`` to ``dest`` through a temporary sibling renamed into place (:func:`partial_path`): a copy cut
    short leaves no file under ``dest``'s name, which a later ``--copy`` would refuse as one that differs.

    Raises:
        DiskFull: the disk of ``target`` is full (the file named, the temporary one removed).
    """
    partial = partial_path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, partial)
        os.replace(partial, dest)
    except OSError as err:
        code = disk_full_errno(err)
        if code is None:
            raise
        raise DiskFull(f"--copy {target}: cannot write {dest}: {describe_full(code)} on the disk of {target}; nothing "
                       "half-written is left (the configs copied before it are whole): free space there, or copy into "
                       "a folder on another disk", code) from None
    finally:
        if partial.exists():
            partial.unlink()


def configs_main(args: list[str]) -> None:
    """``lit-prunedpo configs [--copy DIR]``: list the shipped configs, or copy them into ``DIR`` to edit.

    The copies keep their names under ``configs/`` (``DIR/modes/branch.yaml``): with ``DIR`` = ``configs`` the
    command on each file's first line runs the edited copy. A file already in ``DIR`` with other contents is never
    overwritten: the copy is refused, naming them, before anything is written.

    Raises:
        FileExistsError: files of ``DIR`` that differ from the shipped ones of the same name (or ``DIR`` is a file).
        DiskFull: a full disk, naming the file; every file is copied whole or not at all (:func:`_copy_whole`).
    """
    parser = ArgumentParser(prog="lit-prunedpo configs", description=CONFIGS_HELP.partition("; see:")[0] + ".")
    parser.add_argument("--copy", metavar="DIR", default=None,
                        help="copy every shipped config into DIR (subfolders kept: DIR/modes/branch.yaml); files "
                             "already there with other contents are not overwritten (nothing is copied)")
    copy = parser.parse_args(args).copy
    shipped = shipped_configs()
    if copy is None:
        width = max(map(len, shipped))
        print(f"shipped configs ({configs_folder()}); run one with: lit-prunedpo fit --config NAME")
        for name, path in shipped.items():
            first = path.read_text().splitlines()[0].removeprefix("#").strip()
            print(f"  {name:{width}}  {first}")
        return
    target = Path(copy).expanduser()
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"--copy {copy}: a file, not a folder")
    destinations = {name: target / path.relative_to(configs_folder()) for name, path in shipped.items()}
    differing = [str(dest) for name, dest in destinations.items()
                 if dest.exists() and (not dest.is_file() or dest.read_bytes() != shipped[name].read_bytes())]
    if differing:
        raise FileExistsError(f"--copy {copy}: not overwriting {len(differing)} file(s) that differ from the shipped "
                              f"ones: {', '.join(differing)}; move them away or copy into another folder")
    for name, dest in destinations.items():
        _copy_whole(shipped[name], dest, target)
    print(f"copied {len(shipped)} configs into {target}; run one with: lit-prunedpo fit --config "
          f"{target / 'quickstart.yaml'}")
