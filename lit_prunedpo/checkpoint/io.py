"""How checkpoint files and folders are written and read: never torn under the name a resume looks for, and a
load that fails names the file.

* :class:`VerifiedCheckpointIO`: Lightning's ``TorchCheckpointIO`` whose load errors name the checkpoint.
* :class:`AtomicCheckpointIO` writes to a temporary name in the same folder and renames it into place
  (``os.replace``, atomic on POSIX): a full disk or a killed process leaves no file (or a stray temporary
  one), never a truncated ``last.ckpt``. It sits under every ``trainer.save_checkpoint`` (``ModelCheckpoint``,
  the preemption checkpoint, a final save); :func:`install_atomic_io` puts it in place.
* :func:`sharded_save_names` and :func:`replace_folder`: the same for a folder of shards
  (:class:`~lit_prunedpo.distributed.FSDP2Strategy` writes into a temporary sibling folder and renames it).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from lit_prunedpo.full_disk import DiskFull, describe_full, disk_full_errno

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: Free bytes under which a failed write is taken for a full disk: torch's writer reports one as "unexpected pos"
#: or "file write failed", without an errno.
FULL_BELOW_BYTES = 1 << 20


class VerifiedCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose load errors name the checkpoint (plain ``torch.load`` errors on a truncated
    file do not). Use with single-device and DDP strategies:
    ``--trainer.plugins+=lit_prunedpo.checkpoint.VerifiedCheckpointIO``."""

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if not Path(path).exists():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        try:
            kwargs = {} if map_location is None else {"map_location": map_location}
            return super().load_checkpoint(path, weights_only=weights_only, **kwargs)
        except Exception as err:
            raise RuntimeError(f"cannot load checkpoint {path} (truncated or corrupt?): {err}") from err


class AtomicCheckpointIO(VerifiedCheckpointIO):
    """``TorchCheckpointIO`` that writes ``path`` under a temporary name first and renames it into place, and
    whose load errors name the file.

    Remote file systems (``s3://``...) are written as by ``TorchCheckpointIO``: a rename there is a copy.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if not is_local(path):
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


def _full_now(folder: Path) -> int | None:
    """``errno.ENOSPC`` when the file system of ``folder`` has (almost) no space left, else ``None``."""
    try:
        return errno.ENOSPC if shutil.disk_usage(folder).free < FULL_BELOW_BYTES else None
    except OSError:
        return None


def is_local(path: Any) -> bool:
    """Whether ``path`` is on a local file system (no ``s3://``-like scheme): only there are renames atomic and
    folders listed."""
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


def sharded_save_names(path: Path) -> tuple[Path, Path]:
    """The temporary folder a sharded save of ``path`` writes into, and the name the folder it replaces is moved
    to meanwhile. Dot names: ``ModelCheckpoint`` never takes them for checkpoints of its own."""
    return path.with_name(f".{path.name}.tmp"), path.with_name(f".{path.name}.old")


def replace_folder(new: Path, path: Path, old: Path) -> None:
    """Rename ``new`` to ``path``, replacing what is there (a folder or a file). ``os.replace`` cannot replace a
    non-empty folder, so the current one is first renamed to ``old``, then deleted once ``new`` is in place: at
    every instant ``path`` is either the previous checkpoint or the new one, or (between the two renames) absent
    with both whole under their temporary names."""
    remove(old)
    if path.exists():
        os.replace(path, old)
    os.replace(new, path)
    remove(old)


def remove(path: Path) -> None:
    """Delete ``path``, a folder (with what it holds) or a file, if it exists."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
