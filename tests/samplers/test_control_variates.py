"""The control-variate position samplers (``ExactTargetLogits``, ``ReferenceLogSumExp``), through the real step.

* exactly unbiased by enumeration: every outcome of the prefix and position draws of a batch of 2 pairs, weighted
  by its probability, through the real ``plan_step``, executor and ``estimate``: ``E[P_hat]`` is the plain forward's
  sum of log-probs and ``E[grad P_hat]`` its gradient (also with a shared common start, for the margin);
* an independent implementation: everything drawn (rate 1) equals the plain Hugging Face forward's sums, also
  through a model's logit transform (Gemma 2's soft-cap);
* the saving: the whole LM head runs on the drawn positions only, the target logit on every executed one;
* the refusals: an online reference with ``ReferenceLogSumExp``, a head whose target logit is not one row of a
  linear layer.

Enumeration is exact, but the scorers compute in float32: values and gradients agree to ``atol=2e-6, rtol=1e-6``
(sums of a few log-probs of magnitude ~3, IPW weights up to 5).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import warnings

import pytest
import torch

from helpers import Built, ForcedPositions, ForcedPrefix, TINY_LLAMA, make_batch
from lit_prunedpo import PrunedDPO
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.guards import check_log_softmax_split
from lit_prunedpo.layout import LeftPaddedLayout, SharedPromptLayout
from lit_prunedpo.models import FromConfig
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.reference import CachedReference, compute_reference_logps
from lit_prunedpo.samplers import (
    AllPositions, BothBranches, CoupledStratifiedPositions, ExactTargetLogits, FixedCountPositions, FullPrefix,
    LogSoftmaxSplit, RandomBranch, ReferenceLogSumExp, SharedFractionPrefix,
    StratifiedPositions,
)
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.testing import check_position_sampler, check_step_unbiased, check_unbiased

TOL = dict(atol=2e-6, rtol=1e-6)
ESTIMATORS = (ExactTargetLogits, ReferenceLogSumExp)
SCORERS = {"plain": TokenScorer, "chunked": lambda: ChunkedScorer(chunk_size=3)}


# ------------------------------------------------------------------------------------------------ helpers
def plain_logps(model, batch) -> torch.Tensor:
    """``[B, 2]`` sums of response-token log-probs, each response alone through ``model(ids).logits``."""
    rows = []
    for i in range(batch.num_pairs):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
        for b in range(2):
            ids = torch.cat([prompt, batch.response_ids[i, b][batch.response_mask[i, b]]])[None]
            logps = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])
            rows.append(logps[len(prompt) - 1:].sum())
    return torch.stack(rows).view(batch.num_pairs, 2)


def flat_grads(module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in module.policy.parameters()])


def make_module(estimator, scorer="plain", source=None, batch=None, cached=False) -> PrunedDPO:
    """A policy perturbed away from its reference; ``ReferenceLogSumExp`` gets a cache of the reference (with its
    log-sum-exps) for ``batch``, ``cached`` a cache without them."""
    source = source or FromConfig(model_type="llama", config=TINY_LLAMA, seed=0)
    reference = None
    if estimator is ReferenceLogSumExp or cached:
        store = compute_reference_logps(source.build(), [batch], with_lse=estimator is ReferenceLogSumExp)
        reference = CachedReference.from_store(store)
    module = PrunedDPO(policy=source, reference=reference, scorer=SCORERS[scorer]())
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return module


def reference_model(module, source=None):
    models = module.reference.models()
    return models[0] if models else (source or FromConfig(model_type="llama", config=TINY_LLAMA, seed=0)).build()




def prefix_outcomes(prefix, lengths: torch.Tensor):
    """Every kept-length vector the prefix sampler draws for rows of ``lengths``, with its probability: one outcome
    for ``FullPrefix``; for ``SharedFractionPrefix`` (one ``u ~ U[m, 1]`` for all rows, ``L = ceil(u T)``) the
    intervals of ``u`` between the rows' breakpoints ``(l - 1) / T``."""
    if isinstance(prefix, FullPrefix):
        yield lengths.clone(), 1.0
        return
    m = prefix.min_fraction
    cuts = sorted({m, 1.0} | {(l - 1) / T for T in lengths.tolist() for l in range(1, T + 1) if m < (l - 1) / T < 1})
    for a, b in zip(cuts[:-1], cuts[1:]):
        kept = torch.ceil(torch.tensor((a + b) / 2) * lengths.double()).long().clamp(min=1).minimum(lengths)
        yield kept, (b - a) / (1 - m)


def enumerate_steps(module, batch, estimator, prefix, position, score_common_prefix=True):
    """``(probability, estimate)`` of every joint outcome (rows enumerated independently: every quantity checked
    is a sum of per-row terms, whose expectation only needs each row's marginal draws)."""
    lengths = batch.response_lengths.reshape(-1)
    T = batch.response_width
    for kept, p_kept in prefix_outcomes(prefix, lengths):
        supports = [list(position.support(int(L))) for L in kept]
        for combo in itertools.product(*supports):
            mask = torch.zeros(len(lengths), T, dtype=torch.bool)
            prob = p_kept
            for r, (row_mask, p) in enumerate(combo):
                mask[r, : int(kept[r])] = row_mask
                prob *= p
            plan = plan_step(batch, ForcedPrefix(kept, prefix), estimator(ForcedPositions(mask, position)),
                             BothBranches(), torch.Generator(), score_common_prefix=score_common_prefix)
            yield prob, plan, module.estimate(batch, plan, module.execute(batch, plan))


def common_start_batch():
    """2 pairs with short responses; the first pair's two responses share their first 2 tokens."""
    batch = make_batch([2, 3], [4, 2], [3, 3], seed=11)
    batch.response_ids[0, 1, :2] = batch.response_ids[0, 0, :2]
    return batch


# ----------------------------------------------------------------------------------- the samplers themselves
def test_a_wrapper_keeps_the_wrapped_samplers_draws_and_probabilities():
    inner = CoupledStratifiedPositions(0.5)
    for wrapper in (ExactTargetLogits(inner), ReferenceLogSumExp(inner)):
        kept = torch.tensor([5, 3, 7, 7])
        assert torch.equal(wrapper.inclusion(kept, 8), inner.inclusion(kept, 8))
        g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        assert torch.equal(wrapper.draw(kept, 8, g1), inner.draw(kept, 8, g2))
        check_position_sampler(ExactTargetLogits(StratifiedPositions(0.4)), lengths=(1, 2, 5), num_draws=2000)
    assert type(ExactTargetLogits().positions) is CoupledStratifiedPositions
    assert ExactTargetLogits().positions.rate == 0.25
    assert not ExactTargetLogits.uses_reference_lse and ReferenceLogSumExp.uses_reference_lse
    assert (repr(ExactTargetLogits()) == "ExactTargetLogits(positions=CoupledStratifiedPositions(rate=0.25, "
                                         "min_count=1))")


def test_bad_wrapped_samplers_are_refused_naming_the_argument():
    with pytest.raises(TypeError, match="ExactTargetLogits: positions must be a PositionSampler, got FullPrefix"):
        ExactTargetLogits(FullPrefix())
    with pytest.raises(ValueError, match="ReferenceLogSumExp: positions is already ExactTargetLogits"):
        ReferenceLogSumExp(ExactTargetLogits())
    with pytest.raises(TypeError, match="LogSoftmaxSplit is the base"):
        LogSoftmaxSplit(AllPositions())


def test_the_plan_scores_every_executed_position_and_weighs_the_drawn_ones_apart():
    batch = make_batch([2, 3], [6, 4], [5, 7], seed=1)
    prefix, position = SharedFractionPrefix(0.5), StratifiedPositions(0.5)
    plan = plan_step(batch, prefix, ExactTargetLogits(position), BothBranches(), torch.Generator().manual_seed(2))
    twin = plan_step(batch, prefix, position, BothBranches(), torch.Generator().manual_seed(2))
    (group,), (plain,) = plan.groups, twin.groups
    assert group.num_scored == plan.kept_positions and plan.positions_scored == plain.num_scored == plan.drawn_positions
    lengths = batch.response_lengths.reshape(-1)
    survival = prefix.survival(lengths, batch.response_width)[group.scored_row, group.scored_t]
    torch.testing.assert_close(group.weight, 1.0 / survival)
    drawn = group.lse_index
    assert torch.equal(group.scored_row[drawn], plain.scored_row) and torch.equal(group.scored_t[drawn], plain.scored_t)
    torch.testing.assert_close(group.lse_weight[drawn], plain.weight)
    assert not plan.reference_lse and plain.lse_weight is None
    assert plan_step(batch, prefix, ReferenceLogSumExp(position), BothBranches(), torch.Generator()).reference_lse


# --------------------------------------------------------------------------------- exact, by enumeration
@pytest.mark.parametrize("estimator, cached", [(ExactTargetLogits, False), (ExactTargetLogits, True),
                                               (ReferenceLogSumExp, True)],
                         ids=["ExactTargetLogits", "ExactTargetLogits-cached", "ReferenceLogSumExp"])
@pytest.mark.parametrize("prefix, position", [
    (FullPrefix(), StratifiedPositions(0.5)),
    (SharedFractionPrefix(0.4), StratifiedPositions(0.5)),
    (SharedFractionPrefix(0.4), FixedCountPositions(1)),
], ids=["strata-only", "prefix+strata", "prefix+fixed-count"])
def test_value_and_gradient_are_exactly_unbiased_by_enumeration(estimator, cached, prefix, position):
    batch = make_batch([2, 3], [3, 2], [2, 3], seed=5)
    module = make_module(estimator, batch=batch, cached=cached)
    u = torch.tensor([[1.0, -0.5], [0.3, 2.0]])  # any fixed combination of the four sums
    exact = plain_logps(module.policy, batch)
    (u * exact).sum().backward()
    exact_grad = flat_grads(module)
    with torch.no_grad():
        exact_ref = plain_logps(reference_model(module), batch)

    mean_value, mean_ref, mean_grad, total = torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros_like(exact_grad), 0.0
    for prob, _, est in enumerate_steps(module, batch, estimator, prefix, position):
        module.policy.zero_grad()
        (u * est.policy_logps).sum().backward()
        mean_value += prob * est.policy_logps.detach()
        mean_ref += prob * est.reference_logps
        mean_grad += prob * flat_grads(module)
        total += prob
    assert total == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(mean_value, exact.detach(), **TOL)
    torch.testing.assert_close(mean_ref, exact_ref, **TOL)
    torch.testing.assert_close(mean_grad, exact_grad, **TOL)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.__name__)
def test_a_shared_common_start_stays_exact(estimator):
    """The common start scored once (the owner row's terms, detached, counted in both branches): both branch sums
    stay exactly unbiased in value, and the margin's gradient in gradient (the common start cancels there)."""
    batch = common_start_batch()
    module = make_module(estimator, batch=batch)
    exact = plain_logps(module.policy, batch)
    (exact[:, 0] - exact[:, 1]).sum().backward()
    exact_grad = flat_grads(module)
    mean_value, mean_grad = torch.zeros(2, 2), torch.zeros_like(exact_grad)
    seen_shared = False
    for prob, plan, est in enumerate_steps(module, batch, estimator, SharedFractionPrefix(0.5),
                                           StratifiedPositions(0.5), score_common_prefix=False):
        seen_shared |= bool(plan.groups[0].shared.any())
        module.policy.zero_grad()
        (est.policy_logps[:, 0] - est.policy_logps[:, 1]).sum().backward()
        mean_value += prob * est.policy_logps.detach()
        mean_grad += prob * flat_grads(module)
    assert seen_shared
    torch.testing.assert_close(mean_value, exact.detach(), **TOL)
    torch.testing.assert_close(mean_grad, exact_grad, **TOL)


# ------------------------------------------------------------------------------------ Monte Carlo, public
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.__name__)
def test_check_unbiased_accepts_the_estimators_with_every_other_sampler(estimator):
    check_unbiased(prefix=SharedFractionPrefix(0.5), position=estimator(CoupledStratifiedPositions(0.3)),
                   branch=RandomBranch(), num_draws=1500)
    check_unbiased(position=estimator(FixedCountPositions(2)), num_draws=1500)


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.__name__)
def test_check_step_unbiased_through_the_module(estimator, scorer):
    batch = make_batch([3, 1, 2], [5, 4, 6], [4, 6, 3], seed=2)
    module = make_module(estimator, scorer, batch=batch)
    report = check_step_unbiased(module, batch, estimator(CoupledStratifiedPositions(0.4)), SharedFractionPrefix(0.5),
                                 RandomBranch(), num_draws=120)
    assert report.monte_carlo_checks == 3


# ------------------------------------------------------------------------- an independent implementation
@pytest.mark.parametrize("layout", [LeftPaddedLayout(), SharedPromptLayout()], ids=lambda x: type(x).__name__)
@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.__name__)
def test_everything_drawn_equals_the_plain_forward(estimator, scorer, layout):
    """At rate 1 (``StratifiedPositions(rate=1)``: every position drawn, weight 1) the estimate is the plain
    forward's sum of log-probs, policy and reference alike, and so is its gradient."""
    batch = make_batch([3, 1, 4], [5, 2, 7], [4, 6, 1], seed=4)
    module = make_module(estimator, scorer, batch=batch)
    parts = dataclasses.replace(module.parts, layout=layout)
    plan = plan_step(batch, FullPrefix(), estimator(StratifiedPositions(1.0)), BothBranches(), torch.Generator())
    est = module.estimate(batch, plan, module.execute(batch, plan, parts))
    est.policy_logps.sum().backward()
    got = flat_grads(module)
    module.policy.zero_grad()
    exact = plain_logps(module.policy, batch)
    exact.sum().backward()
    torch.testing.assert_close(est.policy_logps.detach(), exact.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(got, flat_grads(module), atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(est.reference_logps, plain_logps(reference_model(module), batch), atol=1e-5, rtol=0)


@pytest.mark.parametrize("scorer", SCORERS)
def test_the_target_logit_goes_through_the_models_logit_transform(scorer):
    """Gemma 2 soft-caps its logits: the target logit is the soft-capped row, so rate 1 is still the plain forward."""
    from lit_prunedpo.zoo import build_tiny

    model = build_tiny("gemma2")
    module = PrunedDPO(policy=Built(model), scorer=SCORERS[scorer]())
    vocab = model.get_output_embeddings().weight.shape[0]
    batch = make_batch([2, 3], [4, 3], [3, 5], vocab=vocab, seed=6)
    plan = plan_step(batch, FullPrefix(), ExactTargetLogits(AllPositions()), BothBranches(), torch.Generator())
    est = module.estimate(batch, plan, module.execute(batch, plan))
    with torch.no_grad():
        torch.testing.assert_close(est.policy_logps, plain_logps(module.policy, batch), atol=1e-5, rtol=0)


# -------------------------------------------------------------------------------------------- the saving
def counting(base):
    class Counting(base):
        """Records the rows of every head computation it is asked for."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.lse_rows, self.target_rows, self.logp_rows = [], [], []

        def log_sum_exp(self, head, hidden, targets, stats=None):
            self.lse_rows.append(hidden.shape[0])
            return super().log_sum_exp(head, hidden, targets, stats)

        def token_terms(self, model, head, hidden, targets, lse_index, stats=None):
            self.target_rows.append(hidden.shape[0])
            return super().token_terms(model, head, hidden, targets, lse_index, stats)

        def log_probs(self, head, hidden, targets, stats=None):
            self.logp_rows.append(hidden.shape[0])
            return super().log_probs(head, hidden, targets, stats)

    return Counting


@pytest.mark.parametrize("scorer", SCORERS)
def test_the_whole_head_runs_on_the_drawn_positions_only(scorer):
    """Policy and online reference: the ``V``-wide head (counted by the scorer and, for the plain one, by a hook on
    the LM head module) runs on the drawn positions, the target logit on every executed one."""
    batch = make_batch([3, 2], [12, 9], [10, 14], seed=8)
    base = TokenScorer if scorer == "plain" else ChunkedScorer
    module = PrunedDPO(policy=FromConfig(model_type="llama", config=TINY_LLAMA, seed=0), scorer=counting(base)())
    parts = dataclasses.replace(module.parts, layout=LeftPaddedLayout())
    counted = module.scorer
    for rows in (counted.lse_rows, counted.target_rows, counted.logp_rows):
        rows.clear()  # resolving the layout scored its probe batch
    heads = [module.policy.get_output_embeddings(), module.reference.models()[0].get_output_embeddings()]
    projected = []
    hooks = [h.register_forward_hook(lambda mod, args, out: projected.append(args[0].shape[0])) for h in heads]
    plan = plan_step(batch, SharedFractionPrefix(0.5), ExactTargetLogits(CoupledStratifiedPositions(0.25)),
                     BothBranches(), torch.Generator().manual_seed(0))
    logps = module.execute(batch, plan, parts)
    for hook in hooks:
        hook.remove()
    drawn, executed = plan.drawn_positions, plan.kept_positions
    assert plan.positions_scored == drawn < executed / 3
    assert counted.logp_rows == [] and sum(counted.lse_rows) == 2 * drawn  # policy, then reference
    assert sum(counted.target_rows) == 2 * executed
    if scorer == "plain":
        assert sum(projected) == 2 * drawn
    assert [t.lse.numel() for t in logps.policy] == [drawn] and [t.target.numel() for t in logps.policy] == [executed]


def test_the_cost_model_counts_the_drawn_head_and_every_target_logit():
    from lit_prunedpo_lab.bench import cost

    batch = make_batch([3, 2], [12, 9], [10, 14], seed=8)
    dims = cost.ModelDims(body_params=1000, hidden_size=8, vocab_size=100, num_layers=1, attention_dim=8)
    sampler = CoupledStratifiedPositions(0.25)
    plain = plan_step(batch, FullPrefix(), sampler, BothBranches(), torch.Generator().manual_seed(0))
    split = plan_step(batch, FullPrefix(), ExactTargetLogits(sampler), BothBranches(), torch.Generator().manual_seed(0))
    extra = cost.step_flops(split, dims).total - cost.step_flops(plain, dims).total
    # 2d FLOPs per executed position, forward + backward (3x) in the policy and once in the online reference
    assert extra == 2 * dims.hidden_size * split.kept_positions * (3 + 1)


# ------------------------------------------------------------------------------------------- refusals
ONLINE_REFUSAL = (
    "ReferenceLogSumExp needs the reference's log-sum-exp at every executed position, which OnlineReference cannot "
    "give without running its whole LM head there (what position pruning skips): use the cached reference "
    "(model.reference: lit_prunedpo.reference.CachedReference), or the ExactTargetLogits estimator, which works "
    "with any reference"
)


def test_an_online_reference_is_refused_for_reference_lse():
    batch = make_batch([2], [3], [4])
    module = PrunedDPO(policy=FromConfig(model_type="llama", config=TINY_LLAMA, seed=0))
    parts = dataclasses.replace(module.parts, position_sampler=ReferenceLogSumExp())
    with pytest.raises(ValueError, match=re.escape(ONLINE_REFUSAL)):
        module.step(batch, parts, torch.Generator())
    with pytest.raises(ValueError, match=re.escape(ONLINE_REFUSAL)):
        check_log_softmax_split(ReferenceLogSumExp(), module.policy, module.reference)
    check_log_softmax_split(ExactTargetLogits(), module.policy, module.reference)  # any reference


def _shifted_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    class Shifted(LlamaForCausalLM):
        """A model whose forward does something after its head that no config field names."""

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits.roll(1, dims=-1) * 1.5 - 0.5
            return out

    torch.manual_seed(0)
    return Shifted(LlamaConfig(**TINY_LLAMA))


@pytest.mark.parametrize("scorer", SCORERS)
def test_a_head_that_is_not_a_linear_row_is_refused_naming_the_model(scorer):
    model = _shifted_model()
    module = PrunedDPO(policy=Built(model), scorer=SCORERS[scorer]())
    message = re.escape(
        "Shifted: ExactTargetLogits and ReferenceLogSumExp compute each target's logit as one row of the LM head "
        "(h . W[y] + b, then the model's element-wise logit transform), but its head is the model's own forward tail "
        "(its logits are not a known transform of the linear head); computing its full logits at every position would "
        "save nothing: use a position sampler without them (e.g. CoupledStratifiedPositions), or give the estimator "
        "fallback: true to use its wrapped sampler alone"
    )
    batch = make_batch([2], [3], [4])
    parts = dataclasses.replace(module.parts, position_sampler=ExactTargetLogits(), layout=LeftPaddedLayout())
    with pytest.raises(ValueError, match=message):
        module.step(batch, parts, torch.Generator())
    with pytest.raises(ValueError, match=message):
        check_log_softmax_split(ExactTargetLogits(), module.policy, module.reference)


def test_with_fallback_such_a_head_gets_the_wrapped_sampler_with_a_warning():
    """The default position mode (``fallback: true``) runs on any model: on a head that gives no row it scores the
    drawn positions whole, says so once, and keeps that choice when a callback passes the same sampler again."""
    wrapped = CoupledStratifiedPositions(0.5)
    module = PrunedDPO(policy=Built(_shifted_model()), position_sampler=ExactTargetLogits(wrapped, fallback=True),
                       layout=LeftPaddedLayout())
    warning = (r"Shifted: its LM head is the model's own forward "
               r"tail.*fallback=True.*CoupledStratifiedPositions\(rate=0.5")
    with pytest.warns(UserWarning, match=warning):
        module.setup("fit")
    assert module.position_sampler is wrapped
    out = module.step(make_batch([2, 1], [6, 5], [4, 7], seed=3))
    assert torch.isfinite(out.estimate.objective) and not any(g.lse_weight is not None for g in out.plan.groups)
    again = ExactTargetLogits(fallback=True)  # as AutoPruning passes a candidate mode's sampler, every step
    with pytest.warns(UserWarning, match="fallback=True"):
        module.use_samplers(position=again)
    assert type(module.position_sampler) is CoupledStratifiedPositions and module.position_sampler.rate == 0.25
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.use_samplers(position=again)  # the same object: already admitted, no second warning
    with pytest.raises(ValueError, match="give the estimator fallback: true"):
        module.use_samplers(position=ExactTargetLogits())
    assert module.position_sampler.rate == 0.25  # a refused sampler changes nothing


def test_a_measurement_of_the_step_runs_what_training_would_its_fallback_included():
    """AutoPruning's calibration (``gradient_noise.gradient``) and the unbiasedness check build their parts through
    ``PrunedDPO.parts_with``, which admits a position sampler as training does: on a head that gives no row, the
    default position mode is measured as its fallback (it used to fail inside the step), and one without ``fallback``
    is refused with the same message as at set-up. The module's own samplers stay as they were."""
    from lit_prunedpo.gradient_noise import gradient

    module = PrunedDPO(policy=Built(_shifted_model()), layout=LeftPaddedLayout())
    module.setup("fit")
    estimator = ExactTargetLogits(CoupledStratifiedPositions(0.5), fallback=True)
    with pytest.warns(UserWarning, match="fallback=True"):
        assert module.parts_with(position=estimator).position_sampler is estimator.positions
    batch = make_batch([2, 1], [6, 5], [4, 7], seed=3)
    with pytest.warns(UserWarning, match="fallback=True"):
        grad = gradient(module, batch, (FullPrefix(), estimator, BothBranches()), torch.Generator().manual_seed(0))
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert isinstance(module.position_sampler, AllPositions)  # a measurement changes nothing
    with pytest.raises(ValueError, match="give the estimator fallback: true"):
        module.parts_with(position=ExactTargetLogits())
    with pytest.warns(UserWarning, match="fallback=True"):  # the fallback's draws, checked unbiased (raises if not)
        report = check_step_unbiased(module, batch, estimator, FullPrefix(), BothBranches(), num_draws=60)
    assert report.monte_carlo_checks == 3


def test_with_fallback_a_linear_head_keeps_the_estimator_silently():
    estimator = ExactTargetLogits(fallback=True)
    module = make_module(ExactTargetLogits)
    module.use_samplers(position=estimator)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.setup("fit")
    assert module.position_sampler is estimator
    assert module.step(make_batch([2], [5], [4], seed=1)).plan.groups[0].lse_weight is not None
