"""Under DDP a bad input ends the output with the clear message on every rank, not with gloo's "Connection closed
by peer" from a rank left waiting at a barrier (PreferenceDataModule.setup)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # a two-process DDP launch in a subprocess: `pytest -m slow` (CI runs it)

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_ddp_with_too_few_rows_ends_with_the_clear_error_on_every_rank(tmp_path):
    (tmp_path / "one.jsonl").write_text('{"prompt": "p", "chosen": "good", "rejected": "bad"}\n')
    cmd = [sys.executable, "-m", "lit_prunedpo", "fit", "--config", str(REPO / "configs/quickstart.yaml"),
           "--trainer.strategy=ddp", "--trainer.devices=2", "--data.init_args.path=one.jsonl",
           "--trainer.enable_progress_bar=false"]
    out = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=240)
    log = out.stdout + out.stderr
    message = ("error: one.jsonl: 1 row cannot be split into training and validation (val_fraction 0.05 holds out "
               "at least one row and leaves one to train on): add rows, or train on it without validation: "
               "val_fraction=0 (--data.init_args.val_fraction 0)")
    assert out.returncode != 0 and "Connection closed" not in log, log[-3000:]
    assert out.stderr.strip().splitlines()[-1].endswith(message), log[-3000:]
    assert log.count(message) == 2, log[-3000:]  # rank 0 and rank 1
    assert "Traceback" not in log  # the package's own check: its line alone (lit_prunedpo.cli.user_errors)
    assert "reduce_op" not in log  # torch's deprecation warning, from destroy_process_groups' sweep at exit
