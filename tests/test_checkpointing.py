"""Run outputs are never torn or shared (lit_prunedpo.checkpointing): atomic checkpoint writes, one log version
per run (also for two runs started together in one folder), a resume that skips a truncated last checkpoint
and names it, and a resume with other data refused unless asked for."""

from __future__ import annotations

import csv
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lit_prunedpo.checkpointing import AtomicCheckpointIO, checkpoint_problem, claim_log_version
from lit_prunedpo.cli import build_cli

from helpers import REPO
from data.pairs_factory import explicit_rows, write_rows

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
QUICK = ["--config", str(REPO / "configs/quickstart.yaml"), "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--trainer.val_check_interval=1000", "--trainer.log_every_n_steps=1",
         "--data.init_args.max_rows=48", "--data.init_args.batch_size=8"]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory, monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets_cache"))


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


def test_truncated_or_empty_checkpoints_are_recognised(tmp_path):
    path = tmp_path / "a.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.randn(1000)}, path)
    assert checkpoint_problem(path) is None
    (tmp_path / "cut.ckpt").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "truncated" in checkpoint_problem(tmp_path / "cut.ckpt")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert checkpoint_problem(tmp_path / "empty.ckpt") == "the file is empty"


def test_version_taken_by_another_run_since_the_listing_is_not_shared(tmp_path, monkeypatch):
    first, second = CSVLogger(tmp_path, name="logs"), CSVLogger(tmp_path, name="logs")
    trainer = lambda logger: type("T", (), {"loggers": [logger]})()  # noqa: E731  (all claim_log_version reads)
    claim_log_version(trainer(first))
    monkeypatch.setattr(second, "_get_next_version", lambda: 0)  # listed before the first run made version_0
    claim_log_version(trainer(second))
    assert (first.version, second.version) == (0, 1)
    explicit = CSVLogger(tmp_path, name="logs", version=0)
    claim_log_version(trainer(explicit))
    assert explicit.version == 0  # a version the user chose is theirs (e.g. a requeued job's folder)
    monkeypatch.setenv("LOCAL_RANK", "1")
    other_rank = CSVLogger(tmp_path, name="logs")
    claim_log_version(trainer(other_rank))
    assert other_rank._version is None  # only the first process claims


def test_two_runs_started_together_in_one_folder_keep_their_outputs_apart(tmp_path):
    cmd = [sys.executable, "-m", "lit_prunedpo", "fit", *QUICK, "--trainer.max_steps=2", "--trainer.default_root_dir=out",
           "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=1",
           "--trainer.callbacks.save_top_k=-1"]
    runs = [subprocess.Popen([*cmd, f"--seed_everything={seed}"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for seed in (1, 2)]
    logs = [p.communicate(timeout=600)[0] for p in runs]
    assert [p.returncode for p in runs] == [0, 0], "\n".join(log[-2000:] for log in logs)
    versions = sorted((tmp_path / "out/lightning_logs").iterdir())
    assert [v.name for v in versions] == ["version_0", "version_1"]
    seeds = sorted(next(line for line in (v / "config.yaml").read_text().splitlines() if line.startswith("seed_everything"))
                   for v in versions)
    assert seeds == ["seed_everything: 1", "seed_everything: 2"]  # one config.yaml per run
    for v in versions:
        with open(v / "metrics.csv") as f:
            steps = [row["step"] for row in csv.DictReader(f) if row["train/loss"]]
        assert steps == ["0", "1"]  # each run's own steps, once each: nothing interleaved
        # the two ModelCheckpoint files, and FinalCheckpoint's last.ckpt of the last step
        assert sorted(p.name for p in (v / "checkpoints").iterdir()) == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt", "last.ckpt"]


def _fit(tmp_path: Path, *extra: str) -> None:
    build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}", *extra])


CHECKPOINTS = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.dirpath=ckpt",
               "--trainer.callbacks.save_last=true", "--trainer.callbacks.every_n_train_steps=1"]


def test_resume_skips_a_truncated_last_checkpoint_and_names_it(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    _fit(tmp_path, "--trainer.max_steps=2", *CHECKPOINTS)
    good = tmp_path / "ckpt/last.ckpt"
    newer = tmp_path / "ckpt/last-v1.ckpt"  # e.g. written under its final name when the disk filled up
    newer.write_bytes(good.read_bytes()[:1000])
    os.utime(newer, (good.stat().st_mtime + 5, good.stat().st_mtime + 5))
    with pytest.warns(UserWarning, match=rf"resume: skipped {newer}: it cannot be read \(not a complete checkpoint "
                                         rf"archive.*resuming from {good}, the newest readable checkpoint"):
        _fit(tmp_path, "--trainer.max_steps=3", *CHECKPOINTS, "--ckpt_path=last")
    assert f"Restored all states from the checkpoint at {good}" in caplog.text
    good.write_bytes(b"")
    # the resumed fit rewrote last.ckpt: keep the broken file the newer one whatever that fit's duration was
    os.utime(newer, (good.stat().st_mtime + 5, good.stat().st_mtime + 5))
    step = tmp_path / "ckpt/epoch=0-step=3.ckpt"  # ModelCheckpoint's own file of the step last.ckpt held
    with pytest.warns(UserWarning, match=rf"resume: skipped {good}: it cannot be read \(the file is empty\); resuming "
                                         rf"from {step}, the newest readable checkpoint"):
        _fit(tmp_path, "--trainer.max_steps=4", *CHECKPOINTS, "--ckpt_path=last")
    assert f"Restored all states from the checkpoint at {step}" in caplog.text
    for path in (tmp_path / "ckpt").glob("*.ckpt"):
        path.write_bytes(b"")
    os.utime(newer, (good.stat().st_mtime + 5, good.stat().st_mtime + 5))
    with pytest.raises(ValueError, match=rf"no checkpoint can be read: {newer}: the file is empty; .*{good}: the file is "
                                         "empty.*Delete them to start afresh"):
        _fit(tmp_path, "--trainer.max_steps=5", *CHECKPOINTS, "--ckpt_path=last")


def test_resume_with_other_data_is_refused_unless_asked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = write_rows(tmp_path / "pairs.jsonl", explicit_rows(48))
    args = [f"--data.init_args.path={data}", *CHECKPOINTS]
    _fit(tmp_path, "--trainer.max_steps=2", *args)
    stat = data.stat()
    data.write_bytes(data.read_bytes().replace(b"Good answer 1.", b"Fine answer 1."))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # an in-place edit that keeps the time
    with pytest.raises(ValueError, match=r"refusing to resume: the checkpoint was written while training on "
                                         rf"{data} \(content .*\) but this run reads {data} \(content .*resume_with_changed_data=true"):
        _fit(tmp_path, "--trainer.max_steps=3", *args, "--ckpt_path=last")
    with pytest.warns(UserWarning, match=r"resuming with changed data, as asked"):
        _fit(tmp_path, "--trainer.max_steps=3", *args, "--ckpt_path=last", "--data.init_args.resume_with_changed_data=true")


def test_a_fixed_checkpoint_folder_in_use_by_a_live_run_is_refused(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_prunedpo.checkpointing import LOCK_NAME, lock_checkpoint_dirs

    folder = tmp_path / "ckpt"
    trainer = type("T", (), {"checkpoint_callbacks": [ModelCheckpoint(dirpath=folder)]})()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        folder.mkdir()
        (folder / LOCK_NAME).write_text(f"{socket.gethostname()} {other.pid}")
        with pytest.raises(RuntimeError, match=rf"checkpoint folder {folder} is in use by another run \(process "
                                               rf"{other.pid} on host .*lock file {folder / LOCK_NAME}\)"):
            lock_checkpoint_dirs(trainer)
    finally:
        other.kill()
        other.wait()
    lock_checkpoint_dirs(trainer)  # the holder died without cleaning up: its lock is taken over
    assert (folder / LOCK_NAME).read_text() == f"{socket.gethostname()} {os.getpid()}"
    lock_checkpoint_dirs(trainer)  # the same process again (a second fit in one session)


def test_resume_skips_a_torn_folder_of_shards_and_names_leftover_temporaries(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_prunedpo.checkpointing import resolve_resume

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


def test_a_folder_is_replaced_with_no_instant_without_a_whole_checkpoint(tmp_path):
    from lit_prunedpo.distributed import replace_folder, sharded_save_names

    path = tmp_path / "last.ckpt"
    tmp, old = sharded_save_names(path)
    assert (tmp.name, old.name) == (".last.ckpt.tmp", ".last.ckpt.old")
    path.write_bytes(b"a single-file checkpoint")  # what save_distributed_checkpoint=False wrote before
    for content in (b"first", b"second"):
        tmp.mkdir()
        (tmp / "meta.pt").write_bytes(content)
        old.mkdir(exist_ok=True)  # a leftover of a save that died between the two renames
        replace_folder(tmp, path, old)
        assert (path / "meta.pt").read_bytes() == content and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


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


def test_runs_without_a_logger_in_one_folder_keep_their_own_config(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    for seed in (1, 2):
        _fit(tmp_path, "--trainer.max_steps=1", "--trainer.logger=false", f"--seed_everything={seed}")
    seeds = [next(line for line in (tmp_path / name).read_text().splitlines() if line.startswith("seed_everything"))
             for name in ("config.yaml", "config-1.yaml")]
    assert seeds == ["seed_everything: 1", "seed_everything: 2"]
    assert f"{tmp_path} holds other runs' outputs (logger: false): this run's checkpoints go to " \
           f"{tmp_path / 'checkpoints-1'} and its config is {tmp_path / 'config-1.yaml'}" in caplog.text


def test_an_empty_folder_of_shards_is_torn_and_another_format_is_accepted(tmp_path):
    (tmp_path / "empty.ckpt").mkdir()
    assert "torn" in checkpoint_problem(tmp_path / "empty.ckpt")
    (tmp_path / "other.ckpt").mkdir()
    (tmp_path / "other.ckpt" / "model_states.pt").write_bytes(b"another tool's layout")
    assert checkpoint_problem(tmp_path / "other.ckpt") is None


def test_a_folder_of_shards_missing_a_shard_its_metadata_names_is_torn(tmp_path):
    import torch.distributed.checkpoint as dcp

    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_prunedpo.checkpointing import resolve_resume

    folder = tmp_path / "ckpt"
    older = folder / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(3)}, older)
    sharded = folder / "last-v1.ckpt"
    # one process, no process group: what FSDP2Strategy writes, one file per tensor here
    dcp.save({"a": torch.ones(4), "b": torch.zeros(8)}, storage_writer=dcp.FileSystemWriter(sharded, single_file_per_rank=False),
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
            _fit(tmp_path, f"--trainer.max_steps={steps}", *setup)
        said = [str(w.message) for w in seen]
        assert not [m for m in said if "no last checkpoint" in m or "is not empty" in m or "dirpath has changed" in m], said
    assert f"resume: no checkpoint in {tmp_path / 'ckpt'} yet (a first launch): starting afresh" in caplog.text
    assert f"resuming from {tmp_path / 'ckpt' / 'last.ckpt'}" in caplog.text


def test_a_resume_with_the_default_checkpoint_does_not_warn_that_its_folder_changed(tmp_path):
    import warnings

    _fit(tmp_path, "--trainer.max_steps=2", "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli = build_cli(["fit", *QUICK, f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=3",
                         "--ckpt_path=last"])
    assert cli.trainer.global_step == 3
    assert not [str(w.message) for w in seen if "dirpath has changed" in str(w.message)]


def test_a_checkpoint_on_a_full_disk_is_named_as_such(tmp_path, tmpfs, monkeypatch):
    # torch's writer reports a full disk as "[enforce fail at inline_container.cc] unexpected pos ...": the save names
    # the checkpoint and the cause instead, and leaves no partial file
    from lit_prunedpo.full_disk import DiskFull

    disk = tmpfs("256k")  # the quickstart's checkpoint (weights and optimizer state) is about 1 MB
    with pytest.raises(DiskFull, match=rf"^could not save checkpoint {re.escape(str(disk))}/ckpt/last.ckpt: disk full "
                                       r"\(ENOSPC: No space left on device\) \(torch's error: .*\); the previous last.ckpt"):
        _fit(tmp_path, "--trainer.max_steps=1", "--trainer.callbacks+=ModelCheckpoint",
             f"--trainer.callbacks.dirpath={disk / 'ckpt'}", "--trainer.callbacks.save_last=true")
    from lit_prunedpo.checkpointing import LOCK_NAME

    assert [p.name for p in (disk / "ckpt").iterdir()] == [LOCK_NAME]  # the run's lock alone: no partial file
