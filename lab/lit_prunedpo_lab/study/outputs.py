"""The study's and the map's output folders: one run at a time, files written whole, errors of one line.

* **A lock per folder** (:func:`folder_lock`): ``<out>/.lock``, held with ``flock(LOCK_EX | LOCK_NB)`` for the
  whole run and holding its process id. A second run into the folder is refused, naming the folder and that
  process (:class:`FolderInUse`); the kernel drops the lock when its process ends, however it ends, so a killed
  run leaves nothing stale (the file stays; it locks nothing by itself).
* **Whole files** (:func:`write_atomic`, :func:`atomic_path`): written under a temporary name beside the target,
  then renamed over it, so a report or record is either the old one, the new one, or absent; never cut off by a
  kill or a full disk, so ``--resume`` can trust any file it finds.
* **Appended lines** (:func:`append_line`): a line that cannot be written whole (disk full) is cut back off the
  file; a line cut off by a kill is found on resume (:func:`drop_cut_off_tail`) and skipped by
  :func:`read_journal`.
* **Errors**: :class:`OutputError` (an ``OSError``) says which file could not be written and why, ``the disk is
  full`` for ``ENOSPC``; :class:`Refused` is a folder the run will not use as asked (in use, an earlier run's
  outputs, a corrupt record: :func:`read_json`). Both print as one line; the commands exit 1 on the first (the
  run started) and 2 on the second (nothing ran).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any, Iterator, Sequence

from lit_prunedpo.full_disk import describe_full, disk_full_errno

LOCK_NAME = ".lock"


class Refused(Exception):
    """The run will not use its output folder as asked; the message is one line saying what to do. Exit status 2."""

    status = 2


class FolderInUse(Refused):
    """Another running process holds the folder's lock."""


class OutputError(OSError):
    """An output file that could not be written whole: ``str()`` names the file and the cause. Exit status 1.

    Built as ``OutputError(errno, message)`` (:meth:`of`), so it pickles like any ``OSError`` (a map's worker
    process raises it to the parent)."""

    status = 1

    def __str__(self) -> str:
        return str(self.strerror)

    @classmethod
    def of(cls, path: Path | str, exc: OSError) -> "OutputError":
        if isinstance(exc, OutputError):
            return exc
        code = disk_full_errno(exc)  # the wording every writer of the package uses (lit_prunedpo.full_disk)
        why = describe_full(code) if code is not None else (exc.strerror or str(exc))
        return cls(code if code is not None else exc.errno, f"cannot write {path}: {why}")


@contextlib.contextmanager
def folder_lock(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder``'s lock (``<folder>/.lock``) for the block; ``what`` names the run in the refusal ("study").

    Raises:
        FolderInUse: another process holds it: naming the folder, that process and what to do.
        OutputError: the lock file cannot be created.
    """
    path = Path(folder) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError.of(path, exc) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").split()
            who = (f"process {holder[0]} on host {holder[1]}" if len(holder) == 2
                   else "a process that has not written its id")
            raise FolderInUse(f"--out {folder} is in use by another running {what} ({who}; lock file {path}): "
                              "wait for it to finish, or choose another --out") from None
        with contextlib.suppress(OSError):  # only names us to a refused run: a full disk is reported by a real file
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def claim_folder(folder: Path, what: str, files: Sequence[str], held: contextlib.ExitStack) -> list[str]:
    """Take ``folder``'s lock for this run (:func:`folder_lock`, held by ``held``) and return which of an earlier
    run's ``files`` are there: the caller refuses, resumes or replaces them.

    Raises:
        FolderInUse: another process holds the folder.
    """
    held.enter_context(folder_lock(folder, what))
    return [name for name in files if (folder / name).exists()]


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write (same suffix, for writers that go by it: ``savefig``), renamed over
    ``path`` when the block ends; on any error it is removed and ``path`` is left as it was.

    Raises:
        OutputError: naming ``path``, on an ``OSError`` in the block or the rename (a full disk included).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError.of(path, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole (:func:`atomic_path`), synced to disk before the rename; returns ``path``."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (a newline added) to ``path`` and sync it; a line that cannot be written whole is cut back
    off, so the file never ends in half a record.

    Raises:
        OutputError: naming ``path`` (``disk full`` for ENOSPC).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError.of(path, exc) from exc
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            _write_all(fd, (line + "\n").encode())
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):  # truncating frees blocks, so it works on a full disk too
                os.ftruncate(fd, start)
            raise OutputError.of(path, exc) from exc
    finally:
        os.close(fd)


def drop_cut_off_tail(path: Path) -> int:
    """Remove an unfinished last line from ``path`` (a run killed while appending it); returns the bytes removed."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return 0
    if not data or data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1
    try:
        os.truncate(path, keep)
    except OSError as exc:
        raise OutputError.of(path, exc) from exc
    return len(data) - keep


def read_journal(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of a ``progress.jsonl`` and how many of its lines are not whole JSON objects (skipped)."""
    records, bad = [], 0
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return [], 0
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            bad += 1
    return records, bad


def read_json(path: Path, remedy: str) -> Any:
    """``path``'s JSON.

    Raises:
        Refused: naming ``path``, when it cannot be read or is not valid JSON; ``remedy`` says what to do.
    """
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"not valid JSON: {exc}"
        raise Refused(f"{path} is corrupt or unreadable ({why}); {remedy}") from None
