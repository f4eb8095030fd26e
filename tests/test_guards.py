"""Degenerate runs are stopped, not hidden (lit_prunedpo.guards and PrunedDPO's skip limit): a diverged run
under ``on_nonfinite=skip`` stops with an error and writes no checkpoint; NaN weights are never saved; a
``max_length`` beyond the model's position table is refused at set-up."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_prunedpo import PrunedDPO
from lit_prunedpo.data import PreferenceDataModule, SyntheticPreferenceData
from lit_prunedpo.models import FromConfig

from helpers import TINY_LLAMA


def nan_module(**kwargs) -> PrunedDPO:
    module = PrunedDPO(policy=FromConfig("llama", TINY_LLAMA, seed=0), **kwargs)
    with torch.no_grad():
        module.policy.get_output_embeddings().weight.fill_(float("nan"))  # a run that already diverged
    return module


def fit(module, tmp_path, datamodule=None, steps=12, checkpoints=False):
    callbacks = [ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1,
                                 save_last=True)] if checkpoints else []
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False, callbacks=callbacks,
                        enable_checkpointing=checkpoints,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        default_root_dir=tmp_path)
    trainer.fit(module, datamodule=datamodule or SyntheticPreferenceData(vocab_size=32, num_train=64, num_val=8,
                                                                          batch_size=4))
    return trainer


def test_diverged_run_under_skip_stops_and_saves_nothing(tmp_path):
    module = nan_module(on_nonfinite="skip", max_consecutive_skips=3)
    with pytest.warns(UserWarning, match="skipping step 0"):
        with pytest.raises(FloatingPointError, match=r"4 steps in a row had a non-finite DPO loss .* "
                                                     r"model.max_consecutive_skips=3: the run diverged"):
            fit(module, tmp_path)
    assert module.skipped_steps == 4
    # With a checkpoint every step, the first save of the NaN weights is refused before the streak ends.
    with pytest.warns(UserWarning, match="skipping step 0"):
        with pytest.raises(FloatingPointError, match="refusing to save a checkpoint at step 1: 1 weight tensors hold"):
            fit(nan_module(on_nonfinite="skip", max_consecutive_skips=3), tmp_path, checkpoints=True)
    assert not list(tmp_path.rglob("*.ckpt"))


def test_skip_streak_resets_on_a_finite_step(tmp_path, tiny_source):
    calls = []

    class NaNEveryOther(PrunedDPO):
        def estimate(self, batch, plan, logps):
            est = super().estimate(batch, plan, logps)
            calls.append(1)
            return est if len(calls) % 2 == 0 else type(est)(**{**vars(est), "objective": est.objective * float("nan")})

    module = NaNEveryOther(policy=tiny_source, on_nonfinite="skip", max_consecutive_skips=1)
    with pytest.warns(UserWarning, match="skipping step"):
        fit(module, tmp_path, steps=4)
    assert module.skipped_steps == 2 and module.skipped_in_a_row == 0  # two skips, never two in a row


class NaNLoss(PrunedDPO):
    """Every step's loss is NaN, the weights stay finite (each step is skipped): checkpoints can be written."""

    def estimate(self, batch, plan, logps):
        est = super().estimate(batch, plan, logps)
        return type(est)(**{**vars(est), "objective": est.objective * float("nan")})


def test_skip_streak_survives_a_resume(tmp_path, tiny_source):
    first = NaNLoss(policy=tiny_source, on_nonfinite="skip", max_consecutive_skips=3)
    with pytest.warns(UserWarning, match="skipping step"):
        trainer = fit(first, tmp_path, steps=2)
    trainer.save_checkpoint(tmp_path / "two_skips.ckpt")
    saved = torch.load(tmp_path / "two_skips.ckpt", weights_only=False)
    assert (saved["skipped_nonfinite_steps"], saved["skipped_nonfinite_in_a_row"]) == (2, 2)
    resumed = NaNLoss(policy=tiny_source, on_nonfinite="skip", max_consecutive_skips=3)
    trainer = L.Trainer(accelerator="cpu", max_steps=12, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    data = SyntheticPreferenceData(vocab_size=32, num_train=64, num_val=8, batch_size=4)
    # 2 skips before the checkpoint + 2 after it: stopped at step 3, not after 4 more skips (step 5)
    with pytest.warns(UserWarning, match="skipping step 2"):
        with pytest.raises(FloatingPointError,
                           match=r"4 steps in a row had a non-finite DPO loss or gradient \(the last at step 3,"):
            trainer.fit(resumed, datamodule=data, ckpt_path=tmp_path / "two_skips.ckpt")
    assert resumed.skipped_steps == 4


def test_nan_weights_are_never_written(tmp_path):
    module = nan_module()
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy.connect(module)
    with pytest.raises(FloatingPointError, match=r"refusing to save a checkpoint at step 0: 1 weight tensors hold NaN "
                                                 r"or Inf \(e.g. policy.lm_head.weight\)"):
        trainer.save_checkpoint(tmp_path / "final.ckpt")
    assert not (tmp_path / "final.ckpt").exists()


def test_max_length_beyond_the_position_table_is_refused_at_setup(tmp_path):
    module = PrunedDPO(policy=FromConfig("llama", {**TINY_LLAMA, "vocab_size": 384, "max_position_embeddings": 64}))
    data = PreferenceDataModule(None, max_length=80, max_prompt_length=16, max_rows=16, batch_size=4)
    with pytest.raises(ValueError, match=r"data.init_args.max_length is 80 but the policy has 64 positions "
                                         r"\(config.max_position_embeddings\).*at most 64"):
        fit(module, tmp_path, datamodule=data, steps=1)
