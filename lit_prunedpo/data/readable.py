"""Check that a local JSON / JSON-lines / CSV file can be read, row by row, before ``datasets`` parses it.

``datasets`` reports a malformed line as "An error occurred while generating the dataset" with the line
only in a chained traceback, an empty file with an empty reason, and non-UTF-8 bytes as a bare
``UnicodeDecodeError``. This module reads the file once first (one ``json.loads`` per line) and says which
line is wrong and why.

A line is unreadable when it is not UTF-8, not JSON, not a JSON object, or holds a lone UTF-16 surrogate (an
escape such as ``"\\ud800"`` that Python's ``json`` accepts and Arrow refuses). A ``.gz`` file that is not
gzip-compressed, or whose stream is damaged or cut short, stops the run under either policy, naming the file and
the last line read whole. A ``.json`` file holding one object of equally long lists (a column-oriented object) is
read as rows (:mod:`~lit_prunedpo.data.columnar`).

Under ``on_bad_row="error"`` the first unreadable line stops the run, naming the file, line and row.
Under ``"skip"`` a JSON-lines file is read from a copy (cached under the file's content digest) in which
each unreadable line is replaced by a one-field placeholder row; the pipeline turns it into a bad row of
kind ``unreadable`` (:mod:`~lit_prunedpo.data.formats`), counted like every other bad row, and the other
rows keep their numbers. A JSON array document, a column-oriented object or a CSV file cannot be cut into rows
without parsing it, so an unreadable one stops the run under either policy.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import datasets
from lightning.pytorch.utilities import rank_zero_info

from lit_prunedpo.data.columnar import rows_of_columns
from lit_prunedpo.data.formats import BAD_ROW_KINDS, ROW, UNREADABLE_COLUMN

GZIP_MAGIC = b"\x1f\x8b"
#: A JSON escape of a UTF-16 surrogate (U+D800..U+DFFF): only such a line can hold a lone one after json.loads.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class BadLine:
    """One line that cannot be read as a row."""

    line: int  # 1-based line of the file
    row: int  # 0-based row number it would have had (blank lines are not rows)
    reason: str
    field: str = ROW  # the field at fault, when one is


def _open(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _check_gzip(path: Path) -> None:
    """A ``.gz`` name on a file that is not gzip-compressed (plain text renamed, or never compressed)."""
    if not path.name.lower().endswith(".gz"):
        return
    with open(path, "rb") as f:
        start = f.read(16)
    if not start.startswith(GZIP_MAGIC):
        raise ValueError(
            f"{path}: the name ends in .gz but the file is not gzip-compressed (it starts with {start!r}); compress it "
            "(gzip FILE) or drop the .gz from its name"
        )


def _lines(path: Path) -> Iterator[bytes]:
    """The file's lines, decompressed when its name ends in ``.gz``.

    Raises:
        ValueError: the gzip stream is cut short or damaged, naming the file and the last line read whole (gzip and
            zlib name neither).
    """
    whole = 0
    try:
        with _open(path) as f:
            for raw in f:
                yield raw
                whole += 1
    except EOFError:
        raise ValueError(
            f"{path}: the gzip stream is cut short after line {whole} (the file is incomplete, e.g. an interrupted "
            "download or copy); rows past that line cannot be read, so neither policy can use it: copy or download "
            "the file again"
        ) from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise ValueError(
            f"{path}: the gzip stream is damaged after line {whole} ({err}); copy or download the file again"
        ) from None


def _head(path: Path, size: int = 1 << 16) -> bytes:
    """The first ``size`` bytes or so of the (decompressed) file, whole lines."""
    head = bytearray()
    for raw in _lines(path):
        head += raw
        if len(head) >= size:
            break
    return bytes(head)


def lone_surrogate(value: Any, field: str = "") -> tuple[str, str] | None:
    """The first string in a parsed JSON value that holds a lone surrogate: (its field path such as
    ``prompt[0].content``, the code point as ``U+XXXX``); ``None`` when there is none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return field or ROW, f"U+{ord(value[err.start]):04X}"
        return None
    if isinstance(value, dict):
        children = ((f"{field}.{key}" if field else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        children = ((f"{field}[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    for path, item in children:
        found = lone_surrogate(item, path)
        if found:
            return found
    return None


def _surrogate_reason(field: str, codepoint: str) -> str:
    escape = "\\u" + codepoint[2:].lower()
    return f"holds a lone surrogate {codepoint} ({escape}: half of a UTF-16 pair, not a character) in field {field!r}"


def line_of_row(path: Path, row: int) -> int | None:
    """The 1-based line of ``row`` (0-based, blank lines are not rows) in a JSON-lines file, for messages about a bad
    row; ``None`` for a file of another kind (a JSON array, a column-oriented object, CSV, Parquet)."""
    name = path.name.lower()
    if not name.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz")) or _head(path).lstrip().startswith(b"["):
        return None
    if _single_object(path) is not None:
        return None
    rows = 0
    for number, raw in enumerate(_lines(path), 1):
        if raw.strip():
            if rows == row:
                return number
            rows += 1
    return None


def _json_kind(value: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "null"
    )


def line_problem(raw: bytes) -> tuple[str, str] | None:
    """Why one JSON-lines line is not a row: (the field at fault, or ``<row>``; the reason), ``None`` when it is one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return ROW, f"is not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
    try:
        value = json.loads(text.strip())  # stripped: an error at the line's end then points into the line
    except json.JSONDecodeError as err:
        return ROW, f"is not valid JSON ({err.msg} at column {err.colno})"
    if not isinstance(value, dict):
        return ROW, f"is {_json_kind(value)}, not a JSON object with the pair's fields"
    if _SURROGATE_ESCAPE.search(raw):
        found = lone_surrogate(value)
        if found:
            return found[0], _surrogate_reason(*found)
    return None


def scan_json_lines(path: Path) -> tuple[int, list[BadLine]]:
    """Rows (non-blank lines) of a JSON-lines file and the lines among them that are not rows."""
    rows, bad = 0, []
    for number, raw in enumerate(_lines(path), 1):
        if not raw.strip():
            continue
        problem = line_problem(raw)
        if problem is not None:
            bad.append(BadLine(number, rows, problem[1], problem[0]))
        rows += 1
    return rows, bad


def _single_object(path: Path) -> dict | None:
    """The file parsed as one JSON object when it holds exactly one (on one line or pretty-printed over many);
    ``None`` for JSON lines. Reads past the first line only when that line is not a whole JSON value."""
    first, more = None, False
    for raw in _lines(path):
        if not raw.strip():
            continue
        if first is not None:
            more = True
            break
        first = raw
        if line_problem(raw) is not None:  # not a whole value by itself: maybe a pretty-printed object
            try:
                value = json.loads(b"".join(_lines(path)))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return None  # JSON lines with a bad first line: the line scan names it
            return value if isinstance(value, dict) else None
    if first is None or more:
        return None
    value = json.loads(first)
    return value if isinstance(value, dict) else None


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
    _check_surrogates(path, value if isinstance(value, list) else [], "of the JSON array")
    if not value:
        raise ValueError(f"{path}: the JSON array is empty (no rows)")


def _check_surrogates(path: Path, rows: list, where: str) -> None:
    for i, row in enumerate(rows):
        found = lone_surrogate(row)
        if found:
            raise ValueError(
                f"{path}: row {i} (0-based) {where}: field {found[0]!r} {BAD_ROW_KINDS['unreadable']} (kind "
                f"'unreadable'): the row {_surrogate_reason(*found)}. A whole-document JSON file cannot be read row "
                "by row, so on_bad_row='skip' cannot skip it: fix the row"
            )


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
    _check_gzip(path)
    head = _head(path)
    if not head.strip():
        raise ValueError(f"{path}: the file is empty (no rows)")
    if name.endswith(".csv"):
        _check_whole(path, b"".join(_lines(path)), "CSV file")
        return path
    if head.lstrip().startswith(b"["):
        _check_whole(path, b"".join(_lines(path)), "JSON array")
        return path
    document = _single_object(path) if head.lstrip().startswith(b"{") else None
    if document is not None:
        column_rows = rows_of_columns(path, document)
        if column_rows is not None:
            _check_surrogates(path, column_rows, "of the column-oriented object")
            rank_zero_info(f"{path}: one JSON object of {len(document)} columns, read as {len(column_rows)} rows")
            return _write_rows(path, column_rows, digest)
    rows, bad = scan_json_lines(path)
    if not bad:
        return path
    first = bad[0]
    where = (f"{path}: row {first.row} (0-based): field {first.field!r} {BAD_ROW_KINDS['unreadable']} (kind "
             f"'unreadable'): line {first.line} {first.reason}")
    if on_bad_row != "skip":
        more = f"; {len(bad) - 1} more unreadable lines follow" if len(bad) > 1 else ""
        raise ValueError(
            f"{where}{more}. Fix the file, or pass on_bad_row='skip' (--data.init_args.on_bad_row skip) to skip "
            "unreadable rows (they are counted in stats)"
        )
    if len(bad) == rows:
        raise ValueError(f"{where}, and so is every other line: no row of the file can be read")
    return _write_placeholders(path, bad, digest)


def _copy_path(digest: str, kind: str) -> Path:
    """Where a readable copy of the file with content ``digest`` lives (keyed by content: same bytes, same copy)."""
    return Path(datasets.config.HF_DATASETS_CACHE) / "lit_prunedpo" / "readable" / f"{digest}{kind}.jsonl"


def _write_lines(out: Path, lines: Iterator[bytes]) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as dst:
        for raw in lines:
            dst.write(raw if raw.endswith(b"\n") else raw + b"\n")
    os.replace(tmp, out)
    return out


def _write_placeholders(path: Path, bad: list[BadLine], digest: str) -> Path:
    out = _copy_path(digest, "")
    if out.exists():
        return out
    reasons = {b.line: b.reason for b in bad}

    def lines() -> Iterator[bytes]:
        for number, raw in enumerate(_lines(path), 1):
            if number in reasons:
                placeholder = {UNREADABLE_COLUMN: f"line {number} of {path.name} {reasons[number]}"}
                raw = (json.dumps(placeholder) + "\n").encode()
            yield raw

    return _write_lines(out, lines())


def _write_rows(path: Path, rows: list[dict], digest: str) -> Path:
    out = _copy_path(digest, ".rows")
    if out.exists():
        return out
    return _write_lines(out, ((json.dumps(row, ensure_ascii=False) + "\n").encode() for row in rows))
