"""The planner: groups, widths, IPW weights 1/(s_t p_t(L)), and contract checks on samplers."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from lit_prunedpo.step.execute import StepExecutor, placeholder_group
from lit_prunedpo.layout import LeftPaddedLayout, PairLengths, SharedPromptLayout
from lit_prunedpo.step.plan import RowGroup, exact_plan, exact_samplers, merge_groups, plan_step
from lit_prunedpo.samplers import (
    AllPositions,
    BernoulliPositions,
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
    padded = StepExecutor(LeftPaddedLayout()).forwards(plan.groups, PairLengths.of(batch))
    assert group.requires_grad and group.num_rows == 4 and padded.policy[0].laid_out.shape == (4, 3 + 5 - 1)
    assert padded.tokens_executed == plan.unpruned_tokens and plan.positions_scored == 4 + 2 + 5 + 1
    assert torch.all(group.weight == 1)


def test_branch_pruning_makes_a_grad_and_a_no_grad_group():
    batch = make_batch([1, 3, 2], [4, 2, 3], [5, 1, 6])
    plan = plan_step(batch, FullPrefix(), AllPositions(), RandomBranch(0.5), torch.Generator().manual_seed(1))
    grad, no_grad = plan.groups
    assert grad.requires_grad and not no_grad.requires_grad
    assert grad.num_rows == no_grad.num_rows == 3
    assert sorted((grad.pair * 2 + grad.branch).tolist()
                  + (no_grad.pair * 2 + no_grad.branch).tolist()) == list(range(6))


def test_a_sampler_breaking_its_contract_is_caught():
    class ScoresPastTheEnd(PositionSampler):
        def inclusion(self, kept, width):
            return torch.ones(kept.shape[0], width, dtype=torch.float64)

        def draw(self, kept, width, generator):
            return torch.ones(kept.shape[0], width, dtype=torch.bool)

    batch = make_batch([1, 1], [4, 2], [3, 3])
    with pytest.raises(RuntimeError, match="past the kept prefix"):
        plan_step(batch, FullPrefix(), ScoresPastTheEnd(), BothBranches(), torch.Generator())


def test_exact_plan_is_the_unpruned_plan():
    batch = make_batch([3, 2], [4, 5], [5, 3])
    (group,) = exact_plan(batch).groups
    assert group.requires_grad and group.pair.tolist() == [0, 0, 1, 1] and group.branch.tolist() == [0, 1, 0, 1]
    assert group.num_scored == int(batch.response_lengths.sum()) and bool((group.weight == 1).all())
    assert [type(s).__name__ for s in exact_samplers()] == ["FullPrefix", "AllPositions", "BothBranches"]


def test_merge_groups_concatenates_every_row_field_and_offsets_scored_rows():
    batch = make_batch([3, 2, 4], [4, 5, 2], [5, 3, 6])
    plan = plan_step(batch, SharedFractionPrefix(0.5), BernoulliPositions(0.5), RandomBranch(0.5),
                     torch.Generator().manual_seed(3))
    grad, nograd = plan.groups
    merged = merge_groups(plan.groups)
    pairs = PairLengths.of(batch)
    width = lambda g: LeftPaddedLayout().arrange(g, pairs).shape[1]  # noqa: E731
    assert not merged.requires_grad and width(merged) == max(width(grad), width(nograd))
    for f in fields(RowGroup):
        value = getattr(merged, f.name)
        if isinstance(value, torch.Tensor) and f.name != "scored_row":
            assert torch.equal(value, torch.cat([getattr(grad, f.name), getattr(nograd, f.name)])), f.name
    assert merged.scored_row.tolist() == grad.scored_row.tolist() + (nograd.scored_row + grad.num_rows).tolist()
    assert merge_groups([grad]) is grad
    # rows that read their prompts from the gradient forward run whole once merged (the online reference's forward)
    cached = StepExecutor(SharedPromptLayout()).forwards(plan.groups, pairs)
    assert cached.policy[1].laid_out.reads_previous and cached.policy[0].keeps_keys_values
    assert not cached.reference.reads_previous and cached.reference.cached_columns == 0
    with_placeholder = merge_groups([grad, placeholder_group(False)])
    assert with_placeholder.num_scored == grad.num_scored


def test_placeholder_and_device_move():
    batch = make_batch([3, 2], [4, 5], [5, 3])
    plan = exact_plan(batch)
    empty = placeholder_group(False)
    width = LeftPaddedLayout().arrange(empty, PairLengths.of(batch)).shape[1]
    assert (empty.num_rows, empty.num_scored, width, empty.requires_grad) == (1, 0, batch.prompt_width, False)
    moved = plan.groups[0].to("meta")
    assert all(getattr(moved, f.name).device.type == "meta" for f in fields(RowGroup)
               if isinstance(getattr(moved, f.name), torch.Tensor))
    assert moved.requires_grad == plan.groups[0].requires_grad
    (group,) = plan.groups
    assert group.to("cpu") is group  # already there: the same group


def test_the_plan_counts_what_the_samplers_kept_apart_from_what_the_layout_skips():
    # pair 0's responses share their first 2 tokens; a margin loss then leaves them unscored: layout work, not pruning
    batch = make_batch([2, 2], [6, 4], [5, 3], seed=0)
    batch.response_ids[0, 1, :2] = batch.response_ids[0, 0, :2]
    lengths = int(batch.response_lengths.sum())
    g = torch.Generator().manual_seed(0)
    whole = plan_step(batch, *exact_samplers(), g)
    assert (whole.kept_positions == whole.drawn_positions == whole.positions_scored == whole.unpruned_positions
            == lengths)
    margin_only = plan_step(batch, *exact_samplers(), g, score_common_prefix=False)
    assert margin_only.kept_positions == margin_only.drawn_positions == lengths
    # pair 0's 2 common tokens are scored once, in the chosen row (both have a gradient), marked shared; the
    # rejected row leaves them out
    assert margin_only.positions_scored == lengths - 2
    (group,) = margin_only.groups
    shared = group.shared.nonzero().flatten()
    assert (group.pair[group.scored_row[shared]].tolist() == [0, 0]
            and group.branch[group.scored_row[shared]].tolist() == [0, 0])
    assert group.scored_t[shared].tolist() == [0, 1]
    pruned = plan_step(batch, SharedFractionPrefix(0.5), BernoulliPositions(0.5), BothBranches(), g)
    assert pruned.kept_positions == sum(int(group.kept.sum()) for group in pruned.groups) <= lengths
    assert pruned.drawn_positions == pruned.positions_scored < pruned.kept_positions  # this seed's draws
