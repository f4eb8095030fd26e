"""The short quickstart fit the checkpoint tests run through the real CLI, and the options that add a fixed-folder
``ModelCheckpoint`` to it."""

from __future__ import annotations

from pathlib import Path

from lit_prunedpo.cli import build_cli

from helpers import REPO

QUICK = ["--config", str(REPO / "configs/quickstart.yaml"), "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--trainer.val_check_interval=1000", "--trainer.log_every_n_steps=1",
         "--data.init_args.max_rows=48", "--data.init_args.batch_size=8"]
CHECKPOINTS = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.dirpath=ckpt",
               "--trainer.callbacks.save_last=true", "--trainer.callbacks.every_n_train_steps=1"]


def fit_quickstart(root: Path, *extra: str) -> None:
    """``lit-prunedpo fit`` of the quickstart (48 rows, batches of 8) into ``root``, with ``extra`` options."""
    build_cli(["fit", *QUICK, f"--trainer.default_root_dir={root}", *extra])
