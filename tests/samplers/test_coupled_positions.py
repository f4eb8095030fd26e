"""Coupled position samplers (common random numbers across a pair's branches): each row's inclusion
probabilities are exactly the uncoupled sampler's, so the IPW sums and the margin stay unbiased, proven by
enumerating the shared uniforms; and the margin's variance drops where the branches' log-ratios agree."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from lit_prunedpo.samplers import (
    AntitheticBranch,
    BernoulliPositions,
    BothBranches,
    CoupledBernoulliPositions,
    CoupledStratifiedPositions,
    SharedFractionPrefix,
    StratifiedPositions,
)
from lit_prunedpo.testing import check_position_sampler, check_unbiased

COUPLED = [CoupledBernoulliPositions(0.3, 2.0), CoupledBernoulliPositions(0.5, 0.0),
           CoupledStratifiedPositions(0.3), CoupledStratifiedPositions(0.5)]
PAIRS = [(4, 4), (3, 4), (2, 4), (1, 3), (4, 1)]


def _joint(sampler, La: int, Lb: int):
    """Every outcome of one pair's two masks with its probability: the masks depend on each shared uniform
    ``u_c`` only through which of the intervals cut by ``k / s`` (s <= width) and the Bernoulli rates it falls in,
    so the midpoints of those intervals, in every combination, enumerate the support exactly."""
    width = max(La, Lb)
    kept = torch.tensor([La, Lb])
    cuts = {k / s for s in range(1, width + 1) for k in range(s + 1)}
    if isinstance(sampler, BernoulliPositions):
        cuts |= set(sampler._p(kept).tolist())
    cuts = sorted(cuts)
    mids = [(a + b) / 2 for a, b in zip(cuts, cuts[1:])]
    lengths = [b - a for a, b in zip(cuts, cuts[1:])]
    combos = list(itertools.product(range(len(mids)), repeat=width))
    u = torch.tensor([[mids[i] for i in c] for c in combos], dtype=torch.float64).repeat_interleave(2, dim=0)
    prob = torch.tensor([math.prod(lengths[i] for i in c) for c in combos], dtype=torch.float64)
    masks = sampler.masks(u, kept.repeat(len(combos))).view(len(combos), 2, width)
    return masks, prob, sampler.inclusion(kept, width)


@pytest.mark.parametrize("sampler", COUPLED, ids=lambda s: type(s).__name__ + repr(vars(s)))
def test_each_row_keeps_the_uncoupled_inclusion_probabilities(sampler):
    report = check_position_sampler(sampler, lengths=(1, 2, 3, 5, 8, 11), num_draws=8000)
    assert report.exact_checks == 18


@pytest.mark.parametrize("sampler", COUPLED, ids=lambda s: type(s).__name__ + repr(vars(s)))
@pytest.mark.parametrize("La, Lb", PAIRS)
def test_the_margin_estimate_is_exactly_unbiased_over_the_joint_support(sampler, La, Lb):
    masks, prob, p = _joint(sampler, La, Lb)
    assert abs(float(prob.sum()) - 1.0) < 1e-12
    marginal = (prob[:, None, None] * masks).sum(0)
    torch.testing.assert_close(marginal, p, rtol=0, atol=1e-12)
    g = torch.Generator().manual_seed(La * 10 + Lb)
    rho = torch.randn(2, max(La, Lb), generator=g, dtype=torch.float64) * (p > 0)
    r_hat = (masks * rho / p.clamp(min=1e-300)).sum(-1)  # [outcomes, 2]
    margin = (prob * (r_hat[:, 0] - r_hat[:, 1])).sum()
    assert abs(float(margin - (rho[0].sum() - rho[1].sum()))) < 1e-12


@pytest.mark.parametrize("coupled, independent", [
    (CoupledBernoulliPositions(0.3, 0.0), BernoulliPositions(0.3, 0.0)),
    (CoupledStratifiedPositions(0.5), StratifiedPositions(0.5)),
])
def test_equal_log_ratios_cancel_in_the_margin(coupled, independent):
    # A near-duplicate pair: same length, same log-ratio at every position except the edited one (t = 1).
    L = 4
    rho = torch.tensor([[0.3, 1.5, -0.7, 0.9], [0.3, -0.4, -0.7, 0.9]], dtype=torch.float64)
    masks, prob, p = _joint(coupled, L, L)
    delta = (masks * rho / p).sum(-1) @ torch.tensor([1.0, -1.0], dtype=torch.float64)
    truth = float(rho[0].sum() - rho[1].sum())
    var_coupled = float((prob * (delta - truth) ** 2).sum())
    # independent draws: the variances of the two IPW sums add
    support = list(independent.support(L))
    var_row = [sum(q * float(((m * r / p[0]).sum() - r.sum()) ** 2) for m, q in support) for r in rho]
    var_independent = sum(var_row)
    # coupled: only the edited position contributes, (1/p - 1) * (rho_w - rho_l)^2
    expected = float((1 / p[0, 1] - 1) * (rho[0, 1] - rho[1, 1]) ** 2)
    assert abs(var_coupled - expected) < 1e-9
    # independent, the shared positions' terms add up instead of cancelling
    assert var_coupled < var_independent - 1.0


@pytest.mark.parametrize("position", [CoupledBernoulliPositions(0.3, 1.0), CoupledStratifiedPositions(0.4)])
def test_unbiased_end_to_end_through_the_planner(position):
    lengths = torch.tensor([[6, 6], [2, 7], [5, 3]])
    check_unbiased(SharedFractionPrefix(0.5), position, AntitheticBranch(), lengths=lengths, num_draws=1000)


def test_same_length_branches_score_the_same_positions():
    kept = torch.tensor([9, 9, 5, 5])
    for sampler in (CoupledBernoulliPositions(0.3, 0.0), CoupledStratifiedPositions(0.3)):
        masks = sampler.draw(kept.repeat(50), 9, torch.Generator().manual_seed(0))
        assert torch.equal(masks[0::2], masks[1::2])
        assert not torch.equal(masks[0::4], masks[2::4])  # different pairs draw independently


def test_an_odd_number_of_rows_is_refused():
    with pytest.raises(ValueError, match="pairs.*3 rows"):
        CoupledBernoulliPositions().draw(torch.tensor([3, 4, 5]), 5, torch.Generator())
