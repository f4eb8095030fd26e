"""Run outputs that are never torn or shared: atomic checkpoint files, a log version per run, a resume that
skips unreadable checkpoints and says so.

* :class:`AtomicCheckpointIO` writes to a temporary name in the same folder and renames it into place
  (``os.replace``, atomic on POSIX): a full disk or a killed process leaves no file (or a stray temporary
  one), never a truncated ``last.ckpt`` under the name a resume looks for. It sits under every
  ``trainer.save_checkpoint`` (``ModelCheckpoint``, the preemption checkpoint, a final save), and loads like
  :class:`~lit_prunedpo.distributed.VerifiedCheckpointIO` (errors name the file).
* :func:`claim_log_version` gives each run its own ``version_N`` folder: Lightning picks the next free number
  by listing the folder, so two runs started together both picked ``version_0`` (one ``metrics.csv``
  interleaved, one ``config.yaml``, one checkpoint folder). Here rank 0 creates the folder with
  ``os.mkdir`` (which fails if it exists) and takes the next number when another run was first.
* :func:`lock_checkpoint_dirs` takes a lock file in each fixed ``ModelCheckpoint`` folder (``dirpath``, e.g.
  the DDP/FSDP configs'): a second run started on that folder while the first one lives is refused, instead
  of resuming from the other run's ``last.ckpt`` and writing beside it. A lock left by a dead process on this
  host is taken over.
* :func:`resolve_resume` turns ``ckpt_path="last"`` (also Lightning's implicit one when an
  ``OnExceptionCheckpoint`` is configured) into the newest candidate that is a readable checkpoint (a file
  whose archive is whole, or a folder of shards holding the files a complete save writes last), names every
  newer one it skipped and every leftover temporary of an interrupted save; when none is readable it refuses
  instead of starting afresh.

* :class:`SaveRunConfig` (the CLI's config callback) gives a run without a logger its own config file.

:class:`~lit_prunedpo.cli.PrunedDPOCLI` applies all of them. With a plain ``Trainer``, ``PrunedDPO`` puts
:class:`AtomicCheckpointIO` in place itself when it saves (a ``CheckpointIO`` you chose is kept) and
:class:`~lit_prunedpo.distributed.FSDP2Strategy` writes its folders of shards atomically; call the functions
yourself for the rest.
"""

from __future__ import annotations

import atexit
import os
import socket
import zipfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_prunedpo.distributed import VerifiedCheckpointIO

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
        finally:
            if tmp.exists():
                tmp.unlink()


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


def claim_log_version(trainer: "pl.Trainer") -> None:
    """Give each of the trainer's versioned loggers (CSV, TensorBoard) a ``version_N`` folder no other run has.

    Only a logger whose version was left to Lightning is changed; an explicit ``version`` is the user's choice
    (e.g. a requeued job resuming into its own folder). Runs on the first process only: the others never
    write logs, and Lightning broadcasts rank 0's folders to them.
    """
    if not launched_as_rank_zero():
        return
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


class SaveRunConfig(SaveConfigCallback):
    """Lightning's ``SaveConfigCallback``, except that a run without a logger never overwrites another run's
    config file.

    Without a logger the config goes to ``default_root_dir``, which every such run there shares (there is no
    ``version_N`` to claim); with ``overwrite`` the second run replaced the first one's ``config.yaml``. Here
    the first process claims the first free name of ``config.yaml``, ``config-1.yaml``, ... (``O_EXCL``: two
    runs started together cannot both take one) and logs which.
    """

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if not self.already_saved and self.save_to_log_dir and not trainer.loggers and trainer.is_global_zero:
            folder = Path(trainer.log_dir)
            if _is_local(folder):
                wanted, self.config_filename = self.config_filename, _claim_file(folder, Path(self.config_filename))
                if self.config_filename != wanted:
                    rank_zero_info(f"{folder / wanted} belongs to another run (logger: false): this run's config is "
                                   f"{folder / self.config_filename}")
        super().setup(trainer, pl_module, stage)


def _claim_file(folder: Path, name: Path) -> str:
    """Create the first of ``name``, ``STEM-1SUFFIX``, ... that does not exist in ``folder``; its name."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        candidate = name.name if n == 0 else f"{name.stem}-{n}{name.suffix}"
        try:
            os.close(os.open(folder / candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return candidate
        except FileExistsError:
            n += 1


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a readable checkpoint (``None`` when it is): a truncated or corrupt archive, or a
    torn folder of shards.

    A file: checks the zip archive ``torch.save`` writes (its directory and every member's CRC) without
    unpickling it. A folder (a distributed checkpoint): checks that both files written last by a complete save
    are there, ``torch.distributed.checkpoint``'s ``.metadata`` and Lightning's ``meta.pt`` (itself an archive).
    A non-empty folder with neither of them and no ``.distcp`` shard is another format, accepted as is.
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
        return None if problem is None else f"{LIGHTNING_METADATA}: {problem}"
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


def _last_candidates(trainer: "pl.Trainer") -> set[str]:
    """What Lightning considers for ``ckpt_path="last"``: ``OnExceptionCheckpoint`` files and every
    ``ModelCheckpoint``'s ``last*.ckpt``."""
    candidates: set[str] = set()
    for callback in trainer.callbacks:
        if isinstance(callback, OnExceptionCheckpoint):
            path = getattr(callback, "ckpt_path", None)
            if not path:  # a folder resolved at set-up (PreemptionCheckpoint): the default one
                path = Path(trainer.default_root_dir) / "checkpoints" / f"{callback.filename}.ckpt"
            candidates.add(os.path.normpath(path))
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            candidates |= callback._find_last_checkpoints(trainer)
    # Absolute, so that one file reached by two routes (a relative dirpath, a listing) is one candidate.
    return {os.path.abspath(c) for c in candidates if Path(c).exists()}


def _leftover_temporaries(trainer: "pl.Trainer") -> list[str]:
    """Temporary files and folders of interrupted saves (``AtomicCheckpointIO``'s ``.NAME.PID.tmp``,
    ``FSDP2Strategy``'s ``.NAME.tmp`` and ``.NAME.old``) in the folders resume looks in."""
    folders = {Path(c).parent for c in _last_candidates(trainer)}
    for callback in trainer.checkpoint_callbacks:
        dirpath = getattr(callback, "dirpath", None)
        if isinstance(callback, ModelCheckpoint) and dirpath and _is_local(dirpath):
            folders.add(Path(dirpath))
    return sorted(
        str(p) for folder in folders if folder.is_dir() for p in folder.iterdir()
        if p.name.startswith(".") and p.name.endswith((".tmp", ".old"))
    )


def resolve_resume(trainer: "pl.Trainer", ckpt_path: str | None) -> str | None:
    """The checkpoint a ``fit`` with ``ckpt_path`` resumes from: ``"last"`` (or ``None`` with an
    ``OnExceptionCheckpoint``, as Lightning does) becomes the newest readable candidate; anything else is
    returned unchanged.

    Raises:
        ValueError: there are candidates but none is readable (each named with its problem).
    """
    if ckpt_path is None and any(isinstance(cb, OnExceptionCheckpoint) for cb in trainer.callbacks):
        ckpt_path = "last"
    if ckpt_path != "last":
        return ckpt_path
    candidates = sorted(_last_candidates(trainer), key=lambda p: os.path.getmtime(p), reverse=True)
    for leftover in _leftover_temporaries(trainer):
        rank_zero_warn(f"resume: ignored {leftover}: the temporary output of a checkpoint save that was interrupted "
                       "(never resumed from; the next save replaces it)")
    if not candidates:
        return "last"  # Lightning warns that there is nothing to resume and starts afresh (a first launch)
    skipped = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            for bad, why in skipped:
                rank_zero_warn(f"resume: skipped {bad}: it cannot be read ({why}); resuming from {path}, the newest "
                               "readable checkpoint")
            return path
        skipped.append((path, problem))
    raise ValueError(
        "resume (ckpt_path=last): no checkpoint can be read: "
        + "; ".join(f"{p}: {why}" for p, why in skipped)
        + ". Delete them to start afresh, or pass --ckpt_path with a readable checkpoint"
    )


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
            _take_lock(Path(callback.dirpath))
