"""How a run resumes: :func:`resolve_resume` turns ``ckpt_path="last"`` into the newest readable checkpoint of
the previous runs in the root folder (every run's checkpoint folder, not only this run's new one, and every
checkpoint there, not only ``last*.ckpt``: a ``last.ckpt`` torn by a full disk falls back to the step checkpoint
beside it). It names every newer one it skipped and every leftover temporary of an interrupted save; when there
is none it refuses, naming where it looked, instead of starting afresh. Lightning's implicit ``"last"`` (``fit``
without ``ckpt_path`` when an ``OnExceptionCheckpoint`` is configured) looks in this run's checkpoint folders
only, as Lightning does, and starts afresh when they are empty (a first launch).

:func:`find_checkpoints` is the search alone; its answer, a :class:`ResumeSearch`, holds what the choice and its
messages need.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_prunedpo.checkpoint.checks import checkpoint_problem
from lit_prunedpo.checkpoint.claims import DEFAULT_CHECKPOINT_FOLDER, ignore_warning, run_checkpoint_dir
from lit_prunedpo.checkpoint.io import is_local

if TYPE_CHECKING:
    import lightning.pytorch as pl


@dataclass
class ResumeSearch:
    """Where ``ckpt_path="last"`` looked for a checkpoint to resume from, and what it found there."""

    #: Every checkpoint found (absolute paths), the newest (by modification time) first.
    checkpoints: list[str]
    #: The folders, files and folder patterns looked in, for messages.
    places: list[str]
    #: This run's own checkpoint folders (those that exist): the next save there replaces a leftover temporary.
    run_folders: set[Path]


def find_checkpoints(trainer: "pl.Trainer", previous_runs: bool = False) -> ResumeSearch:
    """The checkpoints ``ckpt_path="last"`` chooses from, and where they were looked for.

    Always every checkpoint in this run's checkpoint folders (a step checkpoint beside a torn ``last.ckpt``
    too, not only Lightning's ``last*.ckpt``); with ``previous_runs`` also every checkpoint of the other runs
    under the root folder (:func:`_previous_run_folders`). Paths are absolute, so that one file reached by two
    routes (a relative dirpath, a listing) is one candidate.
    """
    run_folders, candidates = _callback_folders(trainer)
    places = [str(f) for f in sorted(run_folders)] + sorted(c for c in candidates if Path(c).parent not in run_folders)
    folders = set(run_folders)
    if previous_runs:
        patterns, previous = _previous_run_folders(trainer)
        places += patterns
        folders |= previous
    for folder in folders:
        candidates |= _checkpoints_in(folder)
    return ResumeSearch(sorted(candidates, key=os.path.getmtime, reverse=True), places, run_folders)


def _checkpoints_in(folder: Path) -> set[str]:
    """Every checkpoint in ``folder``: ``*.ckpt`` files and folders of shards, not the dot-named temporaries of
    saves in progress."""
    if not folder.is_dir():
        return set()
    return {os.path.abspath(p) for p in folder.iterdir() if p.suffix == ".ckpt" and not p.name.startswith(".")}


def _callback_folders(trainer: "pl.Trainer") -> tuple[set[Path], set[str]]:
    """The folders this run's checkpoint callbacks write to (that exist), and the files Lightning itself
    considers for ``ckpt_path="last"`` (``OnExceptionCheckpoint`` files, every ``ModelCheckpoint``'s
    ``last*.ckpt``)."""
    files: set[str] = set()
    folders: set[Path] = set()
    for callback in trainer.callbacks:
        if isinstance(callback, OnExceptionCheckpoint):
            path = getattr(callback, "ckpt_path", None)
            if not path:  # a folder resolved at set-up (PreemptionCheckpoint): the default one
                path = run_checkpoint_dir(trainer) / f"{callback.filename}.ckpt"
            files.add(os.path.normpath(path))
        elif type(callback).__name__ == "FinalCheckpoint" and getattr(callback, "dirpath", None):
            folders.add(Path(callback.dirpath))
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            files |= callback._find_last_checkpoints(trainer)
            if callback.dirpath and is_local(callback.dirpath):
                folders.add(Path(callback.dirpath))
    files = {os.path.abspath(f) for f in files if is_local(f) and Path(f).exists()}
    folders |= {Path(f).parent for f in files}
    return {f for f in folders if f.is_dir()}, files


def _previous_run_folders(trainer: "pl.Trainer") -> tuple[list[str], set[Path]]:
    """Every run's checkpoint folder under the root: ``{save_dir}/{name}/*/checkpoints`` of the first logger
    (where ``ModelCheckpoint`` writes by default: every version, string versions too) and
    ``{default_root_dir}/checkpoints*`` (runs without a logger, see
    :func:`~lit_prunedpo.checkpoint.claims.claim_checkpoint_folder`); the patterns (for messages) and the folders
    that exist."""
    root_dir = os.path.abspath(trainer.default_root_dir)
    places = [(root_dir, DEFAULT_CHECKPOINT_FOLDER + "*")]
    if trainer.loggers:
        logger = trainer.loggers[0]
        save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
        if is_local(save_dir):
            places.insert(0, (os.path.abspath(os.path.join(save_dir, str(logger.name or ""))),
                              os.path.join("*", DEFAULT_CHECKPOINT_FOLDER)))
    folders = {Path(p) for base, rest in places for p in glob.glob(os.path.join(glob.escape(base), rest))}
    return [os.path.join(base, rest) for base, rest in places], {f for f in folders if f.is_dir()}


def _leftover_temporaries(folders: set[Path]) -> list[str]:
    """Temporary files and folders of interrupted saves (``AtomicCheckpointIO``'s ``.NAME.PID.tmp``,
    ``FSDP2Strategy``'s ``.NAME.tmp`` and ``.NAME.old``) in the folders resume looks in."""
    return sorted(
        str(p) for folder in folders if folder.is_dir() for p in folder.iterdir()
        if p.name.startswith(".") and p.name.endswith((".tmp", ".old"))
    )


def resolve_resume(trainer: "pl.Trainer", ckpt_path: str | None) -> str | None:
    """The checkpoint a ``fit`` with ``ckpt_path`` resumes from; anything but ``"last"`` (or ``None``) is
    returned unchanged.

    ``"last"`` (``--ckpt_path last``) becomes the newest (by modification time) readable checkpoint of this
    run's checkpoint folders and of every previous run's under the root folder: each run claims a log version
    (or a checkpoint folder) of its own, so this run's own folder is new and empty. The CLI then logs the resumed
    run into the run folder of the checkpoint chosen (:func:`~lit_prunedpo.checkpoint.run_folder.continue_run_folder`:
    one ``version_N``, one ``metrics.csv``), where it also writes its checkpoints, so the next ``--ckpt_path last``
    finds the resumed run's checkpoints, the newest; a checkpoint outside a run folder keeps the new version.

    ``None`` with an ``OnExceptionCheckpoint`` configured is Lightning's implicit ``"last"``: the same, but in
    this run's checkpoint folders only (a fixed ``dirpath``, as the DDP/FSDP configs have), and a first launch
    (nothing there) starts afresh.

    Newer checkpoints that cannot be read (:func:`checkpoint_problem`) are skipped with a warning naming each;
    the chosen one is named in a logged line.

    Raises:
        FileNotFoundError: ``"last"`` was asked for and there is no checkpoint at all (naming where it looked).
        ValueError: there are candidates but none is readable (each named with its problem).
    """
    implicit = ckpt_path is None and any(isinstance(cb, OnExceptionCheckpoint) for cb in trainer.callbacks)
    if ckpt_path != "last" and not implicit:
        return ckpt_path
    search = find_checkpoints(trainer, previous_runs=not implicit)
    if not search.checkpoints:
        return _nothing_to_resume(search, implicit)
    chosen = _newest_readable(search)
    rank_zero_info(f"resume (ckpt_path=last): resuming from {chosen}, the newest readable checkpoint in "
                   f"{', '.join(search.places)}")
    # a relaunch into a fixed folder: Lightning's "exists and is not empty" is the checkpoint this run resumes from
    ignore_warning(rf"Checkpoint directory {re.escape(str(Path(chosen).parent))} exists and is not empty")
    return chosen


def _nothing_to_resume(search: ResumeSearch, implicit: bool) -> str:
    """``"last"`` for Lightning's implicit ``"last"`` (a first launch: it starts afresh), said in a logged line.

    Raises:
        FileNotFoundError: ``"last"`` was asked for (naming where it looked).
    """
    if implicit:
        # A first launch: nothing to resume. Lightning would say so with a hint to set save_last=True, which the
        # configs do (their checkpoints just do not exist yet); the line here says what happens instead.
        rank_zero_info(f"resume: no checkpoint in {', '.join(search.places)} yet (a first launch): starting afresh; "
                       "relaunching this command resumes from the checkpoints this run writes there")
        ignore_warning(r'\.fit\(ckpt_path="last"\) is set, but there is no last checkpoint available')
        return "last"
    raise FileNotFoundError(
        f"resume (ckpt_path=last): no checkpoint of a previous run in {', '.join(search.places)}. Pass --ckpt_path "
        "with a checkpoint file (or the root folder of the run to resume: --trainer.default_root_dir), or leave "
        "--ckpt_path out to start a new run"
    )


def _newest_readable(search: ResumeSearch) -> str:
    """The newest checkpoint of ``search`` that can be read (:func:`checkpoint_problem`). Warns about every newer
    one skipped, and about every leftover temporary beside the checkpoints looked at and in this run's folders.

    Raises:
        ValueError: none can be read (each named with its problem).
    """
    problems: dict[str, str | None] = {}
    for path in search.checkpoints:
        problems[path] = checkpoint_problem(path)
        if problems[path] is None:
            break
    # temporaries beside the checkpoints looked at, and in this run's folders (where the next save replaces them)
    for leftover in _leftover_temporaries({Path(p).parent for p in problems} | search.run_folders):
        rank_zero_warn(f"resume: ignored {leftover}: the temporary output of a checkpoint save that was interrupted "
                       "(never resumed from)")
    *skipped, (chosen, problem) = problems.items()
    if problem is not None:
        raise ValueError(
            "resume (ckpt_path=last): no checkpoint can be read: "
            + "; ".join(f"{p}: {why}" for p, why in problems.items())
            + ". Delete them to start afresh, or pass --ckpt_path with a readable checkpoint"
        )
    for bad, why in skipped:
        rank_zero_warn(f"resume: skipped {bad}: it cannot be read ({why}); resuming from {chosen}, the newest "
                       "readable checkpoint")
    return chosen
