"""Check that a local JSON / JSON-lines / CSV file can be read, row by row, before ``datasets`` parses it.

``datasets`` reports a malformed line as "An error occurred while generating the dataset" with the line
only in a chained traceback, an empty file with an empty reason, and non-UTF-8 bytes as a bare
``UnicodeDecodeError``. This module reads the file once first (one ``json.loads`` per line) and says which
line is wrong and why.

Under ``on_bad_row="error"`` the first unreadable line stops the run, naming the file, line and row.
Under ``"skip"`` a JSON-lines file is read from a copy (cached under the file's content digest) in which
each unreadable line is replaced by a one-field placeholder row; the pipeline turns it into a bad row of
kind ``unreadable`` (:mod:`~lit_prunedpo.data.formats`), counted like every other bad row, and the other
rows keep their numbers. A JSON array document or a CSV file cannot be cut into rows without parsing it,
so an unreadable one stops the run under either policy.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import datasets

from lit_prunedpo.data.formats import BAD_ROW_KINDS, ROW, UNREADABLE_COLUMN


@dataclass(frozen=True)
class BadLine:
    """One line that cannot be read as a row."""

    line: int  # 1-based line of the file
    row: int  # 0-based row number it would have had (blank lines are not rows)
    reason: str


def _open(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _json_kind(value: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "null"
    )


def line_problem(raw: bytes) -> str | None:
    """Why one JSON-lines line is not a row (``None`` when it is one)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"is not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
    try:
        value = json.loads(text.strip())  # stripped: an error at the line's end then points into the line
    except json.JSONDecodeError as err:
        return f"is not valid JSON ({err.msg} at column {err.colno})"
    if not isinstance(value, dict):
        return f"is {_json_kind(value)}, not a JSON object with the pair's fields"
    return None


def scan_json_lines(path: Path) -> tuple[int, list[BadLine]]:
    """Rows (non-blank lines) of a JSON-lines file and the lines among them that are not rows."""
    rows, bad = 0, []
    with _open(path) as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            reason = line_problem(raw)
            if reason is not None:
                bad.append(BadLine(number, rows, reason))
            rows += 1
    return rows, bad


def _utf8_line_of(data: bytes, err: UnicodeDecodeError) -> str:
    line = data.count(b"\n", 0, err.start) + 1
    column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
    return f"line {line} is not UTF-8 (byte 0x{data[err.start]:02x} at column {column})"


def _check_whole(path: Path, data: bytes, kind: str) -> None:
    """A JSON array document or a CSV: readable as a whole, or an error naming the line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: {_utf8_line_of(data, err)}. A {kind} cannot be read row by row, so on_bad_row='skip' cannot "
            "skip it: fix the file's encoding (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    if kind != "JSON array":
        return
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    for i, row in enumerate(value if isinstance(value, list) else []):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i} (0-based) of the JSON array is {_json_kind(row)}, not an object")
    if not value:
        raise ValueError(f"{path}: the JSON array is empty (no rows)")


def readable_copy(path: Path, on_bad_row: str, digest: str) -> Path:
    """The file ``datasets`` should read in place of ``path``: ``path`` itself, or under ``skip`` a copy of a
    JSON-lines file whose unreadable lines are placeholders.

    Args:
        path: a local ``.json``, ``.jsonl``, ``.json(l).gz`` or ``.csv`` file (other types are returned as is).
        on_bad_row: ``"error"`` or ``"skip"``.
        digest: the file's content digest (names the cached copy).

    Raises:
        ValueError: the file is empty, or holds an unreadable line under ``on_bad_row="error"`` (or in a
            JSON array or CSV file), naming the file, line and row.
    """
    name = path.name.lower()
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty (no rows)")
    if name.endswith(".parquet"):
        return path  # binary, with its own checksums: Arrow's errors name the file
    with _open(path) as f:
        head = f.read(1 << 16)
    if not head.strip():
        raise ValueError(f"{path}: the file is empty (no rows)")
    if name.endswith(".csv"):
        with _open(path) as f:
            _check_whole(path, f.read(), "CSV file")
        return path
    if head.lstrip().startswith(b"["):
        with _open(path) as f:
            _check_whole(path, f.read(), "JSON array")
        return path
    rows, bad = scan_json_lines(path)
    if not bad:
        return path
    first = bad[0]
    where = (f"{path}: row {first.row} (0-based): field {ROW!r} {BAD_ROW_KINDS['unreadable']} (kind 'unreadable'): "
             f"line {first.line} {first.reason}")
    if on_bad_row != "skip":
        more = f"; {len(bad) - 1} more unreadable lines follow" if len(bad) > 1 else ""
        raise ValueError(
            f"{where}{more}. Fix the file, or pass on_bad_row='skip' to skip unreadable rows (they are counted in "
            "stats)"
        )
    if len(bad) == rows:
        raise ValueError(f"{where}, and so is every other line: no row of the file can be read")
    return _write_placeholders(path, bad, digest)


def _write_placeholders(path: Path, bad: list[BadLine], digest: str) -> Path:
    out = Path(datasets.config.HF_DATASETS_CACHE) / "lit_prunedpo" / "readable" / f"{digest}.jsonl"
    if out.exists():
        return out  # keyed by content: the same bytes give the same copy
    out.parent.mkdir(parents=True, exist_ok=True)
    reasons = {b.line: b.reason for b in bad}
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    with _open(path) as src, open(tmp, "wb") as dst:
        for number, raw in enumerate(src, 1):
            if number in reasons:
                placeholder = {UNREADABLE_COLUMN: f"line {number} of {path.name} {reasons[number]}"}
                raw = (json.dumps(placeholder) + "\n").encode()
            dst.write(raw if raw.endswith(b"\n") else raw + b"\n")
    os.replace(tmp, out)
    return out
