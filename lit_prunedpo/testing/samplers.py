"""Checks of one sampler at a time: a position, prefix or branch sampler draws with the probabilities it reports,
exactly where its support is small and by Monte Carlo always."""

from __future__ import annotations

import math

import torch

from lit_prunedpo.samplers import BranchSampler, PositionSampler, PrefixSampler
from lit_prunedpo.testing.report import EXACT_TOL, SamplerReport, check_exact, check_monte_carlo, enumerate_support

DEFAULT_LENGTHS = (1, 2, 3, 5, 8, 13, 40)


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
        outcomes = enumerate_support(sampler, L, max_support)
        rho = torch.randn(L, generator=g, dtype=torch.float64)
        if outcomes is not None:
            total = sum(prob for _, prob in outcomes)
            check_exact(report, f"L={L}: support probabilities sum", torch.tensor([total], dtype=torch.float64),
                        torch.tensor([1.0], dtype=torch.float64))
            marginal = sum(prob * mask.to(torch.float64) for mask, prob in outcomes)
            check_exact(report, f"L={L}: inclusion probabilities", marginal, p[:L])
            mean = sum(prob * (mask * rho / p[:L]).sum() for mask, prob in outcomes)
            check_exact(report, f"L={L}: E[R_hat]", torch.tensor([float(mean)], dtype=torch.float64), rho.sum()[None])
        masks = sampler.draw(kept.expand(num_draws), width, g)
        assert (masks.shape == (num_draws, width)
                and masks.dtype == torch.bool), "draw() must return a bool [N, width] mask"
        assert not bool(masks[:, L:].any()), f"L={L}: draw() scored a position past the kept prefix"
        freq = masks[:, :L].double().mean(0)
        check_monte_carlo(report, f"L={L}: inclusion frequency", freq, p[:L], (p[:L] * (1 - p[:L]) / num_draws).sqrt(),
                          z)
        est = (masks[:, :L] * rho / p[:L]).sum(1)
        check_monte_carlo(report, f"L={L}: E[R_hat]", est.mean()[None], rho.sum()[None],
                          (est.std() / math.sqrt(num_draws))[None], z)
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
    check_exact(report, "pmf sums", pmf.sum(1), torch.ones(len(lengths), dtype=torch.float64))
    rho = torch.randn(len(lengths), width, generator=g, dtype=torch.float64) * valid
    # E[R_hat | L] = sum_{t<=L} rho_t / s_t, exactly over the pmf.
    exact_mean = torch.stack(
        [sum(pmf[i, l - 1] * (rho[i, :l] / s[i, :l]).sum() for l in range(1, int(T[i]) + 1))
         for i in range(len(lengths))]
    )
    check_exact(report, "E[R_hat] over the pmf", exact_mean, rho.sum(1))

    draws = torch.stack([sampler.draw(T, g) for _ in range(num_draws)])  # [n, N]
    assert bool(((draws >= 1) & (draws <= T)).all()), "draw() returned a kept length outside [1, T]"
    t = torch.arange(1, width + 1)
    survived = (draws[:, :, None] >= t[None, None, :]).double()  # [n, N, width]
    freq = survived.mean(0)
    check_monte_carlo(report, "survival frequency", freq[valid], s[valid], (s * (1 - s) / num_draws).sqrt()[valid], z)
    est = (survived * rho / s.clamp(min=EXACT_TOL)).sum(-1)  # [n, N]
    check_monte_carlo(report, "E[R_hat]", est.mean(0), rho.sum(1), est.std(0) / math.sqrt(num_draws), z)
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
        outcomes = enumerate_support(sampler, B, max_support)
        if outcomes is not None:
            check_exact(report, f"B={B}: support probabilities sum", torch.tensor([sum(p for _, p in outcomes)],
                                                                                  dtype=torch.float64),
                        torch.tensor([1.0], dtype=torch.float64))
            check_exact(report, f"B={B}: branch probabilities", sum(p * m.to(torch.float64) for m, p in outcomes), q)
            mean = sum(p * (m * sign * grads / q).sum(1) for m, p in outcomes)
            check_exact(report, f"B={B}: E[branch-weighted gradient]", mean, target)
        masks = torch.stack([sampler.draw(B, g) for _ in range(num_draws)]).to(torch.float64)  # [n, B, 2]
        check_monte_carlo(report, f"B={B}: branch frequency", masks.mean(0), q, (q * (1 - q) / num_draws).sqrt(), z)
        est = (masks * sign * grads / q).sum(-1)
        check_monte_carlo(report, f"B={B}: E[branch-weighted gradient]", est.mean(0), target,
                          est.std(0) / math.sqrt(num_draws), z)
    return report
