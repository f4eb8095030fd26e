"""A resumed run goes on in its own folder (lit_prunedpo.checkpoint.run_folder), through the real CLI: one version
folder and one metrics.csv hold both parts, rows the earlier run logged after its checkpoint give way to the resumed
run's, and a checkpoint outside a run folder keeps Lightning's new version, said in the log."""

from __future__ import annotations

import csv
import logging
import shutil
from pathlib import Path

import pytest

from lit_prunedpo.cli import build_cli

from helpers import REPO, csv_logger

QUICK = ["--config", str(REPO / "configs/quickstart.yaml"), "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1", "--data.init_args.max_rows=48",
         "--data.init_args.batch_size=8", "--model.scheduler.init_args.on_extension=stretch"]
STEP_CHECKPOINTS = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=2",
                    "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.save_last=true"]


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory, monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets_cache"))


def _fit(root: Path, *extra: str):
    return build_cli(["fit", *QUICK, f"--trainer.default_root_dir={root}", *csv_logger(root), *extra])


def _training_rows(version: Path, loss: str = "train/loss") -> list[dict[str, float]]:
    with open(version / "metrics.csv") as f:
        return [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(f) if row.get(loss)]


def test_a_resumed_run_logs_into_the_folder_and_metrics_file_of_the_run_it_resumes(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    _fit(tmp_path, "--trainer.max_steps=2", "--trainer.val_check_interval=2")
    logs = tmp_path / "lightning_logs"
    first = _training_rows(logs / "version_0")
    resumed = _fit(tmp_path, "--trainer.max_steps=4", "--trainer.val_check_interval=2", "--ckpt_path=last")
    assert resumed.trainer.global_step == 4
    version = logs / "version_0"
    assert sorted(p.name for p in logs.iterdir()) == ["version_0"] and list(tmp_path.rglob("metrics.csv")) == [
        version / "metrics.csv"]
    rows = _training_rows(version)
    assert rows[:2] == first and len(rows) == 4  # the first part's two steps, then the resumed run's two
    steps, tokens = [r["step"] for r in rows], [r["train/num_tokens"] for r in rows]
    assert steps == sorted(steps) and len(set(steps)) == 4 and tokens == sorted(tokens) and len(set(tokens)) == 4
    with open(version / "metrics.csv") as f:
        assert sum(1 for row in csv.DictReader(f) if row.get("val/loss")) == 2  # a validation in each part
    assert (f"resume: this run logs into {version}, the run folder of {version / 'checkpoints/last.ckpt'}; it "
            f"appends to {version / 'metrics.csv'} (3 rows of the earlier run); its config is "
            f"{version / 'config-1.yaml'}") in caplog.text
    assert (version / "config.yaml").read_text() != (version / "config-1.yaml").read_text()  # max_steps 2, 4


@pytest.mark.parametrize("trl", [False, True], ids=["lightning-steps", "trl-steps"])
def test_rows_logged_after_the_checkpoint_give_way_to_the_resumed_runs(tmp_path, caplog, trl):
    caplog.set_level(logging.INFO)
    extra = [*STEP_CHECKPOINTS, "--trainer.val_check_interval=1000"]
    extra += ["--trainer.callbacks+=lit_prunedpo.callbacks.TRLKeys", "--trainer.callbacks.own_keys=none"] if trl else []
    loss = "loss" if trl else "train/loss"
    _fit(tmp_path, "--trainer.max_steps=4", *extra)
    version = tmp_path / "lightning_logs/version_0"
    straight = _training_rows(version, loss)
    _fit(tmp_path, "--trainer.max_steps=4", *extra, f"--ckpt_path={version / 'checkpoints/epoch=0-step=2.ckpt'}")
    rows = _training_rows(version, loss)
    # each step once, the resumed run's steps 3 and 4 in place of the earlier run's (a resume is exact: same values)
    assert [r["step"] for r in rows] == [r["step"] for r in straight] == ([1, 2, 3, 4] if trl else [0, 1, 2, 3])
    assert [r[loss] for r in rows] == pytest.approx([r[loss] for r in straight], rel=1e-5)
    first = 3 if trl else 2
    assert (f"resume: dropped 2 rows of {version / 'metrics.csv'} from step {first} on, logged after the "
            "checkpoint: this run logs those steps again") in caplog.text


def test_a_checkpoint_outside_any_run_folder_keeps_a_new_version_and_says_where(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    _fit(tmp_path, "--trainer.max_steps=2", "--trainer.val_check_interval=1000")
    copied = tmp_path / "kept/step2.ckpt"
    copied.parent.mkdir()
    shutil.copy(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", copied)
    _fit(tmp_path, "--trainer.max_steps=3", "--trainer.val_check_interval=1000", f"--ckpt_path={copied}")
    logs = tmp_path / "lightning_logs"
    assert sorted(p.name for p in logs.iterdir()) == ["version_0", "version_1"]
    assert [r["step"] for r in _training_rows(logs / "version_1")] == [2]
    assert (f"resume: {copied} lies in no run folder of CSVLogger ({logs}/<version>/checkpoints/): this run's "
            f"metrics go to {logs / 'version_1'}, a new version") in caplog.text
