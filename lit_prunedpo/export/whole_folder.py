"""A folder written whole or not at all: built as a sibling, renamed into place, its marker file last.

``lit-prunedpo export`` writes into ``<out>.partial-<pid>`` (:func:`lit_prunedpo.full_disk.partial_path`) and
calls :func:`move_into_place` once everything is there. :class:`WriteTracker` remembers which file a failed
write was on, for the message of a full disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

__all__ = ["WriteTracker", "move_into_place", "remove"]

#: Written last into an export: a folder without it is no finished export.
MARKER = "lit_prunedpo_export.json"


class WriteTracker:
    """Which file an export was writing when it failed, for the message of a full disk: the file the failing
    call named, else the newest file it created, else the step's main file (safetensors removes the file it could
    not finish, and its error names none)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.failed = Path(".")  # relative to the folder; "." before the first step

    def _files(self) -> set[Path]:
        return {p for p in self.folder.rglob("*") if p.is_file()} if self.folder.is_dir() else set()

    @contextlib.contextmanager
    def step(self, main: str) -> Iterator[None]:
        before = self._files()
        try:
            yield
        except BaseException as err:
            self.failed = self._failed_file(err, Path(main), before)
            raise

    def _failed_file(self, err: BaseException, main: Path, before: set[Path]) -> Path:
        named = getattr(err, "filename", None)
        if isinstance(named, str) and Path(named).is_relative_to(self.folder):
            return Path(named).relative_to(self.folder)
        if "serializ" not in str(err):  # safetensors' "Error while serializing": its own file, now gone
            new = [p for p in self._files() - before if p.exists()]
            if new:
                return max(new, key=lambda p: p.stat().st_mtime_ns).relative_to(self.folder)
        return main


def move_into_place(partial: Path, out_dir: Path) -> None:
    """Put a finished export (``partial``, its marker included) at ``out_dir`` by renames only (no data is written).

    Where ``out_dir`` does not exist this is one rename: ``out_dir`` is absent or whole. Into an existing folder (an
    earlier export, or a folder of the user's) the marker is taken out first, the files an earlier export listed that
    this one does not write are removed, each entry is renamed over its namesake and the marker put in last: a
    folder without the marker is no finished export."""
    if not out_dir.exists():
        os.replace(partial, out_dir)
        return
    marker = out_dir / MARKER
    earlier = _listed_files(marker)
    marker.unlink(missing_ok=True)
    names = {entry.name for entry in partial.iterdir()}
    for name in sorted(earlier - names):
        remove(out_dir / name)
    for entry in sorted(partial.iterdir()):
        if entry.name == MARKER:
            continue
        target = out_dir / entry.name
        if target.is_dir() or entry.is_dir():
            remove(target)  # os.replace replaces a file, never a folder (nor a file by a folder)
        os.replace(entry, target)
    os.replace(partial / MARKER, marker)
    partial.rmdir()


def _listed_files(marker: Path) -> set[str]:
    """The entries an earlier export's marker lists (plain names only: nothing outside its folder is touched)."""
    try:
        files = json.loads(marker.read_text()).get("files") or []
    except (OSError, ValueError, AttributeError):
        return set()
    return {f for f in files if isinstance(f, str) and f not in ("", ".", "..") and "/" not in f and os.sep not in f}


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
