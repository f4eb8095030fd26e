"""Bad input gets a clear error: empty responses or prompts, a non-finite loss (or a counted skip), a vocabulary
mismatch, a bad beta, a model that cannot be loaded."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import collate_pairs
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.losses import SigmoidLoss
from lit_prunedpo.models import FromConfig, Pretrained

from helpers import TINY_LLAMA


def trainer(tmp_path, steps=3):
    return L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                     default_root_dir=tmp_path)


def data():
    return SyntheticPreferenceData(vocab_size=32, num_train=64, num_val=8, batch_size=4)


def test_empty_response_is_refused_naming_the_row(tiny_source):
    batch = collate_pairs([
        {"prompt_ids": [1, 2], "chosen_ids": [3, 4], "rejected_ids": [5], "index": 10},
        {"prompt_ids": [1], "chosen_ids": [3], "rejected_ids": [], "index": 11},
    ], pad_id=0)
    module = PrunedDPO(policy=tiny_source)
    with pytest.raises(ValueError, match=r"empty responses.*row 11 \(rejected\)"):
        module.training_step(batch, 0)


def test_empty_prompt_is_refused(tiny_source):
    batch = collate_pairs([{"prompt_ids": [], "chosen_ids": [3], "rejected_ids": [4], "index": 7}], pad_id=0)
    with pytest.raises(ValueError, match="rows \\[7\\] have an empty prompt"):
        batch.validate()


def test_nonfinite_loss_stops_naming_step_and_parts(tiny_source, tmp_path):
    module = PrunedDPO(policy=tiny_source)
    with torch.no_grad():
        module.policy.get_output_embeddings().weight[5].fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"non-finite DPO loss at step 0.*policy logp nan.*margin"):
        trainer(tmp_path).fit(module, datamodule=data())


class NaNOnce(SigmoidLoss):
    """The DPO loss, except that the first call returns NaN (a single bad step)."""

    calls = 0

    def value(self, margin, beta):
        NaNOnce.calls += 1
        out = super().value(margin, beta)
        return out * float("nan") if NaNOnce.calls == 1 else out  # calls starts at 0: the first; at -1: the second


def test_nonfinite_step_is_skipped_counted_and_logged(tiny_source, tmp_path):
    NaNOnce.calls = 0
    module = PrunedDPO(policy=tiny_source, loss=NaNOnce(), on_nonfinite="skip")
    t = trainer(tmp_path, steps=3)
    with pytest.warns(UserWarning, match="skipping step 0"):
        t.fit(module, datamodule=data())
    assert module.skipped_steps == 1
    assert t.global_step == 3  # the skipped batch did not count as an optimizer step
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())


class _NaNGradient(torch.autograd.Function):
    """Identity forward, NaN backward: a finite loss whose gradient is not (an overflow in the backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


class NaNGradientAt(PrunedDPO):
    """PrunedDPO whose objective, at the training steps in ``at``, is finite with a NaN gradient."""

    def __init__(self, *args, at=(1,), **kwargs):
        super().__init__(*args, **kwargs)
        self.at = set(at)

    def training_step(self, batch, batch_idx):
        self._nan_gradient = self.global_step in self.at
        return super().training_step(batch, batch_idx)

    def estimate(self, batch, plan, logps):
        est = super().estimate(batch, plan, logps)
        if not getattr(self, "_nan_gradient", False):
            return est
        return type(est)(**{**vars(est), "objective": _NaNGradient.apply(est.objective)})


def test_a_nan_gradient_with_a_finite_loss_is_skipped_not_applied(tiny_source, tmp_path):
    module = NaNGradientAt(policy=tiny_source, at=(1,), on_nonfinite="skip")
    with pytest.warns(UserWarning,
                      match=r"skipping step 1 \(batch 1\): non-finite gradient \(norm nan\) with a finite loss"):
        trainer(tmp_path, steps=4).fit(module, datamodule=data())
    assert module.skipped_steps == 1 and module.skipped_in_a_row == 0
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())  # AdamW would have spread the NaN


def test_a_nan_gradient_with_a_finite_loss_stops_a_raise_run(tiny_source, tmp_path):
    module = NaNGradientAt(policy=tiny_source, at=(1,))
    with pytest.raises(FloatingPointError, match=r"non-finite gradient \(total norm nan\) at step 1 \(batch 1\) with a "
                                                 r"finite DPO loss: the optimizer step would put NaN"):
        trainer(tmp_path).fit(module, datamodule=data())
    assert all(torch.isfinite(p).all() for p in module.policy.parameters())


def test_nan_gradients_in_a_row_stop_a_skip_run(tiny_source, tmp_path):
    module = NaNGradientAt(policy=tiny_source, at=range(100), on_nonfinite="skip", max_consecutive_skips=2)
    with pytest.warns(UserWarning, match="skipping step"), pytest.raises(
            FloatingPointError, match=r"3 steps in a row had a non-finite DPO loss or gradient \(the last at step 2"):
        trainer(tmp_path, steps=10).fit(module, datamodule=data())


def test_a_skipped_step_logs_its_own_values_not_the_previous_steps(tiny_source, tmp_path):
    import csv

    from lightning.pytorch.loggers import CSVLogger

    NaNOnce.calls = -1  # the second step's loss is NaN
    module = PrunedDPO(policy=tiny_source, loss=NaNOnce(), on_nonfinite="skip")
    t = L.Trainer(accelerator="cpu", max_steps=4, logger=CSVLogger(tmp_path, name="log"), log_every_n_steps=1,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  limit_val_batches=0, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match="skipping step 1"):
        t.fit(module, datamodule=data())
    rows = {int(r["step"]): r for r in csv.DictReader(open(next(tmp_path.rglob("metrics.csv"))))}
    assert rows[1]["train/loss"] == "nan" and rows[1]["train/grad_norm"] == "nan"
    assert rows[1]["train/skipped_nonfinite_steps"] == "1.0"
    assert float(rows[0]["train/loss"]) > 0 and float(rows[0]["train/grad_norm"]) > 0
    assert float(rows[0]["train/num_tokens"]) < float(rows[1]["train/num_tokens"]) < float(rows[2]["train/num_tokens"])
    assert rows[2]["train/loss"] != "nan" and rows[2]["train/grad_norm"] != "nan"


def test_vocabulary_mismatch_is_refused(tmp_path):
    module = PrunedDPO(policy=FromConfig("llama", {**TINY_LLAMA, "vocab_size": 16}))
    with pytest.raises(ValueError, match="tokenizer has 32 tokens but the policy's embedding has 16"):
        trainer(tmp_path).fit(module, datamodule=data())


@pytest.mark.parametrize("kwargs, name", [({"beta": 0.0}, "beta"), ({"on_nonfinite": "ignore"}, "on_nonfinite")])
def test_bad_module_arguments(tiny_source, kwargs, name):
    with pytest.raises(ValueError, match=name):
        PrunedDPO(policy=tiny_source, **kwargs)


def test_pretrained_loads_a_local_directory(tmp_path):
    FromConfig("llama", TINY_LLAMA, seed=3).build().save_pretrained(tmp_path / "tiny")
    model = Pretrained(str(tmp_path / "tiny")).build()
    again = FromConfig("llama", TINY_LLAMA, seed=3).build()
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_pretrained_hub_name_fails_fast_offline_with_a_clear_error():
    with pytest.raises(OSError, match="could not load a causal LM from 'no-such-org/no-such-model'"):
        Pretrained("no-such-org/no-such-model").build()


def test_from_config_unknown_model_type():
    with pytest.raises(ValueError, match="unknown model_type 'not-a-model'"):
        FromConfig("not-a-model").build()


def test_pretrained_policy_trains_in_training_mode_without_dropout(tmp_path):
    FromConfig("gpt2", dict(vocab_size=32, n_embd=32, n_layer=1, n_head=2,
                            n_positions=64)).build().save_pretrained(tmp_path / "g")
    module = PrunedDPO(policy=Pretrained(str(tmp_path / "g")))
    assert module.policy.training
    dropouts = [m for m in module.policy.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)
    kept = PrunedDPO(policy=Pretrained(str(tmp_path / "g")), disable_dropout=False)
    assert any(m.p > 0 for m in kept.policy.modules() if isinstance(m, torch.nn.Dropout))


def test_a_policy_left_in_eval_mode_is_reported(tiny_source, tmp_path):
    module = PrunedDPO(policy=tiny_source)
    module.policy.eval()
    filters = list(warnings.filters)
    with pytest.warns(UserWarning, match=r"policy module\(s\) are in eval mode") as caught:
        trainer(tmp_path, steps=1).fit(module, datamodule=data())
    # Lightning's generic eval-mode warning (the frozen reference is always in eval mode) is ignored, and only
    # while Lightning emits it: the process's filters are unchanged afterwards.
    assert not [w for w in caught if str(w.message).startswith("Found")]
    assert warnings.filters == filters
