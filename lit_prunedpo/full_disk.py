"""A full disk, said as such: which writes failed for lack of space, and the one-line error that names the file.

``ENOSPC`` (no space left) and ``EFBIG`` (a file too large for its file system) are the two; the Rust writers of
safetensors and tokenizers raise errors without an ``errno`` (``os error 28``), recognised by their text. Writers
that must never leave half a file (the reference cache, ``lit-prunedpo export``, the study's outputs) write into
:func:`partial_path` beside the target and rename it into place once complete, and turn a full disk into
:class:`DiskFull`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["DiskFull", "describe_full", "disk_full_errno", "partial_path"]


class DiskFull(OSError):
    """A write failed because the disk is full (``ENOSPC``) or the file is too large for its file system (``EFBIG``);
    the message (one line) names the file and what to do, ``errno`` is the code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)  # one argument: str() is the message alone, not "[Errno 28] ..."
        self.errno = code


# How writers without an errno (safetensors' and tokenizers' Rust I/O errors, "os error 28") say the same.
_FULL_TEXTS = {errno.ENOSPC: ("No space left on device", "os error 28"), errno.EFBIG: ("File too large", "os error 27")}


def disk_full_errno(err: BaseException | None) -> int | None:
    """``errno.ENOSPC`` or ``errno.EFBIG`` when ``err`` (or an exception it was raised from) says the disk is full or
    the file too large, else ``None``."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL_TEXTS:
            return err.errno
        for code, texts in _FULL_TEXTS.items():
            if any(text in str(err) for text in texts):
                return code
        err = err.__cause__ or err.__context__
    return None


def describe_full(code: int) -> str:
    """``disk full (ENOSPC: No space left on device)``, or the same for ``EFBIG``, for messages."""
    what = "disk full" if code == errno.ENOSPC else "file too large for its file system"
    return f"{what} ({errno.errorcode[code]}: {os.strerror(code)})"


def partial_path(path: Path) -> Path:
    """The temporary sibling a file is written to before it is renamed into place: ``<path>.partial-<pid>``."""
    return path.with_name(f"{path.name}.partial-{os.getpid()}")
