"""The executor: what it decides (layout, keys and values reused, the reference's forward) and its typed output."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo_lab.bench import cost
from lit_prunedpo.step.execute import StepExecutor, StepLogps, keeps_keys_values, layout_for
from lit_prunedpo.layout import PackedGroup, LeftPaddedGroup, LeftPaddedLayout, PairLengths, SharedPromptLayout
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.reference import NoReference
from lit_prunedpo.samplers import AllPositions, RandomBranch, SharedFractionPrefix

from helpers import make_batch


def branch_plan(batch, seed=0):
    return plan_step(batch, SharedFractionPrefix(0.5), AllPositions(), RandomBranch(0.5),
                     torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shared_prompt", [True, False], ids=["shared", "padded"])
def test_one_log_prob_tensor_per_plan_group_for_policy_and_reference(tiny_source, shared_prompt):
    module = PrunedDPO(policy=tiny_source, shared_prompt=shared_prompt)
    batch = make_batch([3, 1, 2], [5, 2, 4], [3, 6, 1], seed=1)
    plan = branch_plan(batch)
    out = module.executor()(module.policy, module.scorer, module.reference, batch, plan)
    assert isinstance(out, StepLogps) and len(out.policy) == len(out.reference) == len(plan.groups) == 2
    assert [p.numel() for p in out.policy] == [r.numel() for r in out.reference] == [g.num_scored for g in plan.groups]
    assert out.policy[0].requires_grad and not out.policy[1].requires_grad and not out.reference[0].requires_grad
    assert out.reference_tokens_executed == out.forwards.reference.tokens > 0
    expected = PackedGroup if shared_prompt else LeftPaddedGroup
    assert all(isinstance(f.laid_out, expected) for f in out.forwards.policy)
    assert isinstance(out.forwards.reference, expected) and not out.forwards.reference.reads_previous


def test_a_reference_that_runs_no_model_is_asked_for_its_log_probs(tiny_source):
    module = PrunedDPO(policy=tiny_source, reference=NoReference(), loss=None)
    batch = make_batch([2, 2], [4, 3], [2, 5], seed=2)
    plan = branch_plan(batch)
    out = module.executor()(module.policy, module.scorer, NoReference(), batch, plan)
    assert out.reference_tokens_executed == 0 and all(not bool(r.any()) for r in out.reference)


def test_keys_and_values_are_reused_only_when_asked_and_the_layout_can():
    batch = make_batch([3, 2, 4], [5, 4, 6], [6, 3, 5], seed=3)
    plan, pairs = branch_plan(batch), PairLengths.of(batch)
    reads = lambda executor: [f.laid_out.reads_previous for f in executor.forwards(plan.groups, pairs).policy]  # noqa: E731
    keeps = lambda executor: [f.keeps_keys_values for f in executor.forwards(plan.groups, pairs).policy]  # noqa: E731
    assert reads(StepExecutor(SharedPromptLayout(), reuse_keys_values=True)) == [False, True]
    assert keeps(StepExecutor(SharedPromptLayout(), reuse_keys_values=True)) == [True, False]
    assert reads(StepExecutor(SharedPromptLayout(), reuse_keys_values=False)) == [False, False]
    assert reads(StepExecutor(LeftPaddedLayout(), reuse_keys_values=True)) == [False, False]
    # reading the gradient forward's prompts runs fewer tokens, never more
    cached = StepExecutor(SharedPromptLayout(), reuse_keys_values=True).forwards(plan.groups, pairs)
    whole = StepExecutor(SharedPromptLayout(), reuse_keys_values=False).forwards(plan.groups, pairs)
    assert cached.real_tokens_executed < whole.real_tokens_executed


def test_gradient_checkpointing_turns_the_reuse_off(tiny_source):
    assert keeps_keys_values(PrunedDPO(policy=tiny_source).policy)
    module = PrunedDPO(policy=tiny_source, gradient_checkpointing=True)
    assert not keeps_keys_values(module.policy) and not module.executor().reuse_keys_values
    assert isinstance(layout_for(True), SharedPromptLayout) and isinstance(layout_for(False), LeftPaddedLayout)


def test_a_bare_plan_is_costed_as_the_padded_layout_runs_it():
    batch = make_batch([3, 2, 4], [5, 4, 6], [6, 3, 5], seed=3)
    plan = branch_plan(batch)
    dims = cost.ModelDims(body_params=1000, hidden_size=8, vocab_size=100, num_layers=2, attention_dim=8)
    padded = StepExecutor(LeftPaddedLayout()).forwards(plan.groups, PairLengths.of(batch))
    assert cost.step_flops(plan, dims) == cost.step_flops(padded, dims)
    P = batch.prompt_width
    assert [f.laid_out.shape for f in padded.policy] == [(3, P + int(g.kept.max()) - 1) for g in plan.groups]


def test_the_left_padded_layouts_old_name_still_builds_it_and_says_so():
    from lit_prunedpo.layout import LeftPaddedLayout, PaddedLayout

    with pytest.warns(FutureWarning, match="now LeftPaddedLayout"):
        layout = PaddedLayout()
    assert isinstance(layout, LeftPaddedLayout)
