"""What ``lit-prunedpo fit`` prints, through the real CLI: one line per validation, no Lightning tips, no FLOPs
column of zeros, one checkpoint file (``last.ckpt``) for the last step, and a summary that ends with the
``lit-prunedpo export`` command for that checkpoint (which runs as printed)."""

from __future__ import annotations

import logging
import warnings
import shlex

from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoModelForCausalLM

from lit_prunedpo.callbacks.model_summary import RichSummaryWithoutZeroFlops, SummaryWithoutZeroFlops
from lit_prunedpo.cli import build_cli, main

from helpers import REPO

SMALL = ["--trainer.log_every_n_steps=1", "--data.init_args.max_rows=64", "--data.init_args.val_fraction=0.25",
         "--data.init_args.batch_size=8", "--trainer.logger=lightning.pytorch.loggers.CSVLogger"]


def test_a_fit_prints_validation_lines_no_tips_and_the_export_command(tmp_path, caplog, capsys):
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"),
                         f"--trainer.default_root_dir={tmp_path}",
                         "--trainer.max_steps=4", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                         "--trainer.enable_progress_bar=false", *SMALL])
        # what torch 2.13 says about Lightning's _pytree at a user's run (not on every path): the CLI filters it
        assert [f for f in warnings.filters if f[0] == "ignore" and f[1] is not None and "LeafSpec" in f[1].pattern]
    said = caplog.text + capsys.readouterr().out
    # nothing about code the user cannot change: Lightning's LeafSpec deprecation, its weights_only default at a save
    assert not [w for w in warned if "LeafSpec" in str(w.message)] and "`weights_only` was not set" not in said
    assert "validation at step 2: val/loss " in said and "validation at step 4: val/loss " in said
    assert ", val/rewards/accuracies " in said
    assert "💡" not in said and "Tip:" not in said
    assert "FLOPs" not in said and "Total Flops" not in said  # the plain-text summary (no progress bar)
    folder = tmp_path / "lightning_logs/version_0/checkpoints"
    # the last step is also a validation step: Lightning's default ModelCheckpoint would add epoch=0-step=4.ckpt
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]
    assert cli.trainer.checkpoint_callback.last_model_path == str(folder / "last.ckpt")
    command = caplog.text.splitlines()[-1].split("export it: ", 1)[1]
    assert command == (f"lit-prunedpo export --ckpt_path {folder / 'last.ckpt'} "
                       f"--out {tmp_path / 'lightning_logs/version_0/hf'}")
    args = shlex.split(command)
    main(args[1:])  # as printed, without the program name
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "lightning_logs/version_0/hf").config.vocab_size == 384


def test_the_cli_replaces_lightnings_default_summary_and_checkpoint_only(tmp_path):
    base = ["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}"]
    callbacks = build_cli(base, run=False).trainer.callbacks
    assert any(type(c) is RichSummaryWithoutZeroFlops for c in callbacks)
    (checkpoint,) = [c for c in callbacks if isinstance(c, ModelCheckpoint)]
    assert (checkpoint.save_top_k, checkpoint.save_last) == (0, True)
    named = build_cli([*base, "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_top_k=-1",
                       "--trainer.callbacks.every_n_train_steps=5"], run=False).trainer.callbacks
    (checkpoint,) = [c for c in named if isinstance(c, ModelCheckpoint)]
    assert (checkpoint.save_top_k, checkpoint.save_last) == (-1, None)  # a config's own is left as it is


def test_the_rich_summary_leaves_out_flops_only_when_none_were_counted(capsys):
    data = [(" ", ["0"]), ("Name", ["policy"]), ("Type", ["Llama"]), ("Params", ["123 K"]), ("Mode", ["train"]),
            ("FLOPs", ["0"])]
    RichSummaryWithoutZeroFlops.summarize(data, 10, 5, 0.1, {"train": 1, "eval": 0}, 0)
    out = capsys.readouterr().out
    assert "policy" in out and "Trainable params" in out and "FLOPs" not in out
    RichSummaryWithoutZeroFlops.summarize([*data[:-1], ("FLOPs", ["2.0 K"])], 10, 5, 0.1, {"train": 1, "eval": 0}, 2000)
    assert "FLOPs" in capsys.readouterr().out


def test_the_plain_summary_leaves_out_flops_only_when_none_were_counted(caplog):
    data = [(" ", ["0"]), ("Name", ["policy"]), ("Type", ["Llama"]), ("Params", ["123 K"]), ("Mode", ["train"]),
            ("FLOPs", ["0"])]
    with caplog.at_level(logging.INFO):
        SummaryWithoutZeroFlops.summarize(data, 10, 5, 0.1, {"train": 1, "eval": 0}, 0)
    assert "policy" in caplog.text and "Trainable params" in caplog.text
    assert "FLOPs" not in caplog.text and "Total Flops" not in caplog.text
