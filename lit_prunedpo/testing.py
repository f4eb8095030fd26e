"""Check any sampler's unbiasedness, exactly where its support is small and by Monte Carlo otherwise.

For your own sampler, in your own tests::

    from lit_prunedpo.testing import check_position_sampler
    check_position_sampler(MyPositions(rate=0.3))   # raises AssertionError with the numbers if it is biased

What is checked, and the tolerances:

* **exact** (where ``support`` enumerates at most ``max_support`` outcomes): the outcome probabilities sum to 1
  and the probability-weighted outcomes equal the reported inclusion (or branch) probabilities, to ``1e-9``;
  hence ``E[R_hat] = R`` exactly.
* **Monte Carlo** (always): over ``num_draws`` draws, each empirical inclusion frequency lies within
  ``z`` binomial standard errors of its reported probability, and the mean of the IPW estimate
  ``R_hat`` of a random sum lies within ``z`` standard errors of the true sum. The default ``z = 5``
  gives a false alarm less than once in a million checks.
* **end to end** (:func:`check_unbiased`): the real :func:`lit_prunedpo.plan.plan_step` and
  :func:`lit_prunedpo.estimate.ipw_sums` are run with any combination of samplers, and the mean of the
  branch-weighted estimate matches ``R_w - R_l`` within ``z`` standard errors. A position sampler that samples
  only the log-sum-exp (:mod:`lit_prunedpo.samplers.control_variates`) is fed each token's two terms
  (``rho_t = z_t - lse_t``, a random ``lse_t``, and for ``ReferenceLogSumExp`` a random baseline ``lse'_t``).
* **through a module's step** (:func:`check_step_unbiased`): the real plan, execute and estimate of a
  :class:`~lit_prunedpo.PrunedDPO` (its model, scorer, reference and layout); the means of the policy's and the
  reference's IPW sums, and of the gradient of the branch-weighted policy sums on random directions, match the
  unpruned step's within ``z`` standard errors.
* **a loss's reward estimate** (:func:`check_reward_estimate`): a quantity a loss computes from the IPW sums
  and the full lengths (a length-normalised mean, a token-averaged NLL) has, exactly by enumeration and by
  Monte Carlo through the real planner, the expectation of that quantity on the true sums.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.estimate import ipw_sums
from lit_prunedpo.losses import BranchSums, PreferenceLoss
from lit_prunedpo.plan import RowGroup, plan_step
from lit_prunedpo.samplers import (
    AllPositions,
    BothBranches,
    BranchSampler,
    FullPrefix,
    PositionSampler,
    PrefixSampler,
)
from lit_prunedpo.token_terms import TokenTerms

DEFAULT_LENGTHS = (1, 2, 3, 5, 8, 13, 40)
EXACT_TOL = 1e-9


@dataclass
class SamplerReport:
    """What was checked: counts of exact and Monte Carlo checks and the largest deviation in standard errors."""

    exact_checks: int = 0
    monte_carlo_checks: int = 0
    max_z: float = 0.0
    notes: list[str] = field(default_factory=list)


def _mc(report: SamplerReport, what: str, observed: Tensor, expected: Tensor, stderr: Tensor, z: float) -> None:
    dev = (observed - expected).abs() / stderr.clamp(min=1e-12)
    # A deviation with zero standard error must be exactly zero (deterministic outcome).
    dev = torch.where(stderr > 0, dev, torch.where((observed - expected).abs() < 1e-12, 0.0, math.inf))
    worst = float(dev.max()) if dev.numel() else 0.0
    report.monte_carlo_checks += 1
    report.max_z = max(report.max_z, worst)
    if worst > z:
        i = int(dev.argmax())
        raise AssertionError(
            f"{what}: Monte Carlo mean {float(observed.flatten()[i]):.6g} vs expected {float(expected.flatten()[i]):.6g} "
            f"is {worst:.2f} standard errors away (tolerance {z})"
        )


def _exact(report: SamplerReport, what: str, value: Tensor, expected: Tensor) -> None:
    report.exact_checks += 1
    err = float((value - expected).abs().max()) if value.numel() else 0.0
    if err > EXACT_TOL:
        raise AssertionError(f"{what}: exact enumeration gives {value.tolist()} but expected {expected.tolist()}")


def _support(sampler, arg, max_support: int):
    try:
        outcomes = []
        for outcome in sampler.support(arg):
            outcomes.append(outcome)
            if len(outcomes) > max_support:
                return None
        return outcomes
    except NotImplementedError:
        return None


def check_position_sampler(
    sampler: PositionSampler,
    lengths: tuple[int, ...] = DEFAULT_LENGTHS,
    num_draws: int = 20_000,
    z: float = 5.0,
    max_support: int = 4096,
    seed: int = 0,
) -> SamplerReport:
    """Check that ``sampler`` draws positions with the inclusion probabilities it reports (see module doc)."""
    report = SamplerReport()
    g = torch.Generator().manual_seed(seed)
    width = max(lengths) + 2
    for L in lengths:
        kept = torch.tensor([L])
        p = sampler.inclusion(kept, width)[0].to(torch.float64)
        assert p.shape == (width,), f"inclusion() returned shape {tuple(p.shape)}, expected ({width},)"
        assert bool((p[:L] > 0).all()), f"L={L}: a kept position has inclusion probability 0: {p[:L].tolist()}"
        assert bool((p[L:] == 0).all()), f"L={L}: positions past the kept prefix have non-zero probability"
        outcomes = _support(sampler, L, max_support)
        rho = torch.randn(L, generator=g, dtype=torch.float64)
        if outcomes is not None:
            total = sum(prob for _, prob in outcomes)
            _exact(report, f"L={L}: support probabilities sum", torch.tensor([total], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64))
            marginal = sum(prob * mask.to(torch.float64) for mask, prob in outcomes)
            _exact(report, f"L={L}: inclusion probabilities", marginal, p[:L])
            mean = sum(prob * (mask * rho / p[:L]).sum() for mask, prob in outcomes)
            _exact(report, f"L={L}: E[R_hat]", torch.tensor([float(mean)], dtype=torch.float64), rho.sum()[None])
        masks = sampler.draw(kept.expand(num_draws), width, g)
        assert masks.shape == (num_draws, width) and masks.dtype == torch.bool, "draw() must return a bool [N, width] mask"
        assert not bool(masks[:, L:].any()), f"L={L}: draw() scored a position past the kept prefix"
        freq = masks[:, :L].double().mean(0)
        _mc(report, f"L={L}: inclusion frequency", freq, p[:L], (p[:L] * (1 - p[:L]) / num_draws).sqrt(), z)
        est = (masks[:, :L] * rho / p[:L]).sum(1)
        _mc(report, f"L={L}: E[R_hat]", est.mean()[None], rho.sum()[None], (est.std() / math.sqrt(num_draws))[None], z)
    return report


def check_prefix_sampler(
    sampler: PrefixSampler,
    lengths: tuple[int, ...] = DEFAULT_LENGTHS,
    num_draws: int = 20_000,
    z: float = 5.0,
    seed: int = 0,
) -> SamplerReport:
    """Check that ``sampler`` draws kept lengths with the survival probabilities it reports."""
    report = SamplerReport()
    g = torch.Generator().manual_seed(seed)
    T = torch.tensor(lengths)
    width = int(T.max())
    s = sampler.survival(T, width).to(torch.float64)
    pmf = sampler.pmf(T, width).to(torch.float64)
    valid = torch.arange(width)[None, :] < T[:, None]
    assert bool((s[valid] > 0).all()), "survival() is 0 at a response position: that token could never be scored"
    assert bool((s[~valid] == 0).all()), "survival() is non-zero past a response's length"
    assert bool((s[:, 0] == 1).all()), "survival() of the first token must be 1 (L >= 1 always)"
    assert bool((pmf >= -EXACT_TOL).all()), "survival() increases with t: it is not a survival function"
    _exact(report, "pmf sums", pmf.sum(1), torch.ones(len(lengths), dtype=torch.float64))
    rho = torch.randn(len(lengths), width, generator=g, dtype=torch.float64) * valid
    # E[R_hat | L] = sum_{t<=L} rho_t / s_t, exactly over the pmf.
    exact_mean = torch.stack(
        [sum(pmf[i, l - 1] * (rho[i, :l] / s[i, :l]).sum() for l in range(1, int(T[i]) + 1)) for i in range(len(lengths))]
    )
    _exact(report, "E[R_hat] over the pmf", exact_mean, rho.sum(1))

    draws = torch.stack([sampler.draw(T, g) for _ in range(num_draws)])  # [n, N]
    assert bool(((draws >= 1) & (draws <= T)).all()), "draw() returned a kept length outside [1, T]"
    t = torch.arange(1, width + 1)
    survived = (draws[:, :, None] >= t[None, None, :]).double()  # [n, N, width]
    freq = survived.mean(0)
    _mc(report, "survival frequency", freq[valid], s[valid], (s * (1 - s) / num_draws).sqrt()[valid], z)
    est = (survived * rho / s.clamp(min=EXACT_TOL)).sum(-1)  # [n, N]
    _mc(report, "E[R_hat]", est.mean(0), rho.sum(1), est.std(0) / math.sqrt(num_draws), z)
    return report


def check_branch_sampler(
    sampler: BranchSampler,
    num_pairs: tuple[int, ...] = (1, 2, 3, 4, 7),
    num_draws: int = 20_000,
    z: float = 5.0,
    max_support: int = 4096,
    seed: int = 0,
) -> SamplerReport:
    """Check that ``sampler`` gives branches a gradient with the probabilities ``q`` it reports, so that
    ``E[sum_b 1{b in B} sign_b g_b / q_b] = g_w - g_l``."""
    report = SamplerReport()
    g = torch.Generator().manual_seed(seed)
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64)
    for B in num_pairs:
        q = sampler.probabilities(B).to(torch.float64)
        assert q.shape == (B, 2) and bool((q > 0).all()), f"B={B}: probabilities() must be [B, 2] and > 0"
        grads = torch.randn(B, 2, generator=g, dtype=torch.float64)
        target = grads[:, 0] - grads[:, 1]
        outcomes = _support(sampler, B, max_support)
        if outcomes is not None:
            _exact(report, f"B={B}: support probabilities sum", torch.tensor([sum(p for _, p in outcomes)], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64))
            _exact(report, f"B={B}: branch probabilities", sum(p * m.to(torch.float64) for m, p in outcomes), q)
            mean = sum(p * (m * sign * grads / q).sum(1) for m, p in outcomes)
            _exact(report, f"B={B}: E[branch-weighted gradient]", mean, target)
        masks = torch.stack([sampler.draw(B, g) for _ in range(num_draws)]).to(torch.float64)  # [n, B, 2]
        _mc(report, f"B={B}: branch frequency", masks.mean(0), q, (q * (1 - q) / num_draws).sqrt(), z)
        est = (masks * sign * grads / q).sum(-1)
        _mc(report, f"B={B}: E[branch-weighted gradient]", est.mean(0), target, est.std(0) / math.sqrt(num_draws), z)
    return report


def synthetic_batch(lengths: Tensor, prompt_length: int = 2, vocab: int = 16, seed: int = 0) -> PreferenceBatch:
    """A batch with response lengths ``lengths`` (``[B, 2]``) and random tokens, for sampler checks."""
    g = torch.Generator().manual_seed(seed)
    B, T = lengths.shape[0], int(lengths.max())
    response_mask = torch.arange(T)[None, None, :] < lengths[:, :, None]
    return PreferenceBatch(
        prompt_ids=torch.randint(vocab, (B, prompt_length), generator=g),
        prompt_mask=torch.ones(B, prompt_length, dtype=torch.bool),
        response_ids=torch.randint(vocab, (B, 2, T), generator=g) * response_mask,
        response_mask=response_mask,
        index=torch.arange(B),
    )


def scored_values(group: RowGroup, rho: Tensor, lse: Tensor | None = None) -> Tensor | TokenTerms:
    """What a scorer would return for ``group`` if the log-prob of response token ``t`` of pair ``i``, branch ``b``
    were ``rho[i, b, t]`` (``[B, 2, T]``): those log-probs at its scored positions, or, where its log-softmax is split,
    :class:`TokenTerms` with target logits ``rho + lse`` and the log-sum-exps ``lse`` at its drawn positions."""
    if not group.splits_log_softmax:
        return at_scored(group, rho)
    if lse is None:
        raise ValueError("this plan splits the log-softmax: give each token's log-sum-exp (lse)")
    return TokenTerms(target=at_scored(group, rho + lse), lse=at_scored(group, lse)[group.lse_index])


def at_scored(group: RowGroup, values: Tensor) -> Tensor:
    """``[K]`` ``values`` (``[B, 2, T]``, per pair, branch and response position) at ``group``'s scored positions."""
    return values[group.pair[group.scored_row], group.branch[group.scored_row], group.scored_t]


def check_unbiased(
    prefix: PrefixSampler | None = None,
    position: PositionSampler | None = None,
    branch: BranchSampler | None = None,
    lengths: Tensor | None = None,
    num_draws: int = 4000,
    z: float = 5.0,
    seed: int = 0,
) -> SamplerReport:
    """End to end through the real planner and IPW sums: ``E[R_hat] = R`` per branch, and the branch-weighted
    estimate ``sum_b 1{b in B} sign_b R_hat^b / q_b`` has mean ``R_w - R_l``."""
    prefix, position, branch = prefix or FullPrefix(), position or AllPositions(), branch or BothBranches()
    lengths = lengths if lengths is not None else torch.tensor([[5, 3], [1, 8], [12, 12]])
    batch = synthetic_batch(lengths, seed=seed)
    g = torch.Generator().manual_seed(seed)
    rho = torch.randn(batch.response_ids.shape, generator=g, dtype=torch.float64) * batch.response_mask
    # log-sum-exps (and a reference's, near them) for the samplers that split the log-softmax; their own stream,
    # so that every other sampler sees the draws it always saw
    terms = torch.Generator().manual_seed(seed + 1)
    lse = 2.0 + torch.rand(rho.shape, generator=terms, dtype=torch.float64)
    reference_lse = lse + 0.3 * torch.randn(rho.shape, generator=terms, dtype=torch.float64)
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64)
    r_hats, directions = [], []
    for _ in range(num_draws):
        plan = plan_step(batch, prefix, position, branch, g)
        scored = [scored_values(grp, rho, lse) for grp in plan.groups]
        baselines = [at_scored(grp, reference_lse) for grp in plan.groups] if plan.reference_lse else None
        r_hat = ipw_sums(plan, scored, batch.num_pairs, baselines)
        r_hats.append(r_hat)
        directions.append((plan.grad_mask * sign * r_hat / plan.branch_prob).sum(-1))
    report = SamplerReport()
    R = rho.sum(-1)
    stacked, dirs = torch.stack(r_hats), torch.stack(directions)
    _mc(report, "E[R_hat] per branch", stacked.mean(0), R, stacked.std(0) / math.sqrt(num_draws), z)
    _mc(report, "E[branch-weighted R_hat]", dirs.mean(0), R[:, 0] - R[:, 1], dirs.std(0) / math.sqrt(num_draws), z)
    return report


def check_step_unbiased(
    module: Any,
    batch: PreferenceBatch,
    position: PositionSampler,
    prefix: PrefixSampler | None = None,
    branch: BranchSampler | None = None,
    num_draws: int = 300,
    z: float = 5.0,
    directions: int = 4,
    seed: int = 0,
) -> SamplerReport:
    """Check by Monte Carlo that ``module``'s own step (a :class:`~lit_prunedpo.PrunedDPO`: its model, scorer,
    reference and layout) with these samplers estimates the unpruned step's sums and gradient without bias.

    Over ``num_draws`` steps (:meth:`~lit_prunedpo.PrunedDPO.step`, each a plan, the forwards and the estimate), the
    means of the policy's and the reference's IPW sums ``[B, 2]``, and of the gradient of ``sum_b 1{b in B} P_hat^b
    / q_b`` projected on ``directions`` random unit vectors, lie within ``z`` standard errors of the unpruned step's
    (``E[P_hat] = P`` and ``E[grad P_hat] = grad P``, both linear in the draws). The module's gradients are left
    untouched.
    """
    report = SamplerReport()
    params = [p for p in module.policy.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(seed)
    size = sum(p.numel() for p in params)
    unit = torch.nn.functional.normalize(torch.randn(directions, size, generator=g, dtype=torch.float64), dim=1)

    def draw(prefix_, position_, branch_, generator) -> tuple[Tensor, Tensor, Tensor]:
        parts = dataclasses.replace(module.parts, prefix_sampler=prefix_, position_sampler=position_,
                                    branch_sampler=branch_)
        out = module.step(batch, parts, generator)
        est, plan = out.estimate, out.plan
        keep = (plan.grad_mask / plan.branch_prob).to(est.policy_logps)
        grads = torch.autograd.grad((keep * est.policy_logps).sum(), params, allow_unused=True)
        flat = torch.cat([(gr if gr is not None else torch.zeros_like(p)).flatten() for gr, p in zip(grads, params)])
        return est.policy_logps.detach().double(), est.reference_logps.detach().double(), unit @ flat.double()

    exact = draw(FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    draws = [draw(prefix or FullPrefix(), position, branch or BothBranches(), g) for _ in range(num_draws)]
    for what, index in (("E[P_hat] per branch", 0), ("E[Ref_hat] per branch", 1), ("E[grad P_hat] on directions", 2)):
        stacked = torch.stack([d[index] for d in draws])
        _mc(report, what, stacked.mean(0), exact[index], stacked.std(0) / math.sqrt(num_draws), z)
    return report


def _check_affine(reward: Callable[[BranchSums], Tensor], lengths: Tensor, g: torch.Generator) -> None:
    """Enumerating per-row marginals is exact for quantities affine in the sums only: check that premise."""
    zero = torch.zeros(lengths.shape, dtype=torch.float64)
    x, y = (torch.randn(lengths.shape, generator=g, dtype=torch.float64) for _ in range(2))
    at = lambda v: reward(BranchSums(v, zero, lengths))  # noqa: E731
    lhs, rhs = at(x + 2 * y) - at(zero), (at(x) - at(zero)) + 2 * (at(y) - at(zero))
    if not torch.allclose(lhs, rhs, rtol=1e-9, atol=1e-9):
        raise AssertionError("reward is not affine in the branch sums: only its expectation conditional on the "
                             "sums' noise is unbiased, so check_reward_estimate does not apply")


def check_reward_estimate(
    reward: Callable[[BranchSums], Tensor],
    prefix: PrefixSampler | None = None,
    position: PositionSampler | None = None,
    lengths: Tensor | None = None,
    num_draws: int = 4000,
    z: float = 5.0,
    max_support: int = 4096,
    seed: int = 0,
) -> SamplerReport:
    """Check that ``reward`` of the pruned IPW sums is unbiased for ``reward`` of the true sums.

    ``reward`` maps :class:`BranchSums` (policy sums, zero reference, the *full* lengths) to any tensor, e.g.
    ``lambda s: s.means().policy`` (length-normalised rewards) or ``lambda s: SftLoss().per_pair(s, 1.0)`` (the
    NLL term); it must be affine in the sums (checked), as a mean or a token average is.

    * **exact**: for every response, its kept length over the prefix sampler's marginal pmf and its scored
      positions over the position sampler's ``support`` give ``E[R_hat]`` exactly; by affinity
      ``E[reward(R_hat)] = reward(E[R_hat])``, which must equal ``reward(R)`` to ``1e-9``. Skipped (noted) when
      the position sampler cannot enumerate its support.
    * **Monte Carlo**: ``num_draws`` plans from the real :func:`lit_prunedpo.plan.plan_step` and
      :func:`lit_prunedpo.estimate.ipw_sums`; the mean of ``reward`` lies within ``z`` standard errors.
    """
    prefix, position = prefix or FullPrefix(), position or AllPositions()
    lengths = lengths if lengths is not None else torch.tensor([[5, 3], [1, 8], [12, 12]])
    batch = synthetic_batch(lengths, seed=seed)
    g = torch.Generator().manual_seed(seed)
    full = batch.response_lengths.to(torch.float64)
    _check_affine(reward, full, g)
    rho = -torch.rand(batch.response_ids.shape, generator=g, dtype=torch.float64).mul(3) * batch.response_mask
    zero = torch.zeros(full.shape, dtype=torch.float64)
    truth = reward(BranchSums(rho.sum(-1), zero, full))
    report = SamplerReport()

    flat_lengths, flat_rho, width = full.long().reshape(-1), rho.reshape(-1, rho.shape[-1]), rho.shape[-1]
    survival, pmf = prefix.survival(flat_lengths, width), prefix.pmf(flat_lengths, width)
    expected = torch.zeros(flat_lengths.shape, dtype=torch.float64)
    for r, T in enumerate(flat_lengths.tolist()):
        for kept in range(1, T + 1):
            if float(pmf[r, kept - 1]) <= 0:
                continue
            outcomes = _support(position, kept, max_support)
            if outcomes is None:
                report.notes.append(f"{type(position).__name__} does not enumerate its support: no exact check")
                expected = None
                break
            inclusion = position.inclusion(torch.tensor([kept]), width)[0, :kept].to(torch.float64)
            weight = 1.0 / (survival[r, :kept] * inclusion)
            for mask, prob in outcomes:
                expected[r] += float(pmf[r, kept - 1]) * prob * (mask * flat_rho[r, :kept] * weight).sum()
        if expected is None:
            break
    if expected is not None:
        _exact(report, "E[reward(R_hat)] by enumeration", reward(BranchSums(expected.view(full.shape), zero, full)), truth)

    values = []
    lse = 1.0 + rho.neg()  # any log-sum-exps will do for a sampler that splits the log-softmax, and any baseline
    for _ in range(num_draws):
        plan = plan_step(batch, prefix, position, BothBranches(), g)
        scored = [scored_values(grp, rho, lse) for grp in plan.groups]
        baselines = [at_scored(grp, lse / 2) for grp in plan.groups] if plan.reference_lse else None
        values.append(reward(BranchSums(ipw_sums(plan, scored, batch.num_pairs, baselines), zero, full)))
    stacked = torch.stack(values)
    _mc(report, "E[reward(R_hat)]", stacked.mean(0), truth, stacked.std(0) / math.sqrt(num_draws), z)
    return report


@dataclass(frozen=True)
class CoefficientBias:
    """What :func:`coefficient_bias` found for one pair: the pruned gradient's bias and its variance, with the
    coefficient at the pruned sums (what the estimator does) and at the exact sums (the unbiased reference point).

    Attributes:
        exact: ``[P]`` the exact gradient ``sum_b c_b(R) grad R_b``.
        mean: ``[P]`` ``E[sum_b c_b(R_hat) grad R_hat_b]``, the estimator's expectation.
        bias_norm: ``|mean - exact|``.
        exact_norm: ``|exact|``.
        variance: ``E|g_hat - mean|^2`` with the coefficient at the pruned sums.
        variance_exact_coefficient: the same with the coefficient at the exact sums (unbiased).
    """

    exact: Tensor
    mean: Tensor
    bias_norm: float
    exact_norm: float
    variance: float
    variance_exact_coefficient: float


def coefficient_bias(position: PositionSampler, rho: Tensor, grads: Tensor, loss: PreferenceLoss, beta: float,
                     max_support: int = 4096) -> CoefficientBias:
    """Exactly, by enumerating both branches' scored positions (drawn independently, from ``position.support``),
    the bias the coefficient ``c = loss.policy_partials`` at the *pruned* margin trades for one pair with both
    branches back-propagated, and the variance a coefficient at the exact margin would save.

    ``rho`` is ``[2, L]`` per-token log-ratios (chosen, rejected; both responses ``L`` long) and ``grads``
    ``[2, L, P]`` their per-token gradients. Coupled samplers draw the two branches jointly; this enumerates the
    independent draws of their uncoupled marginals.

    Raises:
        ValueError: on mismatched shapes, or a sampler whose support is not enumerable within ``max_support``.
    """
    if rho.ndim != 2 or rho.shape[0] != 2 or grads.ndim != 3 or grads.shape[:2] != rho.shape:
        raise ValueError(f"coefficient_bias needs rho [2, L] and grads [2, L, P], got {tuple(rho.shape)} and {tuple(grads.shape)}")
    L = rho.shape[1]
    outcomes = _support(position, L, max_support)
    if outcomes is None:
        raise ValueError(f"{type(position).__name__} does not enumerate a support of at most {max_support} outcomes at L={L}")
    rho, grads = rho.to(torch.float64), grads.to(torch.float64)
    p = position.inclusion(torch.tensor([L]), L)[0].to(torch.float64)
    lengths = torch.full((1, 2), float(L), dtype=torch.float64)

    def partials(sums: Tensor) -> Tensor:
        return loss.policy_partials(BranchSums(sums[None, :], torch.zeros(1, 2, dtype=torch.float64), lengths), beta)[0]

    c_exact = partials(rho.sum(1))
    exact = (c_exact[:, None] * grads.sum(1)).sum(0)
    draws = []  # (probability, pruned-coefficient gradient, exact-coefficient gradient)
    for mask_w, prob_w in outcomes:
        for mask_l, prob_l in outcomes:
            w = torch.stack([mask_w, mask_l]).to(torch.float64) / p  # [2, L] IPW weights (0 where not scored)
            g_hat = (w[:, :, None] * grads).sum(1)  # [2, P]
            c_hat = partials((w * rho).sum(1))
            draws.append((prob_w * prob_l, (c_hat[:, None] * g_hat).sum(0), (c_exact[:, None] * g_hat).sum(0)))
    mean = sum(pr * g for pr, g, _ in draws)
    variance = sum(pr * float((g - mean).pow(2).sum()) for pr, g, _ in draws)
    variance_exact = sum(pr * float((g - exact).pow(2).sum()) for pr, _, g in draws)
    return CoefficientBias(exact, mean, float((mean - exact).norm()), float(exact.norm()), variance, variance_exact)
