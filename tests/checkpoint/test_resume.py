"""``ckpt_path=last`` resumes from the newest readable checkpoint (lit_prunedpo.checkpoint.resume): a truncated
last checkpoint or a torn folder of shards is skipped and named, leftover temporaries are named, nothing readable is
refused, a resume with other data is refused unless asked for, and a requeued run launches and relaunches without
misleading warnings."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from lit_prunedpo.checkpoint import AtomicCheckpointIO, checkpoint_problem
from lit_prunedpo.cli import build_cli

from checkpoint.cli_runs import CHECKPOINTS, QUICK, fit_quickstart
from data.pairs_factory import explicit_rows, write_rows


def test_resume_skips_a_truncated_last_checkpoint_and_names_it(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    fit_quickstart(tmp_path, "--trainer.max_steps=2", *CHECKPOINTS)
    good = tmp_path / "ckpt/last.ckpt"
    newer = tmp_path / "ckpt/last-v1.ckpt"  # e.g. written under its final name when the disk filled up
    newer.write_bytes(good.read_bytes()[:1000])
    os.utime(newer, (good.stat().st_mtime + 5, good.stat().st_mtime + 5))
    with pytest.warns(UserWarning, match=rf"resume: skipped {newer}: it cannot be read \(not a complete checkpoint "
                                         rf"archive.*resuming from {good}, the newest readable checkpoint"):
        fit_quickstart(tmp_path, "--trainer.max_steps=3", *CHECKPOINTS, "--ckpt_path=last")
    assert f"Restored all states from the checkpoint at {good}" in caplog.text
    good.write_bytes(b"")
    # the resumed fit rewrote last.ckpt: keep the broken file the newer one whatever that fit's duration was
    os.utime(newer, (good.stat().st_mtime + 5, good.stat().st_mtime + 5))
    step = tmp_path / "ckpt/epoch=0-step=3.ckpt"  # ModelCheckpoint's own file of the step last.ckpt held
    with pytest.warns(UserWarning, match=rf"resume: skipped {good}: it cannot be read \(the file is empty\); resuming "
                                         rf"from {step}, the newest readable checkpoint"):
        fit_quickstart(tmp_path, "--trainer.max_steps=4", *CHECKPOINTS, "--ckpt_path=last")
    assert f"Restored all states from the checkpoint at {step}" in caplog.text
    for path in (tmp_path / "ckpt").glob("*.ckpt"):
        path.write_bytes(b"")
    os.utime(newer, (good.stat().st_mtime + 5, good.stat().st_mtime + 5))
    with pytest.raises(ValueError, match=rf"no checkpoint can be read: {newer}: the file is empty; .*{good}: the file "
                                         r"is "
                                         "empty.*Delete them to start afresh"):
        fit_quickstart(tmp_path, "--trainer.max_steps=5", *CHECKPOINTS, "--ckpt_path=last")


def test_resume_with_other_data_is_refused_unless_asked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = write_rows(tmp_path / "pairs.jsonl", explicit_rows(48))
    args = [f"--data.init_args.path={data}", *CHECKPOINTS]
    fit_quickstart(tmp_path, "--trainer.max_steps=2", *args)
    stat = data.stat()
    data.write_bytes(data.read_bytes().replace(b"Good answer 1.", b"Fine answer 1."))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # an in-place edit that keeps the time
    with pytest.raises(ValueError, match=r"refusing to resume: the checkpoint was written while training on "
                                         rf"{data} \(content .*\) but this run reads {data} \(content "
                                         r".*resume_with_changed_data=true"):
        fit_quickstart(tmp_path, "--trainer.max_steps=3", *args, "--ckpt_path=last")
    with pytest.warns(UserWarning, match=r"resuming with changed data, as asked"):
        fit_quickstart(tmp_path, "--trainer.max_steps=3", *args, "--ckpt_path=last",
                       "--data.init_args.resume_with_changed_data=true")


def test_resume_skips_a_torn_folder_of_shards_and_names_leftover_temporaries(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_prunedpo.checkpoint import resolve_resume

    folder = tmp_path / "ckpt"
    good = folder / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(3)}, good)
    torn = folder / "last-v1.ckpt"  # a sharded save killed before its .metadata and meta.pt were written
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"half a shard")
    os.utime(torn, (good.stat().st_mtime + 5, good.stat().st_mtime + 5))
    leftover = folder / ".last.ckpt.tmp"  # FSDP2Strategy's temporary folder of a save that died
    leftover.mkdir()
    callback = ModelCheckpoint(dirpath=folder)
    trainer = type("T", (), {"callbacks": [callback], "checkpoint_callbacks": [callback], "loggers": [],
                             "default_root_dir": str(tmp_path)})()
    with pytest.warns(UserWarning) as caught:
        assert resolve_resume(trainer, "last") == str(good)
    messages = [str(w.message) for w in caught]
    assert f"resume: ignored {leftover}: the temporary output of a checkpoint save that was interrupted" in messages[0]
    assert messages[1].startswith(f"resume: skipped {torn}: it cannot be read (a folder of shards without .metadata "
                                  "and meta.pt: torn, its save was interrupted")
    (torn / ".metadata").write_bytes(b"index")
    (torn / "meta.pt").write_bytes(b"")
    assert checkpoint_problem(torn) == "meta.pt: the file is empty"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, torn / "meta.pt")
    assert checkpoint_problem(torn).startswith(".metadata cannot be read (UnpicklingError")  # not an index of shards


def test_a_requeued_run_launches_and_relaunches_without_misleading_warnings(tmp_path, monkeypatch, caplog):
    # the DDP/FSDP configs' set-up on one process: a fixed ModelCheckpoint folder and PreemptionCheckpoint (so a
    # relaunch of the same command resumes); first launch: nothing to resume, no "no last checkpoint ... set
    # save_last=True" (it is set) and no "exists and is not empty" (only the lock is there); the relaunch resumes
    # without "exists and is not empty" (its own checkpoint) and the default checkpoint without "dirpath has changed"
    import warnings

    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    setup = [*CHECKPOINTS[:3], "--trainer.callbacks.every_n_train_steps=2",
             "--trainer.callbacks+=lit_prunedpo.callbacks.PreemptionCheckpoint"]
    for steps in (2, 4):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fit_quickstart(tmp_path, f"--trainer.max_steps={steps}", *setup)
        said = [str(w.message) for w in seen]
        assert not [m for m in said
                    if "no last checkpoint" in m or "is not empty" in m or "dirpath has changed" in m], said
    assert f"resume: no checkpoint in {tmp_path / 'ckpt'} yet (a first launch): starting afresh" in caplog.text
    assert f"resuming from {tmp_path / 'ckpt' / 'last.ckpt'}" in caplog.text


def test_a_resume_with_the_default_checkpoint_does_not_warn_that_its_folder_changed(tmp_path):
    import warnings

    fit_quickstart(tmp_path, "--trainer.max_steps=2", "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli = build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=3",
                         "--ckpt_path=last"])
    assert cli.trainer.global_step == 3
    assert not [str(w.message) for w in seen if "dirpath has changed" in str(w.message)]


def test_the_search_lists_every_checkpoint_newest_first_and_where_it_looked(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_prunedpo.checkpoint import ResumeSearch, find_checkpoints

    callback = ModelCheckpoint(dirpath=tmp_path / "ckpt")
    folder = Path(callback.dirpath)  # as ModelCheckpoint holds it (resolved)
    older, newer = folder / "epoch=0-step=1.ckpt", folder / "last.ckpt"
    previous = tmp_path / "checkpoints-1" / "last.ckpt"  # a run without a logger before this one, the oldest
    for when, path in ((1001, older), (1002, newer), (1000, previous)):
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(1)}, path)
        os.utime(path, (when, when))
    trainer = type("T", (), {"callbacks": [callback], "checkpoint_callbacks": [callback], "loggers": [],
                             "default_root_dir": str(tmp_path)})()
    assert find_checkpoints(trainer) == ResumeSearch([str(newer), str(older)], [str(folder)], {folder})
    assert find_checkpoints(trainer, previous_runs=True) == ResumeSearch(
        [str(newer), str(older), str(previous)], [str(folder), str(tmp_path / "checkpoints*")], {folder})
