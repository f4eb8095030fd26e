"""A reference cache is written whole or not at all: a disk that fills (ENOSPC, EFBIG) while it is written is named
in one line (``lit-prunedpo-cache`` ends with it, exit status 1) and leaves neither a partial file nor a changed
cache; what a killed build leaves beside the cache is never read, and a cache cut short under its own name is
refused on load. Injected errors run everywhere; the real full disk is a tmpfs, where mounting one is permitted."""

from __future__ import annotations

import errno
import os
import re

import pytest
from helpers import REPO, fill_disk

import lit_prunedpo.reference.store as store_module
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.reference import CachedReference, ReferenceRuntime
from lit_prunedpo.full_disk import DiskFull


def synthetic():
    dm = SyntheticPreferenceData(vocab_size=32, num_train=40, num_val=8, batch_size=8, seed=3)
    dm.setup("fit")
    return dm


def prepare(path, policy, **kwargs) -> CachedReference:
    ref = CachedReference(str(path), **kwargs)
    ref.prepare(policy, synthetic(), ReferenceRuntime(root_dir=str(path.parent)))
    return ref


def fills_the_disk(code):
    def save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)  # part of the file, as a disk filling mid-write leaves it
        raise OSError(code, os.strerror(code))

    return save_file


@pytest.mark.parametrize(("code", "said"), [
    (errno.ENOSPC, "disk full (ENOSPC: No space left on device)"),
    (errno.EFBIG, "file too large for its file system (EFBIG: File too large)"),
])
def test_a_full_disk_names_the_cache_and_leaves_nothing_half_written(tmp_path, tiny_source, monkeypatch, code, said):
    path = tmp_path / "ref.safetensors"
    policy = tiny_source.build()
    monkeypatch.setattr(store_module, "save_file", fills_the_disk(code))
    message = (rf"^reference cache {re.escape(str(path))}: {re.escape(said)} while writing it \(as "
               r"ref\.safetensors\.partial-\d+, now removed; ref\.safetensors is as it was\): free space on that disk, "
               r"or point model\.reference\.init_args\.path at another one$")
    with pytest.raises(DiskFull, match=message) as caught:
        prepare(path, policy)
    assert caught.value.errno == code and os.listdir(tmp_path) == []
    monkeypatch.undo()
    assert prepare(path, policy).builds == 1  # the next run builds it: nothing was taken for a cache


def test_a_full_disk_leaves_the_earlier_cache_as_it_was(tmp_path, tiny_source, monkeypatch):
    path = tmp_path / "ref.safetensors"
    policy = tiny_source.build()
    prepare(path, policy)
    before = path.read_bytes()
    monkeypatch.setattr(store_module, "save_file", fills_the_disk(errno.ENOSPC))
    with pytest.raises(DiskFull, match="disk full"):
        prepare(path, policy, recompute=True)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ref.safetensors"]
    monkeypatch.undo()
    assert prepare(path, policy).builds == 0  # reused as it was


def test_what_a_killed_build_leaves_is_never_read_and_a_cut_cache_is_refused(tmp_path, tiny_source):
    path = tmp_path / "ref.safetensors"
    policy = tiny_source.build()
    leftover = tmp_path / "ref.safetensors.partial-999999"  # a killed build's: no clean-up ran
    leftover.write_bytes(b"\0" * 100)
    ref = prepare(path, policy)
    assert ref.builds == 1 and ref.store.num_rows == 48 and leftover.read_bytes() == b"\0" * 100
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # cut short under the cache's own name (copied in part)
    with pytest.raises(ValueError, match=rf"^reference cache {re.escape(str(path))}: not a readable safetensors file "
                                         r"\(cut short or not a cache\?\): .*; delete it or rebuild it "
                                         r"\(model\.reference\.init_args\.recompute=true\)$"):
        prepare(path, policy)
    assert prepare(path, policy, recompute=True).builds == 1


@pytest.fixture
def full_tmpfs(tmpfs):
    """A 512 KiB tmpfs filled to the last byte by one file (``filler``)."""
    where = tmpfs("512k")
    fill_disk(where)
    return where


def test_the_cache_command_on_a_full_disk_ends_with_one_line_naming_the_file(full_tmpfs, tmp_path):
    from lit_prunedpo.cli.cache import main

    path = full_tmpfs / "ref.safetensors"
    with pytest.raises(SystemExit, match=rf"^lit-prunedpo-cache: reference cache {re.escape(str(path))}: disk full "
                                         r"\(ENOSPC: No space left on device\) while writing it \(as ref\.safetensors\."
                                         r"partial-\d+, now removed; ref\.safetensors is as it was\)") as caught:
        main(["--config", str(REPO / "configs/cached.yaml"), f"--trainer.default_root_dir={tmp_path / 'run'}",
              f"--model.reference.init_args.path={path}", "--data.init_args.max_rows=64",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"])
    assert "\n" not in str(caught.value.code)
    assert os.listdir(full_tmpfs) == ["filler"]
