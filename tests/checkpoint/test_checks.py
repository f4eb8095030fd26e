"""A checkpoint is checked without loading it (lit_prunedpo.checkpoint.checks): a truncated or empty file, a folder
of shards without its index, with a shard missing or cut short, is recognised, and another tool's folder is
accepted as is."""

from __future__ import annotations

import os

import pytest
import torch

from lit_prunedpo.checkpoint import AtomicCheckpointIO, checkpoint_problem


def test_truncated_or_empty_checkpoints_are_recognised(tmp_path):
    path = tmp_path / "a.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.randn(1000)}, path)
    assert checkpoint_problem(path) is None
    (tmp_path / "cut.ckpt").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "truncated" in checkpoint_problem(tmp_path / "cut.ckpt")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert checkpoint_problem(tmp_path / "empty.ckpt") == "the file is empty"


def test_an_empty_folder_of_shards_is_torn_and_another_format_is_accepted(tmp_path):
    (tmp_path / "empty.ckpt").mkdir()
    assert "torn" in checkpoint_problem(tmp_path / "empty.ckpt")
    (tmp_path / "other.ckpt").mkdir()
    (tmp_path / "other.ckpt" / "model_states.pt").write_bytes(b"another tool's layout")
    assert checkpoint_problem(tmp_path / "other.ckpt") is None


def test_a_folder_of_shards_missing_a_shard_its_metadata_names_is_torn(tmp_path):
    import torch.distributed.checkpoint as dcp

    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_prunedpo.checkpoint import resolve_resume

    folder = tmp_path / "ckpt"
    older = folder / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(3)}, older)
    sharded = folder / "last-v1.ckpt"
    # one process, no process group: what FSDP2Strategy writes, one file per tensor here
    dcp.save({"a": torch.ones(4), "b": torch.zeros(8)},
             storage_writer=dcp.FileSystemWriter(sharded, single_file_per_rank=False),
             no_dist=True)
    torch.save({"global_step": 3}, sharded / "meta.pt")
    shards = sorted(p.name for p in sharded.glob("*.distcp"))
    assert len(shards) == 2 and checkpoint_problem(sharded) is None
    os.utime(sharded, (older.stat().st_mtime + 5, older.stat().st_mtime + 5))
    (sharded / shards[1]).unlink()
    assert checkpoint_problem(sharded) == f"1 of the 2 shard files its .metadata names are missing: {shards[1]}"
    callback = ModelCheckpoint(dirpath=folder)
    trainer = type("T", (), {"callbacks": [callback], "checkpoint_callbacks": [callback], "loggers": [],
                             "default_root_dir": str(tmp_path)})()
    with pytest.warns(UserWarning, match=rf"resume: skipped {sharded}: it cannot be read \(1 of the 2 shard files"):
        assert resolve_resume(trainer, "last") == str(older)
    (sharded / shards[0]).write_bytes((sharded / shards[0]).read_bytes()[:10])
    (sharded / shards[1]).write_bytes(b"")
    assert "is shorter than its .metadata records" in checkpoint_problem(sharded)
