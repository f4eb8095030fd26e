"""Checkpoint writes are atomic (lit_prunedpo.checkpoint.io): a failed or full-disk write leaves the previous
checkpoint whole and no partial file, a folder of shards is replaced with no instant without a whole checkpoint, and
a plain Trainer gets the atomic writes too (a CheckpointIO the user chose is kept)."""

from __future__ import annotations

import re

import pytest
import torch

from lit_prunedpo.checkpoint import AtomicCheckpointIO, checkpoint_problem

from checkpoint.cli_runs import fit_quickstart


def test_a_failed_write_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)
    good = path.read_bytes()

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")  # what a full disk leaves behind
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    assert path.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert checkpoint_problem(path) is None


def test_a_folder_is_replaced_with_no_instant_without_a_whole_checkpoint(tmp_path):
    from lit_prunedpo.checkpoint import replace_folder, sharded_save_names

    path = tmp_path / "last.ckpt"
    tmp, old = sharded_save_names(path)
    assert (tmp.name, old.name) == (".last.ckpt.tmp", ".last.ckpt.old")
    path.write_bytes(b"a single-file checkpoint")  # what save_distributed_checkpoint=False wrote before
    for content in (b"first", b"second"):
        tmp.mkdir()
        (tmp / "meta.pt").write_bytes(content)
        old.mkdir(exist_ok=True)  # a leftover of a save that died between the two renames
        replace_folder(tmp, path, old)
        assert ((path / "meta.pt").read_bytes() == content
                and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"])


def test_a_plain_trainer_writes_checkpoints_atomically(tmp_path, tiny_source):
    import lightning as L
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from lit_prunedpo import PrunedDPO

    class Mine(TorchCheckpointIO):
        pass

    for plugins, expected in (([], AtomicCheckpointIO), ([Mine()], Mine)):
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            plugins=plugins)
        module = PrunedDPO(policy=tiny_source)
        trainer.strategy.connect(module)
        module.trainer = trainer  # as fit does
        assert type(trainer.strategy.checkpoint_io) is (TorchCheckpointIO if not plugins else Mine)
        trainer.save_checkpoint(tmp_path / "final.ckpt")
        assert type(trainer.strategy.checkpoint_io) is expected  # a CheckpointIO the user chose is kept
        assert checkpoint_problem(tmp_path / "final.ckpt") is None


def test_a_checkpoint_on_a_full_disk_is_named_as_such(tmp_path, tmpfs, monkeypatch):
    # torch's writer reports a full disk as "[enforce fail at inline_container.cc] unexpected pos ...": the save names
    # the checkpoint and the cause instead, and leaves no partial file
    from lit_prunedpo.full_disk import DiskFull

    disk = tmpfs("256k")  # the quickstart's checkpoint (weights and optimizer state) is about 1 MB
    with pytest.raises(DiskFull, match=rf"^could not save checkpoint {re.escape(str(disk))}/ckpt/last.ckpt: disk full "
                                       r"\(ENOSPC: No space left on device\) \(torch's error: .*\); the previous "
                                       r"last.ckpt"):
        fit_quickstart(tmp_path, "--trainer.max_steps=1", "--trainer.callbacks+=ModelCheckpoint",
             f"--trainer.callbacks.dirpath={disk / 'ckpt'}", "--trainer.callbacks.save_last=true")
    from lit_prunedpo.checkpoint import LOCK_NAME

    assert [p.name for p in (disk / "ckpt").iterdir()] == [LOCK_NAME]  # the run's lock alone: no partial file


def test_the_ddp_plugin_class_path_names_the_verified_checkpoint_io(tmp_path):
    # configs/ddp.yaml and docs/distributed.md name the plugin lit_prunedpo.checkpoint.VerifiedCheckpointIO
    from lit_prunedpo.checkpoint import VerifiedCheckpointIO

    with pytest.raises(FileNotFoundError, match=rf"checkpoint not found: {re.escape(str(tmp_path / 'none.ckpt'))}"):
        VerifiedCheckpointIO().load_checkpoint(tmp_path / "none.ckpt")
    (tmp_path / "cut.ckpt").write_bytes(b"PK\x03\x04 half a checkpoint")
    with pytest.raises(RuntimeError, match=r"cannot load checkpoint .*cut\.ckpt \(truncated or corrupt\?\)"):
        VerifiedCheckpointIO().load_checkpoint(tmp_path / "cut.ckpt")
