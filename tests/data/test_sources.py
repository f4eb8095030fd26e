"""Loading one split from each supported kind of source (lit_prunedpo.data.sources)."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from lit_prunedpo.data.sources import load_split

from .pairs_factory import explicit_rows, write_rows


@pytest.mark.parametrize("name", ["pairs.json", "pairs.jsonl", "pairs.jsonl.gz", "pairs.parquet", "pairs.csv"])
def test_reads_each_file_type(tmp_path: Path, name: str) -> None:
    rows = explicit_rows(5)
    ds = load_split(str(write_rows(tmp_path / name, rows)), "train")
    assert ds.to_list() == rows


def test_reads_saved_dataset_and_dataset_dict(tmp_path: Path) -> None:
    rows = explicit_rows(6)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    assert load_split(str(tmp_path / "one"), "anything").to_list() == rows
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:4]), "test": datasets.Dataset.from_list(rows[4:])}
    ).save_to_disk(str(tmp_path / "dict"))
    assert load_split(str(tmp_path / "dict"), "test").to_list() == rows[4:]
    with pytest.raises(ValueError, match=r"dict: no split 'dev'; the splits are \['test', 'train'\]"):
        load_split(str(tmp_path / "dict"), "dev")


def test_missing_and_unknown_paths_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=f"{missing}: no such file"):
        load_split(str(missing), "train")
    odd = tmp_path / "pairs.txt"
    odd.write_text("hello")
    with pytest.raises(ValueError, match=f"{odd}: unknown file type"):
        load_split(str(odd), "train")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}: a directory, but not one written by"):
        load_split(str(tmp_path), "train")


def test_hub_name_is_tried_and_named_when_it_fails() -> None:
    # Offline here, so the real hub code path must fail, with the name in front.
    with pytest.raises(FileNotFoundError, match=r"some-org/no-such-dataset: no local file .* hub dataset"):
        load_split("some-org/no-such-dataset", "train")


def test_hub_dataset_fails_at_once_when_the_hub_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from lit_prunedpo import hub
    from lit_prunedpo.data import sources

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=hub.PROBE_TIMEOUT_S: "ConnectError: no route")
    monkeypatch.setattr(sources.datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets' retries started"))
    with pytest.raises(hub.HubUnreachable, match=r"^'some-org/pairs' \(data.init_args.path\) is not a local path, so "
                                                 r"it is a Hugging Face Hub name, but the hub .* does not answer "
                                                 r"\(ConnectError: no route\)"):
        load_split("some-org/pairs", "train")


def test_hub_dataset_cache_is_found_where_datasets_falls_back_to(datasets_cache: Path) -> None:
    from lit_prunedpo.data.sources import _dataset_in_cache

    assert not _dataset_in_cache("Some-Org/MyPairs")
    (datasets_cache / "Some-Org___my_pairs").mkdir()  # datasets snake-cases the name, not the organisation
    assert _dataset_in_cache("Some-Org/MyPairs")


def test_offline_hub_dataset_not_in_the_cache_says_so() -> None:
    with pytest.raises(FileNotFoundError, match=r"HF_HUB_OFFLINE=1 is set, so 'some-org/no-such-dataset' was looked up "
                                                r"only in the local cache"):
        load_split("some-org/no-such-dataset", "train")
