"""One run at a time in a fixed checkpoint folder: :func:`lock_checkpoint_dirs` takes a lock file in each
``ModelCheckpoint`` folder the user named (``dirpath``, e.g. the DDP/FSDP configs'). A second run started on that
folder while the first one lives is refused, instead of resuming from the other run's ``last.ckpt`` and writing
beside it. A lock left by a dead process on this host is taken over.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from lightning.pytorch.callbacks import ModelCheckpoint

from lit_prunedpo.checkpoint.claims import ignore_warning, launched_as_rank_zero
from lit_prunedpo.checkpoint.io import is_local

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: The lock file in a locked folder; it holds the host name and process id of the run that took it.
LOCK_NAME = ".lit_prunedpo.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def take_lock(folder: Path) -> None:
    """Lock ``folder`` (made if missing) for this process until it exits; a lock of a dead process on this host is
    taken over.

    Raises:
        RuntimeError: a live process (or one on another host) holds it, naming it and the lock file.
    """
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
        if isinstance(callback, ModelCheckpoint) and callback.dirpath and is_local(callback.dirpath):
            folder = Path(callback.dirpath)
            take_lock(folder)
            if {p.name for p in folder.iterdir()} == {LOCK_NAME}:
                # Lightning warns at set-up that a top-k folder "exists and is not empty": here it holds only the
                # lock just taken (a first launch), which is no earlier run's checkpoint
                ignore_warning(rf"Checkpoint directory {re.escape(str(callback.dirpath))} exists and is not empty")
