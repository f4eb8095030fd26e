"""FinalCheckpoint: every fit ends with a checkpoint of its last step (max_steps, max_time, SIGTERM, runs shorter
than one validation interval), ``--ckpt_path last`` resumes from it, and the log ends with a summary."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_prunedpo.callbacks import FinalCheckpoint
from lit_prunedpo.callbacks.final_checkpoint import CTRL_C_BURST_S
from lit_prunedpo.cli import build_cli

from helpers import REPO, config_args

FAST = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
        "--data.init_args.max_rows=64", "--data.init_args.val_fraction=0.25", "--data.init_args.batch_size=8"]


def _step_of(path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def test_a_run_shorter_than_one_validation_interval_leaves_its_last_step(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"),
                         f"--trainer.default_root_dir={tmp_path}",
                         "--trainer.max_steps=3", *FAST])  # validates every 40 steps: never here
    ckpt = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert _step_of(ckpt) == 3 and cli.trainer.global_step == 3
    summary = caplog.text[caplog.text.index("run finished at step 3"):]
    assert f"final checkpoint: {ckpt}" in summary and "no validation ran" in summary
    assert "median step time" in summary and "peak memory" in summary  # the quickstart's monitors


def test_the_last_step_is_saved_after_the_last_validation_and_resumed_by_ckpt_path_last(tmp_path, caplog):
    fixed = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
             f"--trainer.callbacks.dirpath={tmp_path / 'ckpts'}", "--trainer.val_check_interval=4",
             "--trainer.limit_val_batches=1"]
    common = ["fit", *config_args("all"), f"--trainer.default_root_dir={tmp_path}", *FAST, *fixed]
    with caplog.at_level(logging.INFO):
        build_cli([*common, "--trainer.max_steps=5"])
    assert _step_of(tmp_path / "ckpts/last.ckpt") == 5  # not the step-4 weights of the validation checkpoint
    assert "last validation (step 4): " in caplog.text and "val/loss" in caplog.text
    resumed = build_cli([*common, "--trainer.max_steps=7", "--ckpt_path=last"])
    assert resumed.model.sampler_rng.step == 7 and _step_of(tmp_path / "ckpts/last.ckpt") == 7
    assert sorted(p.name for p in (tmp_path / "ckpts").glob("last*.ckpt")) == ["last.ckpt"]


class _Slow(BoringModel):
    def __init__(self, sleep_s: float = 0.0, sigterm_at: int | None = None):
        super().__init__()
        self.sleep_s, self.sigterm_at = sleep_s, sigterm_at

    def training_step(self, batch, batch_idx):
        time.sleep(self.sleep_s)
        if self.global_step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


def _trainer(tmp_path, **kwargs) -> tuple[Trainer, FinalCheckpoint]:
    final = FinalCheckpoint()
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, default_root_dir=tmp_path, callbacks=[final], **kwargs)
    return trainer, final


def test_max_time_ends_with_a_checkpoint_of_the_last_step(tmp_path):
    trainer, final = _trainer(tmp_path, max_time={"seconds": 1}, max_steps=1000)
    trainer.fit(_Slow(sleep_s=0.3))
    assert 0 < trainer.global_step < 1000
    assert _step_of(final.saved_path) == trainer.global_step


def test_sigterm_without_preemption_callback_still_saves(tmp_path):
    trainer, final = _trainer(tmp_path, max_epochs=3, limit_train_batches=2)
    with pytest.raises(SIGTERMException):
        trainer.fit(_Slow(sigterm_at=1))
    assert final.saved_path is not None and _step_of(final.saved_path) == trainer.global_step >= 2


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="filename"):
        FinalCheckpoint(filename="last.ckpt")
    with pytest.raises(ValueError, match="export_adapter"):
        FinalCheckpoint(export_adapter="both")


# ------------------------------------------------------------------------------------------------ Ctrl-C
class _Interrupted(BoringModel):
    def __init__(self, at: int, times: int = 1, gap: float | None = None):
        super().__init__()
        # two Ctrl-Cs: the second a moment after the first (a burst of SIGINTs is one Ctrl-C)
        self.at, self.times = at, times
        self.gap = CTRL_C_BURST_S + 0.1 if gap is None else gap

    def training_step(self, batch, batch_idx):
        if self.global_step == self.at:
            for i in range(self.times):
                if i:
                    time.sleep(self.gap)
                os.kill(os.getpid(), signal.SIGINT)  # handled here, at the next bytecode
        return super().training_step(batch, batch_idx)


@pytest.fixture
def restores_sigint():
    # as at a terminal: a test run started in the background (nohup, `cmd &`) inherits SIGINT ignored, and
    # FinalCheckpoint rightly leaves an ignored SIGINT alone
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning leaves SIGINT ignored after a Ctrl-C


def test_ctrl_c_finishes_the_step_saves_it_and_exits_130(tmp_path, caplog, restores_sigint):
    trainer, final = _trainer(tmp_path, max_steps=50)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as stopped:
        trainer.fit(_Interrupted(at=2))
    assert stopped.value.code == 130
    assert _step_of(final.saved_path) == trainer.global_step == 3  # the interrupted step finished, then saved
    assert "run stopped by Ctrl-C at step 3" in caplog.text and f"final checkpoint: {final.saved_path}" in caplog.text
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_a_second_ctrl_c_stops_at_once_and_says_what_was_kept(tmp_path, caplog, restores_sigint):
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer, final = _trainer(tmp_path, max_steps=50)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit):
        trainer.fit(_Interrupted(at=2, times=2))
    assert final.saved_path is None
    assert "interrupted by Ctrl-C at step 2, without saving it; no checkpoint was written before: the 2 steps " \
           "trained are lost" in caplog.text

    kept = ModelCheckpoint(dirpath=tmp_path / "kept", every_n_train_steps=1, save_top_k=0, save_last=True)
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, default_root_dir=tmp_path, callbacks=[kept, FinalCheckpoint()], max_steps=50)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit):
        trainer.fit(_Interrupted(at=3, times=2))
    path = tmp_path / "kept/last.ckpt"
    assert f"interrupted by Ctrl-C at step 3, without saving it; kept: {path} (step 3)" in caplog.text
    assert _step_of(path) == 3


def test_a_burst_of_sigints_is_one_ctrl_c_whenever_the_step_ends(tmp_path, caplog, restores_sigint):
    # two SIGINTs 50 ms apart acted as one Ctrl-C (saved) when the step ended between them, else as two (not saved)
    for at in (2, 4):
        trainer, final = _trainer(tmp_path / str(at), max_steps=50)
        with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as stopped:
            trainer.fit(_Interrupted(at=at, times=3, gap=0.05))
        assert stopped.value.code == 130 and _step_of(final.saved_path) == trainer.global_step == at + 1
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_user_sigint_handler_is_left_alone(tmp_path):
    seen = []
    signal.signal(signal.SIGINT, lambda *_: seen.append(1))
    try:
        trainer, final = _trainer(tmp_path, max_steps=4)
        trainer.fit(_Interrupted(at=1))
        assert seen == [1] and trainer.global_step == 4 and _step_of(final.saved_path) == 4
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_sigterm_stop_ignores_later_sigterms_while_the_process_exits(tmp_path):
    trainer, final = _trainer(tmp_path, max_epochs=3, limit_train_batches=2)
    try:
        with pytest.raises(SIGTERMException):
            trainer.fit(_Slow(sigterm_at=1))
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_enable_checkpointing_false_writes_no_checkpoint_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # default_root_dir unset: the current folder, where last.ckpt was written
    with caplog.at_level(logging.INFO):
        cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--trainer.default_root_dir=null",
                         "--trainer.max_steps=2", "--trainer.enable_checkpointing=false", *FAST])
    assert cli.trainer.global_step == 2
    assert not list(tmp_path.rglob("*.ckpt"))
    assert "trainer.enable_checkpointing is false: no checkpoint is written, not even the final" in caplog.text
    assert "final checkpoint: none (trainer.enable_checkpointing is false)" in caplog.text
    assert "export it:" not in caplog.text
    build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--trainer.default_root_dir=null",
               "--trainer.max_steps=1", "--trainer.enable_checkpointing=false", "--trainer.logger=false", *FAST])
    assert not list(tmp_path.rglob("*.ckpt")) and not (tmp_path / "checkpoints").exists()  # no empty folder either
    with pytest.raises(ValueError, match="final.export_dir .*hf: the export is written from the final checkpoint, but "
                                         "trainer.enable_checkpointing is false"):
        build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--trainer.max_steps=2",
                   "--trainer.enable_checkpointing=false", f"--final.export_dir={tmp_path / 'hf'}", *FAST])


def test_a_checkpoint_at_or_past_max_steps_says_there_is_nothing_to_train(tmp_path, caplog):
    common = ["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}", *FAST]
    build_cli([*common, "--trainer.max_steps=3"])
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.warns(UserWarning) as warned:
        cli = build_cli([*common, "--trainer.max_steps=2", "--ckpt_path=last"])
    assert cli.trainer.global_step == 3  # nothing trained
    said = [str(w.message) for w in warned]
    assert ("resume: the checkpoint is at step 3 >= trainer.max_steps 2: nothing to train; to train more, raise "
            "--trainer.max_steps above 3") in said
    assert "resume: WarmupCosineLR schedule" not in caplog.text  # no schedule line for steps that will not run
