"""A fixed checkpoint folder holds one run at a time (lit_prunedpo.checkpoint.locks): a live run's lock is refused,
a dead one's taken over, the same process's taken again."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def test_a_fixed_checkpoint_folder_in_use_by_a_live_run_is_refused(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_prunedpo.checkpoint import LOCK_NAME, lock_checkpoint_dirs

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
