"""Designs for near-duplicate pairs: a per-response floor on stratified positions, branch pruning only where a pair's
responses diverge (exact per-pair probabilities), and the bias of the coefficient at the pruned margin; each
proven unbiased by enumeration (or its bias computed exactly) and run through the real planner."""

from __future__ import annotations

import math

import pytest
import torch

from lit_prunedpo.losses.margin import SigmoidLoss
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import (
    AllPositions,
    BernoulliPositions,
    CoupledStratifiedPositions,
    DivergentBranch,
    FullPrefix,
    PerPairBranch,
    StratifiedPositions,
    differing_share,
)
from lit_prunedpo.testing import (
    check_branch_sampler,
    check_position_sampler,
    check_unbiased,
    coefficient_bias,
    synthetic_batch,
)

# --- every response keeps at least min_count scored positions -------------------------------------------------


@pytest.mark.parametrize("sampler", [StratifiedPositions(0.1, min_count=3),
                                     CoupledStratifiedPositions(0.25, min_count=4)],
                         ids=lambda s: f"{type(s).__name__}({s.rate}, {s.min_count})")
def test_min_count_keeps_exact_inclusion_probabilities(sampler):
    report = check_position_sampler(sampler, lengths=(1, 2, 3, 5, 8, 11), num_draws=4000)
    assert report.exact_checks == 18


@pytest.mark.parametrize("L", [1, 2, 3, 5, 8, 40])
def test_min_count_scores_that_many_positions_in_every_draw(L):
    sampler = StratifiedPositions(0.1, min_count=3)
    expected = min(L, max(3, math.ceil(0.1 * L)))
    masks = sampler.draw(torch.full((200,), L), L + 2, torch.Generator().manual_seed(0))
    assert masks.sum(1).tolist() == [expected] * 200
    assert all(int(mask.sum()) == expected for mask, _ in sampler.support(L) if L <= 8)


def test_min_count_one_is_the_shipped_stratified_sampler():
    kept = torch.tensor([1, 3, 7, 40])
    torch.testing.assert_close(StratifiedPositions(0.25, min_count=1).inclusion(kept, 41),
                               StratifiedPositions(0.25).inclusion(kept, 41))


def test_min_count_through_the_planner():
    check_unbiased(position=CoupledStratifiedPositions(0.2, min_count=3),
                   lengths=torch.tensor([[5, 3], [1, 8], [12, 12]]), num_draws=2000)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_min_count_is_validated(bad):
    with pytest.raises(ValueError, match="min_count must be an integer >= 1"):
        StratifiedPositions(0.25, min_count=bad)


# --- branch pruning where the responses diverge ----------------------------------------------------------------


def _responses(*pairs: tuple[list[int], list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for p in pairs for r in p)
    ids = torch.zeros(len(pairs), 2, T, dtype=torch.long)
    mask = torch.zeros(len(pairs), 2, T, dtype=torch.bool)
    for i, p in enumerate(pairs):
        for b, r in enumerate(p):
            ids[i, b, : len(r)], mask[i, b, : len(r)] = torch.tensor(r), True
    return ids, mask


def test_differing_share_by_hand():
    base = [1, 2, 3, 4, 5, 6, 7, 8]
    ids, mask = _responses(
        (base, base),                              # identical: 0
        (base, [1, 2, 3, 9, 5, 6, 7, 8]),          # one substitution: 1/8
        (base, [1, 2, 3, 4, 9, 5, 6, 7, 8]),       # one insertion: 1/9
        (base, [1, 2, 3, 4]),                      # a truncation: 4/8
        (base, [9, 9, 9, 9, 9, 9, 9, 9]),          # unrelated: 1
        ([1, 2, 1], [1, 2, 1, 2, 1]),              # a prefix that is also a suffix: not counted twice
    )
    torch.testing.assert_close(differing_share(ids, mask), torch.tensor([0, 1 / 8, 1 / 9, 4 / 8, 1, 2 / 5],
                                                                        dtype=torch.float64))


def test_divergent_branch_prunes_only_diverging_pairs():
    base = [1, 2, 3, 4, 5, 6, 7, 8]
    ids, mask = _responses((base, [1, 2, 3, 9, 5, 6, 7, 8]), (base, [8, 7, 6, 5, 4, 3, 2, 1]),
                           (base, [1, 2, 3, 4, 9, 9, 9, 9]))
    bound = DivergentBranch(min_difference=0.5, prune_probability=0.8).for_batch(ids, mask)
    assert isinstance(bound, PerPairBranch)
    torch.testing.assert_close(bound.probabilities(3), torch.tensor([[1.0, 1.0], [0.6, 0.6], [0.6, 0.6]],
                                                                    dtype=torch.float64))
    masks = torch.stack([bound.draw(3, torch.Generator().manual_seed(s)) for s in range(200)])
    assert bool(masks[:, 0].all()), "a near-duplicate pair must keep both branches"
    assert bool(masks.any(-1).all()), "every pair back-propagates at least one branch"


@pytest.mark.parametrize("prune", [[0.0, 1.0, 0.5, 0.3, 0.9], [1.0], [0.2, 0.0]])
def test_per_pair_branch_is_exactly_unbiased_by_enumeration(prune):
    report = check_branch_sampler(PerPairBranch(prune), num_pairs=(len(prune),), num_draws=4000)
    assert report.exact_checks == 3


def test_divergent_branch_through_the_planner():
    lengths = torch.tensor([[5, 3], [1, 8], [12, 12]])
    batch = synthetic_batch(lengths, seed=0)  # the batch check_unbiased builds: random tokens, all pairs diverge
    bound = DivergentBranch(0.5, prune_probability=0.7).for_batch(batch.response_ids, batch.response_mask)
    assert bound.prune.tolist() == [0.7, 0.7, 0.7]
    check_unbiased(branch=bound, lengths=lengths, num_draws=2000)
    check_unbiased(position=StratifiedPositions(0.5), branch=PerPairBranch([0.0, 1.0, 0.5]), lengths=lengths,
                   num_draws=2000)


def test_the_planner_binds_a_divergent_branch_to_its_batch():
    batch = synthetic_batch(torch.tensor([[6, 6], [6, 6]]), seed=0)
    # pair 0: the rejected response is the chosen one with its last token changed (a near-duplicate); pair 1 diverges
    batch.response_ids[0, 1] = batch.response_ids[0, 0]
    batch.response_ids[0, 1, 5] = (batch.response_ids[0, 0, 5] + 1) % 7
    plan = plan_step(batch, FullPrefix(), AllPositions(), DivergentBranch(0.5), torch.Generator().manual_seed(0))
    assert plan.branch_prob[0].tolist() == [1.0, 1.0]  # both branches of the near-duplicate, no weight
    assert plan.branch_prob[1].tolist() == [0.5, 0.5] and int(plan.grad_mask[1].sum()) == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(min_difference=-0.1), "min_difference must be in \\[0, 1\\]"),
    (dict(min_difference=1.5), "min_difference must be in \\[0, 1\\]"),
    (dict(prune_probability=0.0), "prune_probability must be in \\(0, 1\\]"),
])
def test_divergent_branch_arguments_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DivergentBranch(**kwargs)


@pytest.mark.parametrize("prune, match", [([], "non-empty"), ([0.5, 1.2], r"prune\[1\] must be in \[0, 1\]"),
                                          ([[0.5]], "non-empty"), ([float("nan")], r"prune\[0\]")])
def test_per_pair_branch_arguments_are_validated(prune, match):
    with pytest.raises(ValueError, match=match):
        PerPairBranch(prune)


def test_per_pair_branch_refuses_another_batch_size():
    with pytest.raises(ValueError, match="holds probabilities for 2 pairs, asked for 3"):
        PerPairBranch([0.5, 0.5]).probabilities(3)


# --- the coefficient at the pruned margin ----------------------------------------------------------------------


def test_coefficient_bias_by_hand():
    """One token per branch, scored with probability p: the estimator is f'(a/p) * 1 with probability p (weight
    1/p) and 0 otherwise, so its mean is f'(a/p) against the exact f'(a), f'(x) = -beta sigmoid(-beta x)."""
    beta, a, p = 0.1, 3.0, 0.5
    result = coefficient_bias(BernoulliPositions(p, min_expected=0), torch.tensor([[a], [0.0]]),
                              torch.tensor([[[1.0]], [[0.0]]]), SigmoidLoss(), beta)
    f = lambda x: -beta / (1 + math.exp(beta * x))  # noqa: E731
    assert result.mean.item() == pytest.approx(f(a / p), abs=1e-12)
    assert result.exact.item() == pytest.approx(f(a), abs=1e-12)
    assert result.bias_norm == pytest.approx(abs(f(a / p) - f(a)), abs=1e-12)
    assert result.variance_exact_coefficient == pytest.approx(f(a) ** 2 * (1 / p - 1), abs=1e-12)


def test_coefficient_bias_is_zero_without_position_pruning():
    g = torch.Generator().manual_seed(0)
    result = coefficient_bias(AllPositions(), torch.randn(2, 4, generator=g), torch.randn(2, 4, 3, generator=g),
                              SigmoidLoss(), 0.1)
    assert result.bias_norm < 1e-12 and result.variance < 1e-20 and result.exact_norm > 0


def test_coefficient_bias_refuses_bad_shapes():
    with pytest.raises(ValueError, match=r"rho \[2, L\] and grads \[2, L, P\]"):
        coefficient_bias(AllPositions(), torch.zeros(2, 4), torch.zeros(2, 3, 1), SigmoidLoss(), 0.1)
