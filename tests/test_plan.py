"""The planner: groups, widths, IPW weights 1/(s_t p_t(L)), and contract checks on samplers."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo.plan import plan_step
from lit_prunedpo.samplers import (
    AllPositions,
    BothBranches,
    FixedCountPositions,
    FullPrefix,
    PositionSampler,
    RandomBranch,
    SharedFractionPrefix,
)

from helpers import make_batch


def test_weights_are_marginal_survival_times_conditional_inclusion():
    batch = make_batch([2, 2], [10, 4], [6, 8], seed=0)
    prefix, position = SharedFractionPrefix(0.5), FixedCountPositions(2)
    plan = plan_step(batch, prefix, position, BothBranches(), torch.Generator().manual_seed(3))
    (group,) = plan.groups
    lengths = batch.response_lengths.reshape(-1)
    survival = prefix.survival(lengths, batch.response_width)
    for k in range(group.num_scored):
        r, t = int(group.scored_row[k]), int(group.scored_t[k])
        row = 2 * int(group.pair[r]) + int(group.branch[r])
        p = min(1.0, 2 / int(group.kept[r]))  # conditional on the kept length L, not on T
        assert float(group.weight[k]) == pytest.approx(1 / (float(survival[row, t]) * p))


def test_vanilla_is_one_concatenated_group():
    batch = make_batch([1, 3], [4, 2], [5, 1])
    plan = plan_step(batch, FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    (group,) = plan.groups
    assert group.requires_grad and group.num_rows == 4 and group.width == 3 + 5 - 1
    assert plan.tokens_executed == plan.unpruned_tokens and plan.positions_scored == 4 + 2 + 5 + 1
    assert torch.all(group.weight == 1)


def test_branch_pruning_makes_a_grad_and_a_no_grad_group():
    batch = make_batch([1, 3, 2], [4, 2, 3], [5, 1, 6])
    plan = plan_step(batch, FullPrefix(), AllPositions(), RandomBranch(0.5), torch.Generator().manual_seed(1))
    grad, no_grad = plan.groups
    assert grad.requires_grad and not no_grad.requires_grad
    assert grad.num_rows == no_grad.num_rows == 3
    assert sorted((grad.pair * 2 + grad.branch).tolist() + (no_grad.pair * 2 + no_grad.branch).tolist()) == list(range(6))


def test_a_sampler_breaking_its_contract_is_caught():
    class ScoresPastTheEnd(PositionSampler):
        def inclusion(self, kept, width):
            return torch.ones(kept.shape[0], width, dtype=torch.float64)

        def draw(self, kept, width, generator):
            return torch.ones(kept.shape[0], width, dtype=torch.bool)

    batch = make_batch([1, 1], [4, 2], [3, 3])
    with pytest.raises(RuntimeError, match="past the kept prefix"):
        plan_step(batch, FullPrefix(), ScoresPastTheEnd(), BothBranches(), torch.Generator())
