"""Shared-prompt execution equals the padded layout exactly, and runs each prompt once.

Exactness: the same module and sampler seed with ``shared_prompt`` on and off give the same loss, per-branch
estimates and policy gradients (float32, ``atol=1e-5, rtol=1e-4``), for every mode of ``configs/``, with left
padding (prompts of different lengths), right padding (responses of different lengths, longer chosen or
longer rejected), common prefixes of every length (none, part, all but the last token of one response),
one-token responses, the chunked scorer, eager attention and gradient checkpointing; and with the no-grad rows
reading their prompts from the gradient forward's keys and values (``reuse_keys_values``).
"""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.step.estimate import ipw_sums
from lit_prunedpo.models import FromConfig
from lit_prunedpo.modes import load_mode
from lit_prunedpo.step.execute import StepExecutor, layout_for
from lit_prunedpo.layout import PairLengths, RightPaddedLayout, SharedPromptLayout
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import (
    AllPositions,
    AntitheticBranch,
    BernoulliPositions,
    BothBranches,
    FullPrefix,
    RandomBranch,
    SharedFractionPrefix,
    StratifiedPositions,
)
from lit_prunedpo.scoring import split_causal_lm
from lit_prunedpo.layout.attention import check_attention
from lit_prunedpo.layout.packed import packed_layout
from lit_prunedpo.step.plan import prompt_and_common_lengths

from helpers import TINY_LLAMA, make_batch, score_groups, score_policy

TOL = dict(atol=1e-5, rtol=1e-4)

# the shipped vanilla and branch modes, and prefix/position samplers at lower rates than the shipped modes' (a
# deeper cut, more positions skipped), so that a small batch draws real pruning
ALL_THREE = "prefix 0.3 + stratified 0.5 + antithetic"
MODES = {
    **{name: load_mode(name).module_kwargs() for name in ("vanilla", "branch")},
    "prefix 0.3": dict(prefix_sampler=SharedFractionPrefix(0.3)),
    "bernoulli 0.4": dict(position_sampler=BernoulliPositions(0.4, 1.0)),
    ALL_THREE: dict(prefix_sampler=SharedFractionPrefix(0.3), position_sampler=StratifiedPositions(0.5),
                    branch_sampler=AntitheticBranch()),
}


def padded_everywhere():
    """Prompts of 1-5 tokens (left padding in all but one row), responses of 1-9 tokens (right padding on
    either branch), and common prefixes: none, two tokens, all of the shorter response but its last token."""
    batch = make_batch([3, 1, 5, 2, 4], [9, 1, 6, 4, 3], [4, 7, 6, 8, 1], seed=3)
    ids = batch.response_ids
    ids[0, 1, :2] = ids[0, 0, :2]          # pair 0: 2 common tokens
    ids[2, 1, :5] = ids[2, 0, :5]          # pair 2: equal lengths, differ only at the last token
    ids[3, 0, :3] = ids[3, 1, :3]          # pair 3: chosen = rejected's first 3 tokens, then differs
    ids[3, 0, 3] = (ids[3, 1, 3] % 31) + 1
    return batch


def run(module, batch, seed, shared_prompt, prompt_cache=False, score_common_prefix=True):
    """One step of ``module`` on ``batch`` with the plan drawn from ``seed``, executed in the given layout (with or
    without the no-grad forward reading the gradient forward's keys and values)."""
    module.zero_grad()
    samplers = module.prefix_sampler, module.position_sampler, module.branch_sampler
    plan = plan_step(batch, *samplers, torch.Generator().manual_seed(seed), score_common_prefix=score_common_prefix)
    executor = StepExecutor(layout_for(shared_prompt), reuse_keys_values=prompt_cache)
    logps = executor(module.policy, module.scorer, module.reference, batch, plan)
    est = module.estimate(batch, plan, logps)
    est.objective.backward()
    grads = {n: p.grad.detach().clone() for n, p in module.policy.named_parameters() if p.grad is not None}
    return plan, logps.forwards, est, grads


def assert_same_step(source, batch, seeds=(0, 1, 2), prompt_cache=True, **kwargs):
    """The same draws executed in the shared-prompt layout (with and without the prompt cache) and the padded
    layout give the same step."""
    module = PrunedDPO(policy=source, **kwargs)
    for seed in seeds:
        plan_p, run_p, est_p, grads_p = run(module, batch, seed, shared_prompt=False)
        plan_s, run_s, est_s, grads_s = run(module, batch, seed, shared_prompt=True)
        assert plan_s.positions_scored == plan_p.positions_scored
        assert run_s.tokens_executed < run_p.tokens_executed
        assert_same_estimate(est_s, est_p, grads_s, grads_p)
        if not prompt_cache:
            continue
        # the common prefix scored (the no-grad rows rerun the prompt's last token) or not (a margin loss's plan:
        # they rerun the last token the pair's rows share)
        for score_common_prefix in (True, False):
            if not score_common_prefix:
                plan_p, run_p, est_p, grads_p = run(module, batch, seed, shared_prompt=False, score_common_prefix=False)
            plan_c, run_c, est_c, grads_c = run(module, batch, seed, shared_prompt=True, prompt_cache=True,
                                                score_common_prefix=score_common_prefix)
            assert plan_c.positions_scored == plan_p.positions_scored
            assert run_c.real_tokens_executed <= run_s.real_tokens_executed
            if len(plan_c.groups) == 2:  # the no-grad rows read their prompts from the gradient forward
                assert run_c.policy[1].laid_out.reads_previous and run_c.policy[0].keeps_keys_values
                assert run_c.real_tokens_executed < run_s.real_tokens_executed
            assert_same_estimate(est_c, est_p, grads_c, grads_p)


def assert_same_estimate(est_s, est_p, grads_s, grads_p):
    torch.testing.assert_close(est_s.objective, est_p.objective, **TOL)
    torch.testing.assert_close(est_s.margin, est_p.margin, **TOL)
    torch.testing.assert_close(est_s.policy_logps.detach(), est_p.policy_logps.detach(), **TOL)
    torch.testing.assert_close(est_s.reference_logps, est_p.reference_logps, **TOL)
    assert grads_s.keys() == grads_p.keys() and grads_s
    for name in grads_s:
        torch.testing.assert_close(grads_s[name], grads_p[name], **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_equals_the_padded_layout(tiny_source, mode):
    assert_same_step(tiny_source, padded_everywhere(), **MODES[mode])


@pytest.mark.parametrize("mode", ["vanilla", ALL_THREE])
def test_chunked_scorer_and_gradient_checkpointing_equal_the_padded_layout(tiny_source, mode):
    # gradient checkpointing keeps no keys and values: no prompt cache there (test below)
    assert_same_step(tiny_source, padded_everywhere(), seeds=(0, 1), scorer=ChunkedScorer(chunk_size=5),
                     gradient_checkpointing=True, prompt_cache=False, **MODES[mode])


@pytest.mark.parametrize("mode", ["branch", ALL_THREE])
def test_chunked_scorer_reads_the_prompt_cache(tiny_source, mode):
    assert_same_step(tiny_source, padded_everywhere(), seeds=(0, 1), scorer=ChunkedScorer(chunk_size=5),
                     **MODES[mode])


def test_gradient_checkpointing_reuses_no_keys_and_values_and_asking_to_fails_clearly(tiny_source):
    module = PrunedDPO(policy=tiny_source, gradient_checkpointing=True, **MODES["branch"])
    batch = padded_everywhere()
    plan, pairs = module.plan(batch), PairLengths.of(batch)
    forwards = module.executor().forwards(plan.groups, pairs)
    assert len(forwards.policy) == 2 and not forwards.policy[1].laid_out.reads_previous
    reusing = StepExecutor(SharedPromptLayout(), reuse_keys_values=True)
    with pytest.raises(RuntimeError, match="kept no keys and values.*reuse_keys_values=False"):
        reusing(module.policy, module.scorer, module.reference, batch, plan)
    other = PrunedDPO(policy=tiny_source, **MODES["branch"])
    assert other.executor().forwards(plan.groups, pairs).policy[1].laid_out.reads_previous


def test_eager_attention_equals_the_padded_layout():
    source = FromConfig("llama", {**TINY_LLAMA, "attn_implementation": "eager"}, seed=0)
    assert source.build().config._attn_implementation == "eager"
    assert_same_step(source, padded_everywhere(), seeds=(0,), **MODES[ALL_THREE])


def test_validation_step_is_the_same_exact_objective(tiny_source):
    batch = padded_everywhere()
    values = []
    for shared in (True, False):
        module = PrunedDPO(policy=tiny_source, shared_prompt=shared, **MODES[ALL_THREE])
        plan = plan_step(batch, FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
        values.append(module.execute_and_estimate(batch, plan))
    torch.testing.assert_close(values[0].loss, values[1].loss, **TOL)
    torch.testing.assert_close(values[0].policy_logps, values[1].policy_logps, **TOL)


def test_layout_by_hand():
    """Pair 0: prompt of 2, chosen (5 kept) and rejected (3 kept) share 2 tokens; pairs 1 and 2 one row each."""
    layout = packed_layout(
        pair=torch.tensor([0, 0, 1, 2]), kept=torch.tensor([5, 3, 2, 1]),
        prompt_len=torch.tensor([2, 2, 3, 2]), common_len=torch.tensor([2, 2, 0, 0]),
    )
    # pair 0: prompt 2 + shared 2 + chosen's own 4 - 2 = 2 + rejected's own 2 - 2 = 0 -> 6; pair 1: 3 + 1; pair 2: 2
    assert layout.pair_len.tolist() == [6, 4, 2] and layout.width == 6
    # first fit decreasing: pair 2 fills the end of pair 1's sequence
    assert layout.pair_seq.tolist() == [0, 1, 1] and layout.pair_start.tolist() == [0, 0, 4]
    assert layout.seq_len.tolist() == [6, 6] and layout.num_sequences == 2 and layout.real_tokens == 12
    assert layout.row_start.tolist() == [4, 6, 3, 6] and layout.row_len.tolist() == [2, 0, 1, 0]
    assert layout.shared.tolist() == [2, 2, 0, 0]


def test_two_pairs_in_one_sequence_do_not_see_each_other():
    batch = make_batch([3, 1, 1], [4, 2, 1], [2, 1, 2], seed=5)
    plan = plan_step(batch, FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    (group,) = plan.groups
    laid_out = SharedPromptLayout().arrange(group, PairLengths.of(batch))
    inputs = laid_out.inputs(batch)
    # pair 0: 3 + 3 + 1 = 7 tokens, alone; pairs 1 and 2: 1 + 1 + 0 and 1 + 0 + 1 tokens, together
    assert inputs.input_ids.shape == (2, 7) and laid_out.real_tokens == 11
    assert inputs.position_ids[1, :4].tolist() == [0, 1, 0, 1]
    mask = inputs.attention_mask[1, 0]
    assert not mask[2:4, :2].any() and mask[3, 2:4].tolist() == [True, True] and mask[1, :2].tolist() == [True, True]
    assert inputs.gather_row.tolist().count(1) == 3 + 3  # both pairs' scored positions read sequence 1


def test_inputs_mask_and_gather_by_hand():
    batch = make_batch([2, 1], [4, 2], [3, 3], seed=0)
    batch.response_ids[0, 1, 0] = batch.response_ids[0, 0, 0]  # pair 0 shares one response token
    plan = plan_step(batch, FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    (group,) = plan.groups
    inputs = SharedPromptLayout().arrange(group, PairLengths.of(batch)).inputs(batch)
    x, y = batch.prompt_ids[0, -2:].tolist(), batch.response_ids[0].tolist()
    # [prompt(2) | shared y0 | chosen y1 y2 | rejected y1]: the last kept token of each row only a target
    assert inputs.input_ids[0].tolist() == x + [y[0][0], y[0][1], y[0][2], y[1][1]]
    assert inputs.position_ids[0].tolist() == [0, 1, 2, 3, 4, 3]
    mask = inputs.attention_mask[0, 0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 1],  # the rejected segment sees the trunk and itself, not the chosen segment
    ]
    # pair 1: prompt 1 | chosen y0 | rejected y0 y1 | one pad column that attends itself only
    x1, z = batch.prompt_ids[1, -1:].tolist(), batch.response_ids[1].tolist()
    assert inputs.input_ids[1, :4].tolist() == x1 + [z[0][0], z[1][0], z[1][1]]
    assert inputs.position_ids[1, :4].tolist() == [0, 1, 1, 2]
    assert inputs.attention_mask[1, 0, 4].int().tolist() == [0, 0, 0, 0, 1, 0]
    # chosen of pair 0 scores t = 0..3 from columns 1 (prompt end), 2 (shared), 3, 4; rejected 1, 2, 5
    pair0 = inputs.gather_row == 0
    assert inputs.gather_col[pair0].tolist() == [1, 2, 3, 4, 1, 2, 5]
    assert inputs.targets[pair0].tolist() == y[0][:4] + y[1][:3]


def test_common_prefix_lengths():
    batch = padded_everywhere()
    prompt_len, common = prompt_and_common_lengths(batch)
    assert prompt_len.tolist() == [3, 1, 5, 2, 4]
    assert common[[0, 2, 3]].tolist() == [2, 5, 3]


def test_each_prompt_runs_once_in_the_reference_and_the_vanilla_policy(tiny_source):
    """Forward-hook count: the bodies receive each pair's real prompt once and no left padding."""
    module = PrunedDPO(policy=tiny_source)
    batch = padded_everywhere()
    module.resolved_layout()  # the conformance probe runs before the hooks count
    seen = []
    for model in (module.policy, *module.reference.models()):
        split_causal_lm(model)[0].register_forward_pre_hook(
            lambda m, a, kw: seen.append(kw["input_ids"].clone()), with_kwargs=True
        )
    plan = module.plan(batch)
    logps = module.execute(batch, plan)
    forwards = logps.forwards
    policy_ids, reference_ids = seen
    prompt_len, common = prompt_and_common_lengths(batch)
    lengths = batch.response_lengths
    # per pair: prompt + common prefix + each response's remaining input tokens (its last token only a target)
    real = prompt_len + common + (lengths - 1 - common[:, None]).sum(-1)
    assert policy_ids.shape == reference_ids.shape and policy_ids.shape[1] == int(real.max())
    assert policy_ids.shape[0] <= batch.num_pairs
    assert forwards.real_tokens_executed == int(real.sum()) == forwards.reference.real_tokens
    assert logps.reference_tokens_executed == reference_ids.numel() == forwards.tokens_executed
    padded_module = PrunedDPO(policy=tiny_source, shared_prompt=False)
    padded = padded_module.executor().forwards(padded_module.plan(batch).groups, PairLengths.of(batch))
    # the padded layout runs 2B rows of P + T - 1 columns; each prompt twice, with its left padding
    assert padded.tokens_executed == 2 * batch.num_pairs * (batch.prompt_width + batch.response_width - 1)
    saved = padded.real_tokens_executed - forwards.real_tokens_executed
    assert saved == int((prompt_len + common).sum())


def test_branch_pruning_keeps_the_no_grad_branch_out_of_backward(tiny_source):
    module = PrunedDPO(policy=tiny_source, branch_sampler=RandomBranch())
    batch = padded_everywhere()
    plan = module.plan(batch)
    grad_group, no_grad_group = plan.groups
    logps = score_groups(module.scorer, module.policy, batch, plan.groups, SharedPromptLayout())
    assert logps[0].grad_fn is not None and logps[1].grad_fn is None
    # alone in its forward, a group reads no other forward's keys and values
    assert score_policy(module, batch, no_grad_group).grad_fn is None
    # without the prompt cache each prompt runs once per group, so twice in the step's policy forwards
    prompt_len, common = prompt_and_common_lengths(batch)
    lengths = batch.response_lengths[torch.arange(batch.num_pairs)[:, None], plan.grad_mask.long().argsort(-1)]
    uncached = plan_step(batch, FullPrefix(), AllPositions(), RandomBranch(), torch.Generator())
    assert torch.equal(uncached.grad_mask, plan.grad_mask)  # the same draw (one generator draw, seed 0 both)
    forwards = StepExecutor(SharedPromptLayout(), reuse_keys_values=False).forwards(uncached.groups,
                                                                                    PairLengths.of(batch))
    for forward, rows in zip(forwards.policy, (lengths[:, 1], lengths[:, 0]), strict=True):
        assert forward.laid_out.real_tokens == int((prompt_len + rows - 1).sum())
    assert score_policy(module, batch, uncached.groups[1]).grad_fn is None


def test_the_no_grad_forward_runs_no_prompt_tokens(tiny_source):
    """Forward-hook count, branch pruning: the no-grad body receives, per pair, the last token the gradient forward
    shares with it (prompt end or shared response token) and the rest of its own response, nothing else."""
    module = PrunedDPO(policy=tiny_source, branch_sampler=RandomBranch())
    batch = padded_everywhere()
    module.resolved_layout()  # the conformance probe runs before the hooks count
    seen = []
    split_causal_lm(module.policy)[0].register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["input_ids"].clone(), kw["position_ids"].clone())), with_kwargs=True
    )
    plan = module.plan(batch)
    logps = module.execute(batch, plan)
    est = module.estimate(batch, plan, logps)
    no_grad_forward = logps.forwards.policy[1].laid_out
    (grad_ids, _), (no_grad_ids, no_grad_positions) = seen
    prompt_len, common = prompt_and_common_lengths(batch)
    lengths = batch.response_lengths
    kept_branch = plan.grad_mask.long().argmax(-1)
    own = lengths[torch.arange(batch.num_pairs), 1 - kept_branch] - 1
    grad_own = lengths[torch.arange(batch.num_pairs), kept_branch] - 1
    # the margin loss scores from the first differing token on, predicted by the last shared input token
    first = torch.minimum(common, own + 1)
    k = prompt_len - 1 + torch.minimum(torch.minimum(torch.minimum(common, grad_own) + 1, own), first)
    assert no_grad_forward.cache.cached_len.tolist() == k.tolist()
    assert int((no_grad_ids != 0).sum()) <= int((prompt_len + own - k).sum()) == no_grad_forward.real_tokens
    assert bool((k >= prompt_len - 1).all())  # at most the prompt's last token runs again
    assert no_grad_positions.max() == int((prompt_len + own).max()) - 1
    # and the step equals the padded layout's
    padded = PrunedDPO(policy=tiny_source, branch_sampler=RandomBranch(), shared_prompt=False)
    padded.load_state_dict(module.state_dict())
    plan_p = plan_step(batch, FullPrefix(), AllPositions(), RandomBranch(), torch.Generator())
    assert torch.equal(plan_p.grad_mask, plan.grad_mask)
    est_p = padded.execute_and_estimate(batch, plan_p)
    torch.testing.assert_close(est.margin, est_p.margin, **TOL)


def test_unsupported_attention_is_refused(tiny_source):
    model = tiny_source.build()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"attn_implementation='flash_attention_2'.*LeftPaddedLayout"):
        check_attention(model)

    class Flash(FromConfig):
        def build(self):
            return model

    strict = PrunedDPO(policy=Flash("llama", TINY_LLAMA), layout=SharedPromptLayout(), strict_layout=True)
    with pytest.raises(ValueError, match="attention implementation 'flash_attention_2' takes no custom 4-D mask"):
        strict.resolved_layout()
    # the automatic layout passes over the packed one (flash attention itself cannot run on a CPU: not probed here)
    auto = PrunedDPO(policy=Flash("llama", TINY_LLAMA), check_layout=False)
    assert isinstance(auto.resolved_layout(), RightPaddedLayout)


# ------------------------------------------------------------------ the common prefix is scored once
def test_margin_loss_scores_the_common_prefix_once_with_the_same_sums_loss_and_gradients(tiny_source):
    """Vanilla: the module with a shared prompt (common prefix scored once, counted in both branches) equals the
    padded module scoring it in both rows: the same per-branch sums (TRL's ``logps/*``), loss and gradients."""
    batch = padded_everywhere()
    _, common = prompt_and_common_lengths(batch)
    steps = []
    for shared in (True, False):
        module = PrunedDPO(policy=tiny_source, shared_prompt=shared)
        module.zero_grad()
        plan = module.plan(batch)
        est = module.execute_and_estimate(batch, plan)
        est.objective.backward()
        grads = {n: p.grad.detach().clone() for n, p in module.policy.named_parameters()}
        steps.append((plan, est, grads))
    (plan_s, est_s, grads_s), (plan_p, est_p, grads_p) = steps
    assert plan_p.positions_scored - plan_s.positions_scored == int(common.sum())
    torch.testing.assert_close(est_s.objective, est_p.objective, **TOL)
    torch.testing.assert_close(est_s.margin, est_p.margin, **TOL)
    torch.testing.assert_close(est_s.policy_logps, est_p.policy_logps, **TOL)
    torch.testing.assert_close(est_s.log_ratio, est_p.log_ratio, **TOL)
    for name in grads_s:
        torch.testing.assert_close(grads_s[name], grads_p[name], **TOL, msg=lambda m: f"{name}: {m}")


def test_scoring_the_common_prefix_once_keeps_every_sum_unbiased():
    """Monte Carlo through the real planner (all three samplers): with equal log-ratios on the common prefix, as
    a causal LM gives, ``E[R_hat_w - R_hat_l]`` and the branch-weighted direction have mean ``R_w - R_l``, and each
    branch's sum ``E[R_hat_b]`` has mean ``R_b`` (the common part scored in one row, counted in both)."""
    batch = padded_everywhere()
    _, common = prompt_and_common_lengths(batch)
    g = torch.Generator().manual_seed(0)
    rho = torch.randn(batch.response_ids.shape, generator=g, dtype=torch.float64) * batch.response_mask
    shared = torch.arange(batch.response_width)[None, :] < common[:, None]
    rho[:, 1] = torch.where(shared, rho[:, 0], rho[:, 1])
    target = rho[:, 0].sum(-1) - rho[:, 1].sum(-1)
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64)
    samplers = SharedFractionPrefix(0.3), StratifiedPositions(0.5), RandomBranch(0.5)
    margins, directions, sums = [], [], []
    for _ in range(600):
        plan = plan_step(batch, *samplers, g, score_common_prefix=False)
        for grp in plan.groups:  # in the common start, only the positions scored for both branches
            assert bool(((grp.scored_t >= common[grp.pair[grp.scored_row]]) | grp.shared).all())
        scored = [rho[grp.pair[grp.scored_row], grp.branch[grp.scored_row], grp.scored_t] for grp in plan.groups]
        r_hat = ipw_sums(plan, scored, batch.num_pairs)
        margins.append(r_hat[:, 0] - r_hat[:, 1])
        directions.append((plan.grad_mask * sign * r_hat / plan.branch_prob).sum(-1))
        sums.append(r_hat.flatten())
    for draws, expected in ((torch.stack(margins), target), (torch.stack(directions), target),
                            (torch.stack(sums), rho.sum(-1).flatten())):
        stderr = draws.std(0) / len(draws) ** 0.5
        assert bool(((draws.mean(0) - expected).abs() <= 5 * stderr + 1e-9).all()), (draws.mean(0), expected)


def test_a_loss_that_is_not_a_margin_loss_scores_the_common_prefix(tiny_source):
    from lit_prunedpo.losses import NcaPairLoss, SigmoidLoss, WeightedLoss

    # NCA anchors each branch's reward on its own: the shared tokens do not cancel, so every position is scored;
    # a weighted sum is margin-only only when every part is
    mixed = WeightedLoss([SigmoidLoss(), NcaPairLoss()], [1.0, 0.5])
    assert not NcaPairLoss().margin_only and not mixed.margin_only and SigmoidLoss().margin_only
    batch = padded_everywhere()
    margin_plan = PrunedDPO(policy=tiny_source).plan(batch)
    other_plan = PrunedDPO(policy=tiny_source, loss=mixed).plan(batch)
    assert other_plan.positions_scored == int(batch.response_lengths.sum()) > margin_plan.positions_scored


def test_a_scorer_that_overrides_call_gets_the_cache_through_its_inputs(tiny_source):
    """The cache travels in ``GroupInputs.cache``: a scorer subclass with the plain ``__call__(model, inputs)``
    signature serves the cached plan unchanged (the gradient forward fills the cache the no-grad one reads)."""
    from lit_prunedpo.scoring import TokenScorer

    class Recording(TokenScorer):
        def __init__(self):
            self.inputs = []

        def __call__(self, model, inputs):
            self.inputs.append(inputs)
            return super().__call__(model, inputs)

    scorer = Recording()
    module = PrunedDPO(policy=tiny_source, scorer=scorer, branch_sampler=RandomBranch())
    batch = padded_everywhere()
    est = module.execute_and_estimate(batch, module.plan(batch))
    grad_inputs, no_grad_inputs = scorer.inputs[:2]
    assert grad_inputs.past is None and grad_inputs.cache is not None and grad_inputs.cache.get_seq_length() > 0
    assert no_grad_inputs.past is not None
    C = no_grad_inputs.past.seq.shape[1]
    assert no_grad_inputs.cache.get_seq_length() == C + no_grad_inputs.input_ids.shape[1]  # cached + its own
    assert torch.isfinite(est.objective)
