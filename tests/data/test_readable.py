"""Files that ``datasets`` cannot parse fail with one message naming the file, line and row (lit_prunedpo.data.readable),
and a tokenizer that cannot be loaded names the argument (lit_prunedpo.data.tokenize)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from lit_prunedpo.data.preference import PreferenceDataModule
from lit_prunedpo.data.tokenize import load_tokenizer

from .pairs_factory import explicit_rows, write_rows

GOOD = b'{"prompt": "p", "chosen": "c", "rejected": "r"}\n'


def _setup(path: Path, **kwargs) -> PreferenceDataModule:
    dm = PreferenceDataModule(str(path), tokenizer="byt5", batch_size=2, **kwargs)
    dm.setup("fit")
    return dm


def _lines(path: Path, bad: bytes, at: int = 3, n: int = 6) -> Path:
    rows = write_rows(path.with_suffix(".tmp.jsonl"), explicit_rows(n)).read_bytes().splitlines(keepends=True)
    rows.insert(at, bad)
    data = b"".join(rows)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b'{"prompt": "p", "chosen": "c", "rejected": \n', r"line 4 is not valid JSON \(Expecting value at column 43\)"),
        (b'["p", "c", "r"]\n', "line 4 is an array, not a JSON object with the pair.s fields"),
        (b'"just a string"\n', "line 4 is a string, not a JSON object with the pair.s fields"),
        (b'{"prompt": "p", "chosen": "caf\xe9", "rejected": "r"}\n', r"line 4 is not UTF-8 \(byte 0xe9 at column 31\)"),
    ],
    ids=["malformed", "array", "string", "latin1"],
)
@pytest.mark.parametrize("name", ["pairs.jsonl", "pairs.jsonl.gz"])
def test_unreadable_line_is_named_or_skipped(tmp_path: Path, bad: bytes, reason: str, name: str) -> None:
    path = _lines(tmp_path / name, bad)
    with pytest.raises(ValueError, match=rf"{path}: row 3 \(0-based\): field '<row>' could not be read "
                                         rf"\(kind 'unreadable'\): {reason}\. Fix the file, or pass on_bad_row='skip'"):
        _setup(path)
    dm = _setup(path, on_bad_row="skip", val_fraction=0.3)
    assert dm.stats["train"]["bad_rows"]["unreadable"] + dm.stats["val"]["bad_rows"]["unreadable"] == 1
    assert dm.stats["train"]["pairs"] + dm.stats["val"]["pairs"] == 6


def test_every_unreadable_line_is_counted_once(tmp_path: Path) -> None:
    path = _lines(tmp_path / "pairs.jsonl", b"not json\n\n[1]\n", at=1)
    with pytest.raises(ValueError, match="row 1 .* line 2 is not valid JSON.*; 1 more unreadable lines follow"):
        _setup(path)
    dm = _setup(path, on_bad_row="skip", val_fraction=0.3)
    assert dm.stats["train"]["bad_rows"]["unreadable"] + dm.stats["val"]["bad_rows"]["unreadable"] == 2


@pytest.mark.parametrize("name", ["pairs.jsonl", "pairs.json", "pairs.csv", "pairs.jsonl.gz", "pairs.parquet"])
def test_empty_file_says_so(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    data = b"" if name.endswith(".parquet") else b"\n  \n"
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(ValueError, match=rf"{path}: the file is empty \(no rows\)"):
        _setup(path)


def test_json_array_and_csv_name_the_line_under_either_policy(tmp_path: Path) -> None:
    array = tmp_path / "pairs.json"
    array.write_bytes(b'[\n{"prompt": "p", "chosen": "c", "rejected": "r"},\n{"prompt": "p", "chosen": "\xff", "rejected": "r"}\n]')
    for policy in ("error", "skip"):
        with pytest.raises(ValueError, match=rf"{array}: line 3 is not UTF-8 \(byte 0xff at column 28\).*cannot skip it"):
            _setup(array, on_bad_row=policy)
    array.write_bytes(b'[{"prompt": "p", "chosen": "c", "rejected": "r"}, [1, 2]]')
    with pytest.raises(ValueError, match=rf"{array}: row 1 \(0-based\) of the JSON array is an array, not an object"):
        _setup(array)
    array.write_bytes(b'[{"prompt": "p", "chosen": "c",\n "rejected": }]')
    with pytest.raises(ValueError, match=rf"{array}: not valid JSON: Expecting value at line 2, column 14"):
        _setup(array)
    csv = tmp_path / "pairs.csv"
    csv.write_bytes(b"prompt,chosen,rejected\np,c,r\np,\xe9t\xe9,r\n")
    with pytest.raises(ValueError, match=rf"{csv}: line 3 is not UTF-8 \(byte 0xe9 at column 3\)"):
        _setup(csv, on_bad_row="skip")


def test_missing_tokenizer_path_names_the_argument(tmp_path: Path) -> None:
    for name in (str(tmp_path / "no-such-tokenizer"), "./no/such/dir", "~/no-such-tokenizer-dir"):
        with pytest.raises(ValueError, match=rf"tokenizer '{name}' \(argument data.init_args.tokenizer\): the local "
                                             "path does not exist"):
            load_tokenizer(name)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=rf"tokenizer '{empty}' .*could not load it from the local directory"):
        load_tokenizer(str(empty))
    with pytest.raises(ValueError, match="tokenizer 'no-org/no-such-tokenizer' .*could not load it from a hub name"):
        load_tokenizer("no-org/no-such-tokenizer")
