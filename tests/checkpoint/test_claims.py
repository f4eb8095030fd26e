"""Each run claims its own outputs (lit_prunedpo.checkpoint.claims): one log version per run (also for two runs
started together in one folder), and without a logger a checkpoint folder and config file of its own."""

from __future__ import annotations

import csv
import logging
import os
import subprocess
import sys

from lightning.pytorch.loggers import CSVLogger

from lit_prunedpo.checkpoint import claim_log_version

from helpers import REPO
from checkpoint.cli_runs import QUICK, fit_quickstart

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


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
    cmd = [sys.executable, "-m", "lit_prunedpo", "fit", *QUICK, "--trainer.max_steps=2",
           "--trainer.default_root_dir=out",
           "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=1",
           "--trainer.callbacks.save_top_k=-1"]
    runs = [subprocess.Popen([*cmd, f"--seed_everything={seed}"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for seed in (1, 2)]
    logs = [p.communicate(timeout=600)[0] for p in runs]
    assert [p.returncode for p in runs] == [0, 0], "\n".join(log[-2000:] for log in logs)
    versions = sorted((tmp_path / "out/lightning_logs").iterdir())
    assert [v.name for v in versions] == ["version_0", "version_1"]
    seeds = sorted(next(line for line in (v / "config.yaml").read_text().splitlines()
                        if line.startswith("seed_everything"))
                   for v in versions)
    assert seeds == ["seed_everything: 1", "seed_everything: 2"]  # one config.yaml per run
    for v in versions:
        with open(v / "metrics.csv") as f:
            steps = [row["step"] for row in csv.DictReader(f) if row["train/loss"]]
        assert steps == ["0", "1"]  # each run's own steps, once each: nothing interleaved
        # the two ModelCheckpoint files, and FinalCheckpoint's last.ckpt of the last step
        assert sorted(p.name for p in (v / "checkpoints").iterdir()) == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt",
                                                                         "last.ckpt"]


def test_runs_without_a_logger_in_one_folder_keep_their_own_config(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    for seed in (1, 2):
        fit_quickstart(tmp_path, "--trainer.max_steps=1", "--trainer.logger=false", f"--seed_everything={seed}")
    seeds = [next(line for line in (tmp_path / name).read_text().splitlines() if line.startswith("seed_everything"))
             for name in ("config.yaml", "config-1.yaml")]
    assert seeds == ["seed_everything: 1", "seed_everything: 2"]
    assert f"{tmp_path} holds other runs' outputs (logger: false): this run's checkpoints go to " \
           f"{tmp_path / 'checkpoints-1'} and its config is {tmp_path / 'config-1.yaml'}" in caplog.text


def test_a_run_refused_at_set_up_leaves_no_version_holding_only_its_config(tmp_path):
    import pytest

    from lit_prunedpo.cli import build_cli

    def fit(root, *extra):  # the quickstart with a cached reference (configs/cached.yaml), into root
        build_cli(["fit", *QUICK, "--config", str(REPO / "configs/cached.yaml"), "--trainer.max_steps=1",
                   f"--trainer.default_root_dir={root}", f"--model.reference.init_args.path={tmp_path / 'ref'}",
                   *extra])

    fit(tmp_path / "run")
    root = tmp_path / "run/lightning_logs"
    assert sorted(p.name for p in root.iterdir()) == ["version_0"]
    # the cache was built for max_length 64: refused at set-up, after the run's config.yaml was saved
    with pytest.raises(ValueError, match=r"reference cache .* is stale"):
        fit(tmp_path / "run", "--data.init_args.max_length=60")
    assert sorted(p.name for p in root.iterdir()) == ["version_0"]  # no version_1 with a lone config.yaml
    # nor the folders made for a run refused before its first step
    with pytest.raises(ValueError, match=r"reference cache .* is stale"):
        fit(tmp_path / "other/run", "--data.init_args.max_length=60")
    assert not (tmp_path / "other").exists()
