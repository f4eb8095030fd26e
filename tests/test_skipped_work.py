"""Proof that skipped work is not done: tokens entering the model body, rows entering the LM head, and no
autograd path through no-grad branches, counted with forward hooks on the real model for every mode."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.samplers import RandomBranch, SharedFractionPrefix
from lit_prunedpo.layout import PairLengths, SharedPromptLayout
from lit_prunedpo.modes import load_mode
from lit_prunedpo.scoring import split_causal_lm

from helpers import MODES as SHIPPED_MODES
from helpers import make_batch, score_groups

# the shipped modes (configs/modes/<name>.yaml)
MODES = {name: load_mode(name).module_kwargs() for name in SHIPPED_MODES}


class Counter:
    """Records every body and head call of one model: tokens in, rows in, and whether grad was on."""

    def __init__(self, model):
        body, head = split_causal_lm(model)
        self.body_calls, self.head_calls = [], []
        body.register_forward_pre_hook(self._body, with_kwargs=True)
        head.register_forward_pre_hook(self._head)

    def _body(self, module, args, kwargs):
        ids = kwargs["input_ids"]
        self.body_calls.append((tuple(ids.shape), torch.is_grad_enabled()))

    def _head(self, module, args):
        self.head_calls.append((args[0].shape[0], torch.is_grad_enabled()))


@pytest.mark.parametrize("shared_prompt", [True, False], ids=["shared", "padded"])
@pytest.mark.parametrize("mode", list(MODES))
def test_counts_match_the_plan(tiny_source, mode, shared_prompt):
    module = PrunedDPO(policy=tiny_source, shared_prompt=shared_prompt, **MODES[mode])
    module.setup("fit")
    module.resolved_layout()  # the conformance probe runs before the counters start
    policy, reference = Counter(module.policy), Counter(module.reference.models()[0])
    batch = make_batch([3, 1, 4, 2], [12, 2, 7, 9], [4, 14, 1, 6], seed=1)
    B, P, T = batch.num_pairs, batch.prompt_width, batch.response_width

    out = module.step(batch)
    plan, est, forwards = out.plan, out.estimate, out.forwards
    laid_out = [f.laid_out for f in forwards.policy]
    width = {id(g): P + int(g.kept.max()) - 1 for g in plan.groups}  # a group's padded width

    # policy: one body call per group, shaped [sequences, width], grad only for the gradient group
    assert len(laid_out) == len(plan.groups)
    assert [c for c in policy.body_calls] == [(f.shape, f.group.requires_grad) for f in laid_out]
    assert sum(r * w for (r, w), _ in policy.body_calls) == forwards.tokens_executed == out.stats.tokens_executed
    # LM head: only the scored positions (a split log-softmax: only those whose log-sum-exp is drawn), same grad mode
    assert policy.head_calls == [(g.num_head_positions, g.requires_grad) for g in plan.groups]
    # reference: one no-grad forward over all rows (one sequence per pair with a shared prompt), same positions
    if shared_prompt:
        assert reference.body_calls == [(forwards.reference.shape, False)]
        assert reference.body_calls[0][0][0] == B
    else:
        assert reference.body_calls == [((2 * B, max(width[id(g)] for g in plan.groups)), False)]
    assert reference.body_calls[0][0][0] * reference.body_calls[0][0][1] == out.stats.reference_tokens_executed
    assert reference.head_calls == [(plan.positions_scored, False)]
    # no autograd path through no-grad branches
    no_grad = ~plan.grad_mask
    assert est.policy_logps.requires_grad
    for i, b in no_grad.nonzero().tolist():
        grad_fn_free = torch.autograd.grad(est.policy_logps[i, b], module.policy.parameters(), allow_unused=True,
                                           retain_graph=True)
        assert all(g is None or bool((g == 0).all()) for g in grad_fn_free)

    unpruned_width = P + T - 1
    if mode == "vanilla":
        unpruned = 2 * B * unpruned_width
        executed = forwards.tokens_executed
        assert len(plan.groups) == 1 and (executed < unpruned if shared_prompt else executed == unpruned)
        assert plan.positions_scored == int(batch.response_lengths.sum())
    if mode in ("branch", "all"):
        assert plan.branches_backpropagated == B
        if shared_prompt:
            # the no-grad rows read their prompts from the gradient forward: at most the prompt's last token (to
            # predict the first response token) reruns, once per row
            no_grad = laid_out[1]
            cached_len, prompt_len = no_grad.cache.cached_len, no_grad.prompt_len
            assert no_grad.reads_previous and bool((cached_len >= prompt_len - 1).all())
            executed = prompt_len + no_grad.group.kept - 1 - cached_len
            assert no_grad.real_tokens == int(executed.sum())
            assert no_grad.real_tokens <= int(batch.response_lengths.sum())
        assert [g.num_rows for g in plan.groups] == [B, B] or mode == "all" and len(plan.groups) == 2
    if mode in ("sequence", "all"):
        assert all(width[id(g)] <= unpruned_width for g in plan.groups)
    if mode in ("position", "position-bernoulli", "all"):
        assert plan.positions_scored < int(batch.response_lengths.sum())
    if mode == "position":  # every position's target logit, the whole head on the drawn quarter only
        assert sum(g.num_scored for g in plan.groups) == int(batch.response_lengths.sum())


def test_sequence_pruning_shrinks_executed_tokens_on_average(tiny_source):
    module = PrunedDPO(policy=tiny_source, prefix_sampler=SharedFractionPrefix(0.5))
    module.setup("fit")
    batch = make_batch([2] * 4, [30, 20, 10, 25], [28, 5, 30, 12], seed=2)
    executor, pairs = module.executor(), PairLengths.of(batch)
    fractions = [executor.forwards(module.plan(batch).groups, pairs).tokens_executed
                 / (2 * 4 * (batch.prompt_width + 29))
                 for _ in range(50)]
    # E[u] = 0.75 for u ~ U[0.5, 1]: executed tokens drop by about a quarter, never above the unpruned step
    assert max(fractions) <= 1.0 and sum(fractions) / len(fractions) < 0.85


def test_no_grad_rows_keep_no_activations(tiny_source):
    """With branch pruning the no-grad group's log-probs carry no graph at all."""
    module = PrunedDPO(policy=tiny_source, branch_sampler=RandomBranch())
    module.setup("fit")
    batch = make_batch([2, 2], [5, 6], [7, 3], seed=4)
    plan = module.plan(batch)
    grad_group, no_grad_group = plan.groups
    assert grad_group.requires_grad and not no_grad_group.requires_grad
    grad_logps, no_grad_logps = score_groups(module.scorer, module.policy, batch, plan.groups, SharedPromptLayout())
    assert grad_logps.grad_fn is not None
    assert no_grad_logps.grad_fn is None  # the prompt cache it read is detached
