"""Run outputs that are never torn or shared: atomic checkpoint files, a log version (or, without a logger, a
checkpoint folder) per run, a resume that finds the previous runs' newest readable checkpoint and says which.

* :class:`AtomicCheckpointIO` writes to a temporary name in the same folder and renames it into place
  (``os.replace``, atomic on POSIX): a full disk or a killed process leaves no file (or a stray temporary
  one), never a truncated ``last.ckpt`` under the name a resume looks for. It sits under every
  ``trainer.save_checkpoint`` (``ModelCheckpoint``, the preemption checkpoint, a final save), and loads like
  :class:`~lit_prunedpo.distributed.VerifiedCheckpointIO` (errors name the file).
* :func:`claim_log_version` gives each run its own ``version_N`` folder: Lightning picks the next free number
  by listing the folder, so two runs started together both picked ``version_0`` (one ``metrics.csv``
  interleaved, one ``config.yaml``, one checkpoint folder). Here rank 0 creates the folder with
  ``os.mkdir`` (which fails if it exists) and takes the next number when another run was first.
* :func:`claim_checkpoint_folder` does the same for a run without a logger (``logger: false``): its config is
  ``config-N.yaml`` and its checkpoints go to ``checkpoints-N/`` with the same ``N`` (``config.yaml`` and
  ``checkpoints/`` for the first run), instead of every such run writing ``checkpoints/last.ckpt``.
* :func:`lock_checkpoint_dirs` takes a lock file in each fixed ``ModelCheckpoint`` folder (``dirpath``, e.g.
  the DDP/FSDP configs'): a second run started on that folder while the first one lives is refused, instead
  of resuming from the other run's ``last.ckpt`` and writing beside it. A lock left by a dead process on this
  host is taken over.
* :func:`resolve_resume` turns ``ckpt_path="last"`` into the newest readable checkpoint of the previous runs
  in the root folder (every run's checkpoint folder, not only this run's new one, and every checkpoint there,
  not only ``last*.ckpt``: a ``last.ckpt`` torn by a full disk falls back to the step checkpoint beside it).
  It names every newer one it skipped and every leftover temporary of an interrupted save; when there is none
  it refuses, naming where it looked, instead of starting afresh. Lightning's implicit ``"last"`` (``fit``
  without ``ckpt_path`` when an ``OnExceptionCheckpoint`` is configured) looks in this run's checkpoint
  folders only, as Lightning does, and starts afresh when they are empty (a first launch).
* :func:`checkpoint_problem` says why a file or folder is not a readable checkpoint: an archive that is cut
  short, or a folder of shards missing a file (every shard its ``.metadata`` names must be there).
* :class:`SaveRunConfig` (the CLI's config callback) gives a run without a logger its own config file.

:class:`~lit_prunedpo.cli.PrunedDPOCLI` applies all of them. With a plain ``Trainer``, ``PrunedDPO`` puts
:class:`AtomicCheckpointIO` in place itself when it saves (a ``CheckpointIO`` you chose is kept) and
:class:`~lit_prunedpo.distributed.FSDP2Strategy` writes its folders of shards atomically; call the functions
yourself for the rest.
"""

from __future__ import annotations

import atexit
import errno
import os
import pickle
import re
import shutil
import socket
import warnings
import zipfile
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_prunedpo.distributed import VerifiedCheckpointIO
from lit_prunedpo.full_disk import DiskFull, describe_full, disk_full_errno

#: Environment variables that name a process's rank before the trainer knows it (launchers set them).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "GROUP_RANK")
LOCK_NAME = ".lit_prunedpo.lock"
#: Files a complete sharded checkpoint folder holds, written last (``torch.distributed.checkpoint``'s index,
#: then Lightning's non-tensor state).
DCP_METADATA, LIGHTNING_METADATA = ".metadata", "meta.pt"


class AtomicCheckpointIO(VerifiedCheckpointIO):
    """``TorchCheckpointIO`` that writes ``path`` under a temporary name first and renames it into place, and
    whose load errors name the file.

    Remote file systems (``s3://``...) are written as by ``TorchCheckpointIO``: a rename there is a copy.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if not _is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        final = Path(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        # A dot name with a .tmp suffix: ModelCheckpoint never mistakes it for a checkpoint of its own.
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            os.replace(tmp, final)
        except Exception as err:
            code = disk_full_errno(err) or _full_now(final.parent)  # before the partial file is removed
            if code is None:
                raise
            raise DiskFull(f"could not save checkpoint {final}: {describe_full(code)} (torch's error: {err}); the "
                           f"previous {final.name}, if any, is as it was: free space on that disk, or give the "
                           "checkpoint another folder (ModelCheckpoint dirpath)", code) from None
        finally:
            if tmp.exists():
                tmp.unlink()


#: Free bytes under which a failed write is taken for a full disk: torch's writer reports one as "unexpected pos"
#: or "file write failed", without an errno.
FULL_BELOW_BYTES = 1 << 20


def _full_now(folder: Path) -> int | None:
    """``errno.ENOSPC`` when the file system of ``folder`` has (almost) no space left, else ``None``."""
    try:
        return errno.ENOSPC if shutil.disk_usage(folder).free < FULL_BELOW_BYTES else None
    except OSError:
        return None


def _is_local(path: Any) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def install_atomic_io(trainer: "pl.Trainer") -> None:
    """Put :class:`AtomicCheckpointIO` under the trainer's strategy in place of the default ``TorchCheckpointIO``
    or a ``VerifiedCheckpointIO`` (it does what that does, and more); any other ``CheckpointIO`` is left alone."""
    strategy = trainer.strategy
    try:
        current = strategy.checkpoint_io
    except NotImplementedError:  # strategies that write sharded folders through torch.distributed.checkpoint
        return
    if type(current) in (TorchCheckpointIO, VerifiedCheckpointIO):
        strategy.checkpoint_io = AtomicCheckpointIO()


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
    return claimed


def release_empty_claims(claimed: list[Path]) -> None:
    """Remove the ``version_N`` folders :func:`claim_log_version` created that are still empty: a run that failed
    before writing anything (bad data, a refused resume) leaves no empty folder, and the next run takes its number."""
    for folder in claimed:
        try:
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
            if _is_local(folder):
                wanted, self.config_filename = self.config_filename, _claim_file(folder, Path(self.config_filename))
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


def _claim_file(folder: Path, name: Path) -> str:
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
    A run with a logger, or whose checkpoints all go to folders the user named, is left alone.
    """
    if trainer.loggers or not launched_as_rank_zero():
        return
    root = Path(trainer.default_root_dir)
    if not _is_local(root):
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


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a readable checkpoint (``None`` when it is): a truncated or corrupt archive, or a
    torn folder of shards.

    A file: checks the zip archive ``torch.save`` writes (its directory and every member's CRC) without
    unpickling it. A folder (a distributed checkpoint): checks that both files written last by a complete save
    are there, ``torch.distributed.checkpoint``'s ``.metadata`` and Lightning's ``meta.pt`` (itself an archive),
    and that every storage file the ``.metadata`` names is there and holds the bytes it records (a lost shard
    would otherwise fail only when loading, or load part of the state). A non-empty folder with neither of them
    and no ``.distcp`` shard is another format, accepted as is.
    """
    path = Path(path)
    if path.is_dir():
        names = [p.name for p in path.iterdir()]
        if names and not any(n in (DCP_METADATA, LIGHTNING_METADATA) or n.endswith(".distcp") for n in names):
            return None
        missing = [name for name in (DCP_METADATA, LIGHTNING_METADATA) if not (path / name).is_file()]
        if missing:
            return (f"a folder of shards without {' and '.join(missing)}: torn, its save was interrupted "
                    "(or it is not a distributed checkpoint)")
        problem = checkpoint_problem(path / LIGHTNING_METADATA)
        return f"{LIGHTNING_METADATA}: {problem}" if problem is not None else _shards_problem(path)
    try:
        size = path.stat().st_size
        if size == 0:
            return "the file is empty"
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            return f"member {bad} fails its CRC check"
    except zipfile.BadZipFile as err:
        return f"not a complete checkpoint archive ({err}; {size} bytes: truncated, e.g. by a full disk?)"
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None


def _shards_problem(folder: Path) -> str | None:
    """Why the storage files ``folder/.metadata`` names are not all there and whole (``None`` when they are).

    ``.metadata`` is ``torch.distributed.checkpoint``'s pickled ``Metadata`` (what its ``FileSystemReader`` reads):
    ``storage_data`` maps every saved item to a relative file name, an offset and a length.
    """
    try:
        with open(folder / DCP_METADATA, "rb") as f:
            metadata = pickle.load(f)
    except Exception as err:  # a torn or foreign index: whatever unpickling raised
        return f"{DCP_METADATA} cannot be read ({type(err).__name__}: {err})"
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        return f"{DCP_METADATA} names no storage files (not torch.distributed.checkpoint metadata)"
    needed: dict[str, int] = {}
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if name is not None:
            needed[name] = max(needed.get(name, 0), int(info.offset) + int(info.length))
    missing = sorted(name for name in needed if not (folder / name).is_file())
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return f"{len(missing)} of the {len(needed)} shard files its {DCP_METADATA} names are missing: {shown}"
    short = sorted(name for name, end in needed.items() if (folder / name).stat().st_size < end)
    if short:
        return f"shard file {short[0]} is shorter than its {DCP_METADATA} records (truncated)"
    return None


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
            if callback.dirpath and _is_local(callback.dirpath):
                folders.add(Path(callback.dirpath))
    files = {os.path.abspath(f) for f in files if _is_local(f) and Path(f).exists()}
    folders |= {Path(f).parent for f in files}
    return {f for f in folders if f.is_dir()}, files


def _previous_run_folders(trainer: "pl.Trainer") -> tuple[list[str], set[Path]]:
    """Every run's checkpoint folder under the root: ``{save_dir}/{name}/*/checkpoints`` of the first logger
    (where ``ModelCheckpoint`` writes by default: every version, string versions too) and
    ``{default_root_dir}/checkpoints*`` (runs without a logger, see :func:`claim_checkpoint_folder`); the
    patterns (for messages) and the folders that exist."""
    import glob

    root_dir = os.path.abspath(trainer.default_root_dir)
    places = [(root_dir, DEFAULT_CHECKPOINT_FOLDER + "*")]
    if trainer.loggers:
        logger = trainer.loggers[0]
        save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
        if _is_local(save_dir):
            places.insert(0, (os.path.abspath(os.path.join(save_dir, str(logger.name or ""))),
                              os.path.join("*", DEFAULT_CHECKPOINT_FOLDER)))
    folders = {Path(p) for base, rest in places for p in glob.glob(os.path.join(glob.escape(base), rest))}
    return [os.path.join(base, rest) for base, rest in places], {f for f in folders if f.is_dir()}


def _last_candidates(trainer: "pl.Trainer", previous_runs: bool = False) -> tuple[set[str], list[str]]:
    """The checkpoints ``ckpt_path="last"`` chooses from, and where they were looked for (for messages).

    Always every checkpoint in this run's checkpoint folders (a step checkpoint beside a torn ``last.ckpt``
    too, not only Lightning's ``last*.ckpt``); with ``previous_runs`` also every checkpoint of the other runs
    under the root folder (:func:`_previous_run_folders`). Paths are absolute, so that one file reached by two
    routes (a relative dirpath, a listing) is one candidate.
    """
    folders, candidates = _callback_folders(trainer)
    places = [str(f) for f in sorted(folders)] + sorted(c for c in candidates if Path(c).parent not in folders)
    if previous_runs:
        patterns, previous = _previous_run_folders(trainer)
        places += patterns
        folders |= previous
    for folder in folders:
        candidates |= _checkpoints_in(folder)
    return candidates, places


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
    (or a checkpoint folder) of its own, so this run's own folder is new and empty. The resumed run still logs
    into a new ``version_N`` (and writes its checkpoints there), as every Lightning run with a default logger
    does: the previous run's ``metrics.csv`` and ``config.yaml`` are left as they were, the step numbers continue
    from the checkpoint's, and the next ``--ckpt_path last`` finds the resumed run's checkpoints, the newest.
    Pin ``--trainer.logger.init_args.version`` to keep one folder across relaunches.

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
    candidates, places = _last_candidates(trainer, previous_runs=not implicit)
    candidates = sorted(candidates, key=lambda p: os.path.getmtime(p), reverse=True)
    if not candidates:
        if implicit:
            # A first launch: nothing to resume. Lightning would say so with a hint to set save_last=True, which the
            # configs do (their checkpoints just do not exist yet); the line here says what happens instead.
            rank_zero_info(f"resume: no checkpoint in {', '.join(places)} yet (a first launch): starting afresh; "
                           "relaunching this command resumes from the checkpoints this run writes there")
            _ignore_warning(r'\.fit\(ckpt_path="last"\) is set, but there is no last checkpoint available')
            return "last"
        raise FileNotFoundError(
            f"resume (ckpt_path=last): no checkpoint of a previous run in {', '.join(places)}. Pass --ckpt_path with "
            "a checkpoint file (or the root folder of the run to resume: --trainer.default_root_dir), or leave "
            "--ckpt_path out to start a new run"
        )
    problems = {}
    for path in candidates:
        problems[path] = checkpoint_problem(path)
        if problems[path] is None:
            break
    # temporaries beside the checkpoints looked at, and in this run's folders (where the next save replaces them)
    for leftover in _leftover_temporaries({Path(p).parent for p in problems} | _callback_folders(trainer)[0]):
        rank_zero_warn(f"resume: ignored {leftover}: the temporary output of a checkpoint save that was interrupted "
                       "(never resumed from)")
    *skipped, chosen = problems.items()
    if chosen[1] is not None:
        raise ValueError(
            "resume (ckpt_path=last): no checkpoint can be read: "
            + "; ".join(f"{p}: {why}" for p, why in problems.items())
            + ". Delete them to start afresh, or pass --ckpt_path with a readable checkpoint"
        )
    for bad, why in skipped:
        rank_zero_warn(f"resume: skipped {bad}: it cannot be read ({why}); resuming from {chosen[0]}, the newest "
                       "readable checkpoint")
    rank_zero_info(f"resume (ckpt_path=last): resuming from {chosen[0]}, the newest readable checkpoint in "
                   f"{', '.join(places)}")
    # a relaunch into a fixed folder: Lightning's "exists and is not empty" is the checkpoint this run resumes from
    _ignore_warning(rf"Checkpoint directory {re.escape(str(Path(chosen[0]).parent))} exists and is not empty")
    return chosen[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _take_lock(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    mine = f"{socket.gethostname()} {os.getpid()}"
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            host, _, pid = lock.read_text().strip().partition(" ")
            if f"{host} {pid}" == mine:
                return  # this process again (a second fit in one session)
            if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
                lock.unlink(missing_ok=True)  # left by a run that died without cleaning up
                continue
            raise RuntimeError(
                f"checkpoint folder {folder} is in use by another run (process {pid} on host {host}, lock file "
                f"{lock}): this run would resume from and write beside its checkpoints. Wait for it to finish, give "
                "this run its own ModelCheckpoint dirpath, or delete the lock file if that run is no longer running"
            ) from None
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        atexit.register(_release_lock, lock, mine)
        return
    raise RuntimeError(f"could not take the lock {lock}: other processes keep replacing it")


def _release_lock(lock: Path, mine: str) -> None:
    try:
        if lock.read_text().strip() == mine:
            lock.unlink()
    except OSError:
        pass


def lock_checkpoint_dirs(trainer: "pl.Trainer") -> None:
    """Lock every fixed local ``ModelCheckpoint`` folder for this process (released at exit).

    Per-version folders need no lock (:func:`claim_log_version` makes them unique). Runs on the first process
    only.

    Raises:
        RuntimeError: a live process (or one on another host) holds a folder, naming it and the lock file.
    """
    if not launched_as_rank_zero():
        return
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath and _is_local(callback.dirpath):
            folder = Path(callback.dirpath)
            _take_lock(folder)
            if {p.name for p in folder.iterdir()} == {LOCK_NAME}:
                # Lightning warns at set-up that a top-k folder "exists and is not empty": here it holds only the
                # lock just taken (a first launch), which is no earlier run's checkpoint
                _ignore_warning(rf"Checkpoint directory {re.escape(str(callback.dirpath))} exists and is not empty")


def _ignore_warning(message: str) -> None:
    """Ignore, for the rest of this process (one CLI run), Lightning warnings that match ``message`` (a regex)."""
    warnings.filterwarnings("ignore", message=message)
