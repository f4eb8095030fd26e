"""The loss seam: what each loss declares (margin only? reference?), closed-form partials against autograd, clear
errors, a user's own loss, and the branch estimator's exact unbiasedness for losses that are not margin losses."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo.step.estimate import estimate
from lit_prunedpo.losses import (
    AotLoss, AotUnpairedLoss, ApoZeroLoss, BcoPairLoss, BranchSums, DiscoPopLoss, ExoPairLoss, HingeLoss, IPOLoss,
    LengthNormalized, NcaPairLoss, OddsRatioLoss, PreferenceLoss, RobustLoss, SftLoss, SigmoidLoss,
    SigmoidNormLoss, SimPOLoss, SppoHardLoss, WeightedLoss,
)
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import AllPositions, AntitheticBranch, BothBranches, BranchSampler, FullPrefix, RandomBranch
from lit_prunedpo.testing import synthetic_batch

BETA = 0.4
LENGTHS = torch.tensor([[5, 3], [1, 6], [4, 4], [7, 2]])


def sums(seed=0):
    g = torch.Generator().manual_seed(seed)
    policy = -torch.rand(4, 2, generator=g, dtype=torch.float64) * LENGTHS * 2
    reference = -torch.rand(4, 2, generator=g, dtype=torch.float64) * LENGTHS * 2
    return BranchSums(policy, reference, LENGTHS)


@pytest.mark.parametrize(
    "loss, margin_only, needs_reference",
    [
        (SigmoidLoss(), True, True),
        (IPOLoss(), True, True),
        (DiscoPopLoss(), True, True),
        (WeightedLoss([SigmoidLoss(), HingeLoss()], [1.0, 0.5]), True, True),
        (NcaPairLoss(), False, True),
        (LengthNormalized(SigmoidLoss()), False, True),
        (SimPOLoss(), False, False),
        (OddsRatioLoss(), False, False),
        (SftLoss(), False, False),
        (WeightedLoss([SftLoss(), OddsRatioLoss()]), False, False),
        (WeightedLoss([SigmoidLoss(), SftLoss()]), False, True),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, PreferenceLoss) else str(x),
)
def test_what_each_loss_declares(loss, margin_only, needs_reference):
    assert loss.margin_only is margin_only
    assert loss.needs_reference is needs_reference


def test_a_margin_only_loss_ignores_what_both_branches_share():
    """Adding the same amount to both branches' sums (a shared prefix's log-probs) changes nothing."""
    s = sums()
    shifted = BranchSums(s.policy + torch.tensor([[3.0], [-1.0], [2.0], [0.5]], dtype=torch.float64), s.reference,
                         s.lengths)
    for loss in (SigmoidLoss(0.1), RobustLoss(), ExoPairLoss(), DiscoPopLoss(), IPOLoss()):
        torch.testing.assert_close(loss.per_pair(shifted, BETA), loss.per_pair(s, BETA))
    assert not torch.allclose(NcaPairLoss().per_pair(shifted, BETA), NcaPairLoss().per_pair(s, BETA))


@pytest.mark.parametrize(
    "loss",
    [SigmoidLoss(0.2), RobustLoss(0.2), IPOLoss(), SppoHardLoss(), SftLoss(), LengthNormalized(SigmoidLoss()),
     SigmoidNormLoss(), WeightedLoss([SigmoidLoss(), SftLoss()], [1.0, 0.3])],
    ids=lambda x: type(x).__name__,
)
def test_closed_form_partials_equal_autograd(loss):
    s = sums(1)
    torch.testing.assert_close(loss.policy_partials(s, BETA), PreferenceLoss.policy_partials(loss, s, BETA))


def test_a_user_loss_needs_only_per_pair():
    class ChosenUp(PreferenceLoss):
        def per_pair(self, sums, beta):
            return -beta * sums.log_ratio[:, 0] ** 2

    s = sums()
    want = torch.stack([-2 * BETA * s.log_ratio[:, 0], torch.zeros(4, dtype=torch.float64)], dim=-1)
    torch.testing.assert_close(ChosenUp().policy_partials(s, BETA), want)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: WeightedLoss([]), ValueError, "at least one"),
        (lambda: WeightedLoss([SigmoidLoss(), SftLoss()], [1.0]), ValueError, "2 losses but 1 weights"),
        (lambda: ExoPairLoss(0.0), ValueError, "label_smoothing > 0"),
        (lambda: DiscoPopLoss(tau=0.0), ValueError, "tau"),
        (lambda: SimPOLoss(label_smoothing=0.5), ValueError, "label_smoothing"),
        (lambda: LengthNormalized("sigmoid"), TypeError, "PreferenceLoss"),
        (lambda: AotLoss(), NotImplementedError, "loss_type='aot' sorts log-ratios across the batch"),
        (lambda: AotUnpairedLoss(), NotImplementedError, "aot_unpaired"),
    ],
)
def test_bad_arguments_are_refused_clearly(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("loss", [LengthNormalized(IPOLoss()), SimPOLoss(), OddsRatioLoss(), SftLoss()],
                         ids=lambda x: type(x).__name__)
def test_losses_of_means_need_lengths(loss):
    s = sums()
    with pytest.raises(ValueError, match=f"{type(loss).__name__} needs the full response lengths"):
        loss.per_pair(BranchSums(s.policy, s.reference), BETA)


class ForcedBranch(BranchSampler):
    def __init__(self, mask, like):
        self.mask, self.like = mask, like

    def probabilities(self, num_pairs):
        return self.like.probabilities(num_pairs)

    def draw(self, num_pairs, generator):
        return self.mask


@pytest.mark.parametrize(
    "loss",
    [ApoZeroLoss(), BcoPairLoss(), SigmoidNormLoss(), SimPOLoss(), SftLoss(),
     WeightedLoss([SigmoidLoss(), SftLoss()], [1.0, 0.5])],
    ids=lambda x: type(x).__name__,
)
@pytest.mark.parametrize("branch", [RandomBranch(0.3), AntitheticBranch()], ids=["random0.3", "antithetic-branch"])
def test_branch_pruning_gradient_is_exactly_unbiased(loss, branch):
    """Enumerating every branch choice: the expected surrogate gradient w.r.t. every token log-prob is the loss's
    exact gradient, for losses whose partials differ per branch (and for the NLL, which has none on one)."""
    batch = synthetic_batch(LENGTHS)
    g = torch.Generator().manual_seed(3)
    policy = (-torch.rand(batch.response_ids.shape, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    reference = -torch.rand(batch.response_ids.shape, generator=g, dtype=torch.float64) * 2

    def gradient(sampler):
        plan = plan_step(batch, FullPrefix(), AllPositions(), sampler, torch.Generator())
        at = lambda x, grp: x[grp.pair[grp.scored_row], grp.branch[grp.scored_row], grp.scored_t]  # noqa: E731
        est = estimate(plan, [at(policy, grp) for grp in plan.groups], [at(reference, grp) for grp in plan.groups],
                       loss, BETA, batch.response_lengths)
        return torch.autograd.grad(est.objective, policy)[0]

    want = gradient(BothBranches())
    expected = sum(prob * gradient(ForcedBranch(mask, branch)) for mask, prob in branch.support(batch.num_pairs))
    torch.testing.assert_close(expected, want, rtol=1e-10, atol=1e-12)
    assert want.abs().sum() > 0


def test_a_users_margin_loss_runs_unchanged_through_estimate():
    """A README-style ``MarginLoss`` subclass (only ``value``) gives the built-in DPO's objective and gradient."""
    import torch.nn.functional as F

    from lit_prunedpo.losses import MarginLoss

    class MyDPO(MarginLoss):
        def value(self, margin, beta):
            return -F.logsigmoid(beta * margin)

    batch = synthetic_batch(LENGTHS)
    g = torch.Generator().manual_seed(5)
    policy = (-torch.rand(batch.response_ids.shape, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    reference = -torch.rand(batch.response_ids.shape, generator=g, dtype=torch.float64) * 2
    plan = plan_step(batch, FullPrefix(), AllPositions(), RandomBranch(0.4), torch.Generator().manual_seed(1))
    at = lambda x, grp: x[grp.pair[grp.scored_row], grp.branch[grp.scored_row], grp.scored_t]  # noqa: E731
    results = []
    for loss in (MyDPO(), SigmoidLoss()):
        est = estimate(plan, [at(policy, grp) for grp in plan.groups], [at(reference, grp) for grp in plan.groups],
                       loss, BETA)
        results.append((est.objective.detach(), torch.autograd.grad(est.objective, policy)[0]))
    torch.testing.assert_close(results[0], results[1])
    assert results[0][1].abs().sum() > 0
