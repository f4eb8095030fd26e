"""A .json file holding one object of columns is read as rows (lit_prunedpo.data.columnar), or refused naming its
layout; a single row is never taken for columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_prunedpo.data.columnar import rows_of_columns
from lit_prunedpo.data.preference import PreferenceDataModule

from .pairs_factory import SIMPLE_TEMPLATE, conversational_rows, explicit_rows


def _setup(path: Path, **kwargs) -> PreferenceDataModule:
    dm = PreferenceDataModule(str(path), tokenizer="byt5", batch_size=4, val_fraction=0.2, **kwargs)
    dm.setup("fit")
    return dm


def _columns(rows: list[dict]) -> dict[str, list]:
    return {name: [r[name] for r in rows] for name in rows[0]}


def _texts(dm: PreferenceDataModule) -> dict[int, str]:
    """Each pair's decoded chosen response, by its index (row number)."""
    out = {}
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        for batch in loader:
            for i, index in enumerate(batch.index.tolist()):
                ids = batch.response_ids[i, 0][batch.response_mask[i, 0]]
                out[index] = dm.tokenizer.decode(ids.tolist(), skip_special_tokens=True)
    return out


@pytest.mark.parametrize("indent", [None, 2], ids=["one-line", "pretty-printed"])
def test_object_of_columns_is_read_row_by_row(tmp_path: Path, indent: int | None) -> None:
    # Before: one row of lists, reported as "conversational ... without a chat template" (or without a prompt).
    rows = explicit_rows(20)
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(_columns(rows), indent=indent))
    dm = _setup(path)
    assert dm.stats["format"] == "explicit"
    assert dm.stats["train"]["rows"] + dm.stats["val"]["rows"] == 20
    assert _texts(dm) == {i: r["chosen"] for i, r in enumerate(rows)}


def test_object_of_conversational_columns_is_read(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(_columns(conversational_rows(10))))
    dm = _setup(path, chat_template=SIMPLE_TEMPLATE)
    assert dm.stats["format"] == "conversational" and dm.stats["train"]["pairs"] + dm.stats["val"]["pairs"] == 10


def test_bad_value_in_a_column_is_the_bad_row_of_its_position(tmp_path: Path) -> None:
    columns = _columns(explicit_rows(20))
    columns["chosen"][3] = None
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(columns))
    with pytest.raises(ValueError, match=rf"^{path}: row 3 \(0-based\): field 'chosen' is missing"):
        _setup(path)
    dm = _setup(path, on_bad_row="skip")
    assert dm.stats["train"]["bad_rows"]["missing"] + dm.stats["val"]["bad_rows"]["missing"] == 1


def test_columns_of_different_lengths_are_refused(tmp_path: Path) -> None:
    columns = _columns(explicit_rows(6))
    columns["rejected"].pop()
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(columns))
    with pytest.raises(ValueError, match=rf"^{path}: one JSON object of columns \(one list per column\), but the "
                                         r"columns differ in length: \{'prompt': 6, 'chosen': 6, 'rejected': 5\}"):
        _setup(path)


def test_pandas_orient_columns_is_refused_with_the_layouts_read(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    path = tmp_path / "pairs.json"
    pandas.DataFrame(explicit_rows(6)).to_json(path)  # default orient="columns": {"prompt": {"0": ..., "1": ...}}
    with pytest.raises(ValueError, match=rf"^{path}: one JSON object of 3 columns, each an object keyed by row label "
                                         r"\(pandas' DataFrame.to_json\(\) default, orient='columns'\), which is not "
                                         r"read; write it as DataFrame.to_json\(PATH, orient='records', lines=True\)\. "
                                         r"Read layouts: JSON lines .*, a JSON array of row objects, or one object of "
                                         r"equally long lists .*$"):
        _setup(path)


def test_a_single_row_is_not_taken_for_columns() -> None:
    row = conversational_rows(1)[0]  # lists of the same length, holding messages
    assert rows_of_columns(Path("x.json"), row) is None
    assert rows_of_columns(Path("x.json"), explicit_rows(1)[0]) is None
    assert rows_of_columns(Path("x.json"), {"prompt": ["a", "b"], "chosen": ["c", "d"]}) == [
        {"prompt": "a", "chosen": "c"}, {"prompt": "b", "chosen": "d"}]
