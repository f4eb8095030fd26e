"""A run killed after a validation keeps that validation's ``last.ckpt`` (through a real subprocess and SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from helpers import REPO

pytestmark = pytest.mark.slow  # the CLI in a subprocess, killed: `pytest -m slow` (CI runs it)


def test_a_run_killed_after_a_validation_keeps_its_last_checkpoint(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable, "-m", "lit_prunedpo", "fit", "--config", str(REPO / "configs/quickstart.yaml"),
        f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=200", "--trainer.val_check_interval=10",
        "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false",
        '--trainer.callbacks+={"class_path": "helpers.KillAt", "init_args": {"step": 25}}',
    ]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    (last,) = tmp_path.rglob("last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 20
