"""Each run's own output names, claimed so that no other run shares them: a log version, a checkpoint folder and
a config file.

* :func:`claim_log_version` gives each run its own ``version_N`` folder: Lightning picks the next free number
  by listing the folder, so two runs started together both picked ``version_0`` (one ``metrics.csv``
  interleaved, one ``config.yaml``, one checkpoint folder). Here rank 0 creates the folder with
  ``os.mkdir`` (which fails if it exists) and takes the next number when another run was first.
* :func:`claim_checkpoint_folder` does the same for a run without a logger (``logger: false``): its config is
  ``config-N.yaml`` and its checkpoints go to ``checkpoints-N/`` with the same ``N`` (``config.yaml`` and
  ``checkpoints/`` for the first run), instead of every such run writing ``checkpoints/last.ckpt``;
  :func:`run_checkpoint_dir` is the folder a callback without one of its own saves to.
* :class:`SaveRunConfig` (the CLI's config callback) gives a run without a logger its own config file.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info

from lit_prunedpo.checkpoint.io import is_local

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: Environment variables that name a process's rank before the trainer knows it (launchers set them).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "GROUP_RANK")


def launched_as_rank_zero() -> bool:
    """True unless a launcher's environment says this process is not the first one."""
    return all(int(os.environ.get(name, "0") or 0) == 0 for name in RANK_VARIABLES)


def claim_log_version(trainer: "pl.Trainer") -> list[Path]:
    """Give each of the trainer's versioned loggers (CSV, TensorBoard) a ``version_N`` folder no other run has;
    returns the folders it created (for :func:`release_empty_claims`).

    Only a logger whose version was left to Lightning is changed; an explicit ``version`` is the user's choice
    (e.g. a requeued job resuming into its own folder). Runs on the first process only: the others never
    write logs, and Lightning broadcasts rank 0's folders to them.
    """
    claimed: list[Path] = []
    if not launched_as_rank_zero():
        return claimed
    for logger in trainer.loggers:
        if getattr(logger, "_version", 0) is not None or not hasattr(logger, "_get_next_version"):
            continue
        root = Path(logger.root_dir)
        made = [folder for folder in (root, *root.parents) if not folder.exists()]  # deepest first
        root.mkdir(parents=True, exist_ok=True)
        version = logger._get_next_version()
        while True:
            try:
                (root / f"version_{version}").mkdir()
                break
            except FileExistsError:  # another run created it since the listing: take the next one
                version += 1
        # Loggers read their version lazily from this attribute; set before anything asked for it.
        logger._version = version
        claimed.append(root / f"version_{version}")
        claimed.extend(made)  # after the version: released, when left empty, once the version is
    return claimed


#: What a run writes into its log version at set-up, before its first step: its config (and hyperparameters).
SET_UP_FILES = ("config.yaml", "hparams.yaml")


def release_empty_claims(claimed: list[Path], trained: bool = True) -> None:
    """Remove the folders :func:`claim_log_version` created (``version_N``, and the log root it made) that hold
    nothing of a run: empty ones, and, for a run that failed before its first step (``trained`` False), those that
    hold only the config it saved at set-up (:data:`SET_UP_FILES`). A run that failed before training (bad data, a
    refused resume, a stale reference cache) leaves no ``version_N`` behind, and the next run takes its number."""
    for folder in claimed:
        try:
            if not trained and folder.is_dir() and all(f.name in SET_UP_FILES and f.is_file()
                                                       for f in folder.iterdir()):
                for file in folder.iterdir():
                    file.unlink()
            folder.rmdir()  # only an empty folder goes
        except OSError:
            pass


class SaveRunConfig(SaveConfigCallback):
    """Lightning's ``SaveConfigCallback``, except that a run without a logger never overwrites another run's
    config file.

    Without a logger the config goes to ``default_root_dir``, which every such run there shares (there is no
    ``version_N`` to claim); with ``overwrite`` the second run replaced the first one's ``config.yaml``. Here
    the first process claims the first free name of ``config.yaml``, ``config-1.yaml``, ... (``O_EXCL``: two
    runs started together cannot both take one) and logs which. A ``fit`` run's name is claimed earlier, by
    :func:`claim_checkpoint_folder`, together with its checkpoint folder.
    """

    claimed = False  # set by claim_checkpoint_folder: config_filename is this run's already

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if (not self.already_saved and not self.claimed and self.save_to_log_dir and not trainer.loggers
                and trainer.is_global_zero):
            folder = Path(trainer.log_dir)
            if is_local(folder):
                wanted, self.config_filename = self.config_filename, claim_file(folder, Path(self.config_filename))
                if self.config_filename != wanted:
                    rank_zero_info(f"{folder / wanted} belongs to another run (logger: false): this run's config is "
                                   f"{folder / self.config_filename}")
        super().setup(trainer, pl_module, stage)


def _numbered(name: str, n: int) -> str:
    """``name`` for the first run, ``STEM-N.SUFFIX`` for the ``N``-th one after it."""
    if n == 0:
        return name
    path = Path(name)
    return f"{path.stem}-{n}{path.suffix}"


def claim_file(folder: Path, name: Path) -> str:
    """Create the first of ``name``, ``STEM-1SUFFIX``, ... that does not exist in ``folder``; its name."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        candidate = _numbered(name.name, n)
        try:
            os.close(os.open(folder / candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return candidate
        except FileExistsError:
            n += 1


#: The checkpoint folder each trainer without a logger claimed (claim_checkpoint_folder), on the first process.
_CLAIMED_FOLDERS: "WeakKeyDictionary[pl.Trainer, Path]" = WeakKeyDictionary()
DEFAULT_CHECKPOINT_FOLDER = "checkpoints"


def run_checkpoint_dir(trainer: "pl.Trainer") -> Path:
    """The folder for this run's checkpoints when no callback names one: ``{default_root_dir}/checkpoints``, or the
    ``checkpoints-N`` that :func:`claim_checkpoint_folder` claimed for a run without a logger. Callbacks that call
    it on every process broadcast rank 0's answer (only rank 0 claims)."""
    return _CLAIMED_FOLDERS.get(trainer, Path(trainer.default_root_dir) / DEFAULT_CHECKPOINT_FOLDER)


def claim_checkpoint_folder(trainer: "pl.Trainer") -> None:
    """Give a run without a logger a checkpoint folder and a config file no other run has.

    Without a logger Lightning puts every run's checkpoints in ``{default_root_dir}/checkpoints``: a second run
    there overwrote the first one's ``last.ckpt`` (and resumed from it with ``--ckpt_path last``). Here the first
    process claims the first ``N`` whose ``config-N.yaml`` (created with ``O_EXCL``) and ``checkpoints-N/`` (created
    with ``mkdir``) are both free (``N = 0``: ``config.yaml`` and ``checkpoints/``, Lightning's names), and points
    every ``ModelCheckpoint`` without a ``dirpath`` (and :class:`~lit_prunedpo.callbacks.FinalCheckpoint`,
    :class:`~lit_prunedpo.callbacks.PreemptionCheckpoint`, through :func:`run_checkpoint_dir`) at the folder.
    A run with a logger, or whose checkpoints all go to folders the user named, is left alone; a run without
    checkpoints (``enable_checkpointing=False``) claims its config name alone.
    """
    if trainer.loggers or not launched_as_rank_zero():
        return
    root = Path(trainer.default_root_dir)
    if not is_local(root):
        return
    unnamed = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and not cb.dirpath]
    named = isinstance(trainer.checkpoint_callback, ModelCheckpoint) and trainer.checkpoint_callback.dirpath
    config = next((cb for cb in trainer.callbacks if isinstance(cb, SaveRunConfig) and cb.save_to_log_dir
                   and not cb.already_saved), None)
    if named and not unnamed:
        return  # SaveRunConfig claims the config name alone, at set-up
    root.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        config_name = _numbered(config.config_filename, n) if config is not None else None
        folder = root / _numbered(DEFAULT_CHECKPOINT_FOLDER, n)
        try:
            if config_name is not None:
                os.close(os.open(root / config_name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            n += 1
            continue
        try:
            if trainer.checkpoint_callbacks:  # none under enable_checkpointing=False: no folder to fill
                folder.mkdir()
        except FileExistsError:  # a run whose config was not saved (or saved elsewhere) has this folder
            if config_name is not None:
                (root / config_name).unlink()
            n += 1
            continue
        break
    _CLAIMED_FOLDERS[trainer] = folder
    for callback in unnamed:
        callback.dirpath = os.path.realpath(folder)  # as ModelCheckpoint stores a dirpath given to it
    if config is not None:
        config.config_filename, config.claimed = config_name, True
    if n > 0:
        rank_zero_info(f"{root} holds other runs' outputs (logger: false): this run's checkpoints go to {folder}"
                       + (f" and its config is {root / config_name}" if config_name is not None else ""))


def ignore_warning(message: str) -> None:
    """Ignore, for the rest of this process (one CLI run), Lightning warnings that match ``message`` (a regex): its
    warnings about a run's checkpoint folders that the claims, the locks and the resume make moot."""
    warnings.filterwarnings("ignore", message=message)
