"""Files that ``datasets`` cannot parse fail with one message naming the file, line and row
(lit_prunedpo.data.readable), and a tokenizer that cannot be loaded names the argument (lit_prunedpo.data.tokenize)."""

from __future__ import annotations

import gzip
import json
import shutil
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
        (b'{"prompt": "p", "chosen": "c", "rejected": \n',
         r"line 4 is not valid JSON \(Expecting value at column 43\)"),
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
    array.write_bytes(b'[\n{"prompt": "p", "chosen": "c", "rejected": "r"},\n{"prompt": "p", "chosen": "\xff", '
                      b'"rejected": "r"}\n]')
    for policy in ("error", "skip"):
        with pytest.raises(ValueError,
                           match=rf"{array}: line 3 is not UTF-8 \(byte 0xff at column 28\).*cannot skip it"):
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
    with pytest.raises(ValueError, match="tokenizer 'no-org/no-such-tokenizer' .*could not load it from a hub name"):
        load_tokenizer("no-org/no-such-tokenizer")


NEEDS = (r"a tokenizer folder needs tokenizer.json, or the vocabulary files of its tokenizer class \(vocab.json and "
         r"merges.txt for GPT-2's BPE, tokenizer.model for SentencePiece, vocab.txt for WordPiece\), with "
         r"tokenizer_config.json naming the class; tokenizer.save_pretrained\(DIR\) writes them$")


def _folder(tmp_path: Path, gpt2_path: Path, name: str, *files: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for file in files:
        if file == "config.json":  # a model folder's config: says the model type, holds no vocabulary
            (folder / file).write_text('{"model_type": "gpt2"}')
        else:
            shutil.copy(gpt2_path / file, folder / file)
    return folder


def test_tokenizer_folder_without_tokenizer_files_says_what_it_needs(tmp_path: Path, gpt2_path: Path) -> None:
    # Before: an empty folder advised installing sentencepiece; a model folder (config.json only) or a lone
    # tokenizer_config.json loaded a GPT-2 tokenizer of one token, without a word.
    cases = [
        ((), r"holds no tokenizer files \(it is empty\)"),
        (("config.json",), r"holds no tokenizer files \(its files: config.json\)"),
        (("vocab.json", "merges.txt"),
         r"holds vocabulary files \(merges.txt, vocab.json\) but no tokenizer_config.json \(nor a config.json\) "
         r"saying which tokenizer class reads them"),
    ]
    for i, (files, what) in enumerate(cases):
        folder = _folder(tmp_path, gpt2_path, f"tok{i}", *files)
        with pytest.raises(ValueError, match=rf"^tokenizer '{folder}' \(argument data.init_args.tokenizer\): the local "
                                             rf"directory {what}; {NEEDS}"):
            load_tokenizer(str(folder))
    # A lone tokenizer_config.json, or vocabulary files of another class: GPT2Tokenizer loads with its special token
    # only.
    alone = _folder(tmp_path, gpt2_path, "alone", "tokenizer_config.json")
    other = _folder(tmp_path, gpt2_path, "other", "tokenizer_config.json")
    (other / "vocab.txt").write_text("a\nb\n")
    for folder in (alone, other):
        with pytest.raises(ValueError, match=rf"^tokenizer '{folder}' \(argument data.init_args.tokenizer\): loaded as "
                                             r"GPT2Tokenizer, but its vocabulary holds only its 1 special token\(s\): "
                                             r"the files its class reads \(merges.txt, vocab.json\) are missing; "
                                             rf"{NEEDS}"):
            load_tokenizer(str(folder))
    whole = _folder(tmp_path, gpt2_path, "whole", "tokenizer_config.json", "vocab.json", "merges.txt")
    assert len(load_tokenizer(str(whole))) == len(load_tokenizer(str(gpt2_path))) == 50257
    # A byte-level tokenizer saved to a folder holds no vocabulary file and loads.
    load_tokenizer("byt5").save_pretrained(tmp_path / "byt5")
    assert len(load_tokenizer(str(tmp_path / "byt5"))) == 384


def test_gz_file_that_is_plain_text_says_so(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "plain.jsonl", explicit_rows(6)).rename(tmp_path / "pairs.jsonl.gz")
    for policy in ("error", "skip"):
        with pytest.raises(ValueError, match=rf"^{path}: the name ends in .gz but the file is not gzip-compressed \(it "
                                             r"starts with b'\{\"prompt\": \"Ques'\); compress it \(gzip FILE\) or "
                                             r"drop the .gz from its name$"):
            _setup(path, on_bad_row=policy)


@pytest.mark.parametrize("name", ["pairs.jsonl.gz", "pairs.json.gz"])
def test_gz_file_cut_short_names_the_last_whole_line(tmp_path: Path, name: str) -> None:
    rows = explicit_rows(400)
    text = ("".join(json.dumps(r) + "\n" for r in rows) if name.endswith("jsonl.gz")
            else "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]")
    data = gzip.compress(text.encode())
    path = tmp_path / name
    path.write_bytes(data[: len(data) // 2])
    whole = 0
    try:  # the lines gzip itself yields before it stops: what the message must name
        with gzip.open(path, "rb") as f:
            for _ in f:
                whole += 1
    except EOFError:
        pass
    assert 0 < whole < 400
    for policy in ("error", "skip"):
        with pytest.raises(ValueError, match=rf"^{path}: the gzip stream is cut short after line {whole} \(the file is "
                                             r"incomplete, e.g. an interrupted download or copy\); rows past that line "
                                             r"cannot be read, so neither policy can use it: copy or download the file "
                                             r"again$"):
            _setup(path, on_bad_row=policy)


def test_gz_file_with_a_bad_checksum_is_named_as_damaged(tmp_path: Path) -> None:
    data = bytearray(gzip.compress("".join(json.dumps(r) + "\n" for r in explicit_rows(40)).encode()))
    data[-6] ^= 0xFF  # a byte of the CRC-32 in the trailer: every line decompresses, the check then fails
    path = tmp_path / "pairs.jsonl.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"^{path}: the gzip stream is damaged after line 40 \(CRC check failed "
                                         r"0x[0-9a-f]+ != 0x[0-9a-f]+\); copy or download the file again$"):
        _setup(path, on_bad_row="skip")


SURROGATE = b'{"prompt": [{"role": "user", "content": "caf\\ud800"}], "chosen": "c", "rejected": "r"}\n'


@pytest.mark.parametrize("name", ["pairs.jsonl", "pairs.jsonl.gz"])
def test_lone_surrogate_is_a_bad_row(tmp_path: Path, name: str) -> None:
    path = _lines(tmp_path / name, b'{"prompt": "p\\ud800", "chosen": "c", "rejected": "r"}\n', n=20)
    with pytest.raises(ValueError, match=rf"^{path}: row 3 \(0-based\): field 'prompt' could not be read \(kind "
                                         r"'unreadable'\): line 4 holds a lone surrogate U\+D800 \(\\ud800: half of a "
                                         r"UTF-16 pair, not a character\) in field 'prompt'\. Fix the file, or pass "
                                         r"on_bad_row='skip'"):
        _setup(path)
    dm = _setup(path, on_bad_row="skip", val_fraction=0.2)
    assert dm.stats["train"]["bad_rows"]["unreadable"] + dm.stats["val"]["bad_rows"]["unreadable"] == 1
    assert dm.stats["train"]["pairs"] + dm.stats["val"]["pairs"] == 20


def test_lone_surrogate_deep_in_a_row_names_its_path_and_a_valid_pair_passes(tmp_path: Path) -> None:
    from lit_prunedpo.data.readable import line_problem

    assert line_problem(SURROGATE) == ("prompt[0].content", "holds a lone surrogate U+D800 (\\ud800: half of a UTF-16 "
                                                            "pair, not a character) in field 'prompt[0].content'")
    # A surrogate pair is one character (an emoji), and an escaped backslash before "ud800" is no surrogate.
    assert line_problem(b'{"prompt": "\\ud83d\\ude00 \\\\ud800", "chosen": "c", "rejected": "r"}') is None


def test_lone_surrogate_in_a_json_array_names_the_row_under_either_policy(tmp_path: Path) -> None:
    rows = [json.dumps(r) for r in explicit_rows(4)]
    rows[2] = '{"prompt": "p", "chosen": "\\udfff", "rejected": "r"}'
    path = tmp_path / "pairs.json"
    path.write_text("[" + ",\n".join(rows) + "]")
    for policy in ("error", "skip"):
        with pytest.raises(ValueError, match=rf"^{path}: row 2 \(0-based\) of the JSON array: field 'chosen' could not "
                                             r"be read \(kind 'unreadable'\): the row holds a lone surrogate U\+DFFF"):
            _setup(path, on_bad_row=policy)


def test_line_of_row_skips_blank_lines_and_is_none_for_whole_documents(tmp_path: Path) -> None:
    from lit_prunedpo.data.readable import line_of_row

    path = tmp_path / "pairs.jsonl"
    path.write_bytes(GOOD + b"\n  \n" + GOOD + GOOD)
    assert [line_of_row(path, row) for row in range(3)] == [1, 4, 5]  # lines 2 and 3 are blank
    gz = tmp_path / "pairs.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert line_of_row(gz, 2) == 5
    array = write_rows(tmp_path / "pairs.json", explicit_rows(3))
    columns = tmp_path / "columns.json"
    columns.write_text(json.dumps({"prompt": ["a", "b"], "chosen": ["c", "d"], "rejected": ["e", "f"]}))
    assert line_of_row(array, 1) is None and line_of_row(columns, 1) is None
