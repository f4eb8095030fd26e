"""StepProgressBar: no ``Epoch 0/-2`` on step-bounded runs; the CLI uses it in place of Lightning's default bar only."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar

from lit_prunedpo.callbacks import StepProgressBar
from lit_prunedpo.cli import build_cli

from helpers import REPO


def _cli(tmp_path, *extra):
    return build_cli(["--config", str(REPO / "configs/quickstart.yaml"),
                      f"--trainer.default_root_dir={tmp_path}", *extra],
                     run=False)


def test_step_bounded_run_shows_the_epoch_alone(tmp_path):
    cli = _cli(tmp_path)
    bar = cli.trainer.progress_bar_callback
    assert isinstance(bar, StepProgressBar)
    cli.trainer.fit_loop.max_epochs = -1  # what Lightning sets for a max_steps-bounded fit
    bar._trainer = cli.trainer
    assert bar._get_train_description(0).strip() == "Epoch 0"
    cli.trainer.fit_loop.max_epochs = 3
    assert bar._get_train_description(1).strip() == "Epoch 1/2"


def test_a_configured_progress_bar_is_kept(tmp_path):
    cli = _cli(tmp_path, "--trainer.callbacks+=lightning.pytorch.callbacks.RichProgressBar")
    assert type(cli.trainer.progress_bar_callback) is RichProgressBar


def test_the_bar_shows_step_loss_validation_accuracy_and_speeds_without_v_num(tmp_path, monkeypatch):
    cli = _cli(tmp_path)
    bar, trainer = cli.trainer.progress_bar_callback, cli.trainer
    logged = {"train/loss": 0.22171, "val/rewards/accuracies": 1.0, "train/other": 3.5}  # logged with prog_bar=True
    monkeypatch.setattr(type(trainer), "progress_bar_metrics", property(lambda self: logged))
    bar._marks.extend([(0.0, 0, 0), (2.0, 10, 30_000)])  # 10 steps and 30k tokens in 2 s
    shown = bar.get_metrics(trainer, cli.model)
    assert shown == {"step": "0", "loss": "0.222", "val acc": "1.000", "steps/s": "5", "tok/s": "15k",
                     "train/other": 3.5}
    assert "v_num" not in shown
