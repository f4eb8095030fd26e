"""Inputs are identified by their bytes (lit_prunedpo.fingerprint): a data file edited in place with its
modification time restored is re-read, and a reference cache built from the old rows is refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lit_prunedpo.data.preference import PreferenceDataModule
from lit_prunedpo.fingerprint import content_digest
from lit_prunedpo.models import FromConfig
from lit_prunedpo.reference import CachedReference, ReferenceRuntime

from helpers import TINY_LLAMA
from data.pairs_factory import explicit_rows, write_rows


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory, monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets_cache"))


def edit_keeping_mtime(path: Path, old: bytes, new: bytes) -> None:
    """What ``cp -p`` / ``rsync -t`` / ``tar`` do: new bytes, the same size and modification time."""
    stat = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and path.stat().st_size == stat.st_size


def test_digest_is_of_the_bytes_not_the_name_or_time(tmp_path: Path) -> None:
    a = write_rows(tmp_path / "a.jsonl", explicit_rows(4))
    b = tmp_path / "b.jsonl"
    shutil.copy(a, b)
    assert content_digest(a) == content_digest(b)
    edit_keeping_mtime(b, b"Good answer 2", b"Good answer 9")
    assert content_digest(a) != content_digest(b)
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(a, folder / "x.jsonl")
    before = content_digest(folder)
    (folder / "x.jsonl").rename(folder / "y.jsonl")  # same bytes under another name: another dataset
    assert content_digest(folder) != before


def test_in_place_edit_with_mtime_kept_is_read_and_refuses_the_old_reference_cache(tmp_path) -> None:
    path = write_rows(tmp_path / "pairs.jsonl", explicit_rows(24))

    def data() -> PreferenceDataModule:
        dm = PreferenceDataModule(str(path), tokenizer="byt5", batch_size=4, max_length=48, max_prompt_length=24)
        dm.setup("fit")
        return dm

    def answer_3(dm):
        texts = [dm.tokenizer.decode(ids, skip_special_tokens=True)
                 for ds in (dm.train_dataset, dm.val_dataset) for ids in ds["chosen_ids"]]
        return [t[:14] for t in texts if t[5:14] == "answer 3."]

    old = data()
    assert answer_3(old) == ["Good answer 3."]
    cache = tmp_path / "ref.safetensors"
    policy = FromConfig("llama", {**TINY_LLAMA, "vocab_size": 384}).build()  # ByT5's vocabulary
    CachedReference(str(cache)).prepare(policy, old, ReferenceRuntime(root_dir=str(tmp_path)))

    edit_keeping_mtime(path, b"Good answer 3.", b"Fine answer 3.")
    new = data()
    assert answer_3(new) == ["Fine answer 3."]
    assert new.data_identity()["content"] != old.data_identity()["content"]
    with pytest.raises(ValueError, match=rf"reference cache {cache} is stale.*data\.content\.train"):
        CachedReference(str(cache)).prepare(policy, new, ReferenceRuntime(root_dir=str(tmp_path)))
