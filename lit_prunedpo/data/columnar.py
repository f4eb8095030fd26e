"""A ``.json`` file holding one object of columns (``{"prompt": [...], "chosen": [...], ...}``), read as rows.

``json.dump(dataset.to_dict(), f)`` and pandas' ``DataFrame.to_dict(orient="list")`` write this layout. ``datasets``
reads such a file as a single row whose fields are lists (its ``field=`` option needs the columns under a key), which
the pipeline would take for one conversational row. Row ``i`` here is the ``i``-th value of every column.

The layout is told from a single row without guessing: every value is a list and no list holds an object, whereas
a row's fields are strings, or lists of ``{"role", "content"}`` objects. pandas' default ``DataFrame.to_json()``
(``orient="columns"``: each column an object keyed by row label) is refused with the way to write a readable file,
since its row labels need not be 0, 1, 2, ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ACCEPTED = (
    "JSON lines (one object per line, e.g. Dataset.to_json or DataFrame.to_json(orient='records', lines=True)), a JSON "
    "array of row objects, or one object of equally long lists (json.dump(Dataset.to_dict()), "
    "DataFrame.to_dict(orient='list'))"
)


def _is_row_labelled(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(k, str) and k.isdigit() for k in value)


def rows_of_columns(path: Path, document: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The rows of a column-oriented JSON object; ``None`` when ``document`` is a single row instead.

    Raises:
        ValueError: the columns differ in length or hold no rows, or ``document`` is pandas' ``orient="columns"``
            layout; the message says what the file holds and which layouts are read.
    """
    values = list(document.values())
    if values and all(_is_row_labelled(v) for v in values):
        raise ValueError(
            f"{path}: one JSON object of {len(values)} columns, each an object keyed by row label (pandas' "
            "DataFrame.to_json() default, orient='columns'), which is not read; write it as "
            f"DataFrame.to_json(PATH, orient='records', lines=True). Read layouts: {ACCEPTED}"
        )
    if not values or not all(isinstance(v, list) for v in values):
        return None
    if any(isinstance(item, dict) for v in values for item in v):
        return None  # a conversational row: its lists hold messages
    lengths = {name: len(v) for name, v in document.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"{path}: one JSON object of columns (one list per column), but the columns differ in length: {lengths}; "
            "each column must hold one value per row"
        )
    if not next(iter(lengths.values())):
        raise ValueError(f"{path}: one JSON object of columns (one list per column), every list empty: no rows")
    names = list(document)
    return [dict(zip(names, row)) for row in zip(*values)]
