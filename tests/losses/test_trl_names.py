"""TRL's loss options under TRL's names: unknown names and unsupported DPOConfig fields get a clear error, and the
CLI accepts ``--model.loss ipo`` (the formulas behind each name: tests/losses/test_trl_parity.py, ``name:*``)."""

from __future__ import annotations

import logging

import pytest

from lit_prunedpo import PrunedDPO
from lit_prunedpo.losses import LengthNormalized, TRLLoss, WeightedLoss, trl_loss


def test_an_unknown_name_names_the_closest_and_the_list():
    with pytest.raises(ValueError, match=r"model.loss 'ipoo': not one of TRL's loss types \(sigmoid, hinge, ipo, .*\); "
                                         r"did you mean 'ipo'\?"):
        trl_loss("ipoo")


def test_aot_is_refused_with_its_reason():
    with pytest.raises(NotImplementedError, match="sorts log-ratios across the batch"):
        trl_loss("aot")


@pytest.mark.parametrize("field, value, why", [
    ("f_divergence_type", "forward_kl", "f-DPO's divergences"), ("ld_alpha", 0.5, "LD-DPO"),
    ("use_weighting", True, "WPO's weights"),
])
def test_dpoconfig_fields_without_a_counterpart_are_refused(field, value, why):
    with pytest.raises(NotImplementedError, match=rf"model.loss {field}: {why}"):
        TRLLoss(**{field: value})


def test_weights_must_match_the_names():
    with pytest.raises(ValueError, match=r"2 loss_weights for 3 loss types"):
        trl_loss(["sigmoid", "bco_pair", "sft"], [0.8, 0.2])


def test_the_module_and_the_cli_take_a_name(tiny_source, tmp_path):
    assert isinstance(PrunedDPO(policy=tiny_source, loss="ipo").loss, LengthNormalized)
    assert isinstance(PrunedDPO(policy=tiny_source, loss=["sigmoid", "sft"]).loss, WeightedLoss)
    from lit_prunedpo.cli import build_cli

    cli = build_cli(["fit", f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=1", "--model.loss=ipo",
                     "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=0"])
    assert isinstance(cli.model.loss, LengthNormalized) and cli.trainer.global_step == 1


@pytest.mark.parametrize("loss_type", ["hinge", "ipo", ["hinge", "sft"]])
def test_label_smoothing_no_loss_type_uses_is_refused(loss_type):
    # TRL 1.16 ignores label_smoothing in hinge and ipo (and every type but robust, exo_pair and the aot ones)
    with pytest.raises(ValueError, match=r"with label_smoothing 0.3: .* not use label_smoothing \(TRL 1.16 ignores it "
                                         r"there\); only sigmoid, robust, exo_pair use it"):
        TRLLoss(loss_type=loss_type, label_smoothing=0.3)
    with pytest.raises(ValueError, match="does not use label_smoothing"):
        trl_loss(loss_type, label_smoothing=0.3)


def test_label_smoothing_ignored_by_some_loss_types_is_said(caplog):
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        loss = TRLLoss(loss_type=["robust", "sft"], label_smoothing=0.1)
        trl_loss("exo_pair")
    assert loss.losses[0].label_smoothing == 0.1
    assert "loss robust, sft with label_smoothing 0.1: used by robust, ignored by sft (as in TRL 1.16)" in caplog.text
    assert "loss exo_pair with label_smoothing 0: epsilon 1e-3, the EXO paper's value" in caplog.text
