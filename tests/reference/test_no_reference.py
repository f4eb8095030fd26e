"""Reference-free losses run no reference: no frozen copy is built, no reference forward runs (counted), 0
reference tokens are reported; a reference given to such a loss is refused; a reference-using loss may still
run with ``NoReference`` (a uniform reference)."""

from __future__ import annotations

import pytest
import torch

from helpers import REPO
from lit_prunedpo.cli import build_cli
from lit_prunedpo.losses import SftLoss, SigmoidLoss, SimPOLoss, WeightedLoss
from lit_prunedpo.module import PrunedDPO
from lit_prunedpo.reference import NoReference, OnlineReference
from lit_prunedpo.samplers import RandomBranch
from lit_prunedpo.scoring import TokenScorer


class CountingScorer(TokenScorer):
    """The real scorer, counting the models it runs (the module hands it to an online reference too)."""

    def __init__(self):
        self.models = []

    def __call__(self, model, inputs):
        self.models.append(model)
        return super().__call__(model, inputs)


def one_step(module, batch):
    module.setup("fit")
    out = module.step(batch)
    out.estimate.objective.backward()
    return out.plan, out.estimate, out.stats


@pytest.mark.parametrize("loss", [SimPOLoss(), WeightedLoss([SimPOLoss(), SftLoss()], [1.0, 0.5])],
                         ids=["simpo", "simpo+sft"])
def test_no_reference_model_no_reference_forward(tiny_source, small_batch, loss):
    scorer = CountingScorer()
    module = PrunedDPO(policy=tiny_source, loss=loss, scorer=scorer, branch_sampler=RandomBranch())
    assert isinstance(module.reference, NoReference)
    assert all(name.startswith("policy.") for name in module.state_dict()), "a reference copy was built"
    plan, est, stats = one_step(module, small_batch)
    assert len(scorer.models) == len(plan.groups) == 2 and all(m is module.policy for m in scorer.models)
    assert stats.reference_tokens_executed == 0
    assert torch.equal(est.reference_logps, torch.zeros_like(est.reference_logps))
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.policy.parameters())


def test_the_same_count_sees_an_online_reference(tiny_source, small_batch):
    """The counter is not blind: with DPO the reference's forward is the one extra call."""
    scorer = CountingScorer()
    module = PrunedDPO(policy=tiny_source, loss=SigmoidLoss(), scorer=scorer, branch_sampler=RandomBranch())
    plan, _, stats = one_step(module, small_batch)
    assert len(scorer.models) == len(plan.groups) + 1 and scorer.models[-1] is module.reference.models()[0]
    assert stats.reference_tokens_executed > 0


def test_a_reference_for_a_reference_free_loss_is_refused(tiny_source):
    with pytest.raises(ValueError, match="SimPOLoss uses no reference, but model.reference is OnlineReference"):
        PrunedDPO(policy=tiny_source, loss=SimPOLoss(), reference=OnlineReference())


def test_dpo_with_no_reference_uses_the_policy_log_probs_alone(tiny_source, small_batch):
    module = PrunedDPO(policy=tiny_source, loss=SigmoidLoss(), reference=NoReference())
    _, est, _ = one_step(module, small_batch)
    torch.testing.assert_close(est.log_ratio, est.policy_logps.detach())


def test_orpo_overlay_trains_through_the_cli_without_a_reference(tmp_path):
    cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--config",
                     str(REPO / "configs/losses/orpo.yaml"),
                     f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
                     "--trainer.val_check_interval=2", "--trainer.enable_progress_bar=false",
                     "--trainer.enable_model_summary=false", "--data.init_args.max_rows=64"])
    assert cli.trainer.global_step == 2
    assert isinstance(cli.model.reference, NoReference) and cli.model.step_stats.reference_tokens_executed == 0
    assert [type(loss).__name__ for loss in cli.model.loss.losses] == ["SftLoss", "OddsRatioLoss"]
    assert torch.isfinite(cli.trainer.callback_metrics["val/loss"])
