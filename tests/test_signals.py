"""How a ``lit-prunedpo fit`` process ends on a signal, through the real CLI in a subprocess (the exit status and
what is on disk are only visible from outside), signalled from outside as a user or a scheduler does: Ctrl-C after
validations saves the step it finishes and exits 130; a burst of 40 SIGTERMs, 50 ms apart, stops the run once,
saved, with exit status 0 (not a kill's 143, from a SIGTERM that arrived after the run had stopped)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import REPO

pytestmark = pytest.mark.slow  # the CLI in subprocesses, signalled: `pytest -m slow` (CI runs it)


@pytest.mark.parametrize("signum, count, status, said", [
    (signal.SIGINT, 1, 130, "run stopped by Ctrl-C at step"),
    (signal.SIGTERM, 40, 0, "run stopped by SIGTERM at step"),
], ids=["ctrl-c", "sigterm-burst"])
def test_a_signalled_run_saves_its_step_and_exits_with_the_right_status(tmp_path, signum, count, status, said):
    command = [
        sys.executable, "-m", "lit_prunedpo", "fit", "--config", str(REPO / "configs/quickstart.yaml"),
        f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=400", "--trainer.val_check_interval=10",
        "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false",
    ]
    run = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = []
    for line in run.stdout:
        out.append(line)
        if line.startswith("validation at step 20:"):
            for _ in range(count):
                run.send_signal(signum)
                time.sleep(0.05)
            break
    out.append(run.communicate(timeout=600)[0])
    text = "".join(out)
    assert run.returncode == status, text[-3000:]
    assert said in text and "continue it: the same command with --ckpt_path last" in text
    (last,) = tmp_path.rglob("last.ckpt")
    step = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    assert 20 <= step < 400 and f"at step {step}" in text
