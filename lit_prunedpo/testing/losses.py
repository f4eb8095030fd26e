"""Checks of what a loss computes from pruned sums: a reward estimate's unbiasedness (:func:`check_reward_estimate`)
and the bias a loss's coefficient at the pruned sums trades for variance (:func:`coefficient_bias`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from lit_prunedpo.step.estimate import ipw_sums
from lit_prunedpo.losses import BranchSums, PreferenceLoss
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import AllPositions, BothBranches, FullPrefix, PositionSampler, PrefixSampler
from lit_prunedpo.testing.end_to_end import at_scored, scored_values, synthetic_batch
from lit_prunedpo.testing.report import SamplerReport, check_exact, check_monte_carlo, enumerate_support


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
    * **Monte Carlo**: ``num_draws`` plans from the real :func:`lit_prunedpo.step.plan.plan_step` and
      :func:`lit_prunedpo.step.estimate.ipw_sums`; the mean of ``reward`` lies within ``z`` standard errors.
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

    expected = _enumerated_sums(prefix, position, rho, full, max_support)
    if expected is None:
        report.notes.append(f"{type(position).__name__} does not enumerate its support: no exact check")
    else:
        check_exact(report, "E[reward(R_hat)] by enumeration", reward(BranchSums(expected, zero, full)), truth)

    values = []
    lse = 1.0 + rho.neg()  # any log-sum-exps will do for a sampler that splits the log-softmax, and any baseline
    for _ in range(num_draws):
        plan = plan_step(batch, prefix, position, BothBranches(), g)
        scored = [scored_values(grp, rho, lse) for grp in plan.groups]
        baselines = [at_scored(grp, lse / 2) for grp in plan.groups] if plan.reference_lse else None
        values.append(reward(BranchSums(ipw_sums(plan, scored, batch.num_pairs, baselines), zero, full)))
    stacked = torch.stack(values)
    check_monte_carlo(report, "E[reward(R_hat)]", stacked.mean(0), truth, stacked.std(0) / math.sqrt(num_draws), z)
    return report


def _enumerated_sums(prefix: PrefixSampler, position: PositionSampler, rho: Tensor, full: Tensor,
                     max_support: int) -> Tensor | None:
    """``E[R_hat]`` of every response (``[B, 2]``), exactly: its kept length over the prefix sampler's marginal pmf,
    its scored positions over the position sampler's ``support`` (``rho``: ``[B, 2, T]`` per-token values, ``full``:
    the full lengths). ``None`` when the position sampler cannot enumerate its support within ``max_support``."""
    flat_lengths, flat_rho, width = full.long().reshape(-1), rho.reshape(-1, rho.shape[-1]), rho.shape[-1]
    survival, pmf = prefix.survival(flat_lengths, width), prefix.pmf(flat_lengths, width)
    expected = torch.zeros(flat_lengths.shape, dtype=torch.float64)
    for r, T in enumerate(flat_lengths.tolist()):
        for kept in range(1, T + 1):
            if float(pmf[r, kept - 1]) <= 0:
                continue
            outcomes = enumerate_support(position, kept, max_support)
            if outcomes is None:
                return None
            inclusion = position.inclusion(torch.tensor([kept]), width)[0, :kept].to(torch.float64)
            weight = 1.0 / (survival[r, :kept] * inclusion)
            for mask, prob in outcomes:
                expected[r] += float(pmf[r, kept - 1]) * prob * (mask * flat_rho[r, :kept] * weight).sum()
    return expected.view(full.shape)


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
        raise ValueError(f"coefficient_bias needs rho [2, L] and grads [2, L, P], got {tuple(rho.shape)} and "
                         f"{tuple(grads.shape)}")
    L = rho.shape[1]
    outcomes = enumerate_support(position, L, max_support)
    if outcomes is None:
        raise ValueError(f"{type(position).__name__} does not enumerate a support of at most {max_support} outcomes at "
                         f"L={L}")
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
