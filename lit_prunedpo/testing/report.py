"""What every check of :mod:`lit_prunedpo.testing` records (:class:`SamplerReport`) and how it compares: exactly, to
:data:`EXACT_TOL` (:func:`check_exact`), or by Monte Carlo, within ``z`` standard errors (:func:`check_monte_carlo`);
and a sampler's support, enumerated where it is small enough (:func:`enumerate_support`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

EXACT_TOL = 1e-9


@dataclass
class SamplerReport:
    """What was checked: counts of exact and Monte Carlo checks and the largest deviation in standard errors."""

    exact_checks: int = 0
    monte_carlo_checks: int = 0
    max_z: float = 0.0
    notes: list[str] = field(default_factory=list)


def check_monte_carlo(report: SamplerReport, what: str, observed: Tensor, expected: Tensor, stderr: Tensor,
                      z: float) -> None:
    """Count a Monte Carlo check: every ``observed`` mean within ``z`` standard errors ``stderr`` of ``expected``.

    Raises:
        AssertionError: with the numbers of the worst deviation.
    """
    dev = (observed - expected).abs() / stderr.clamp(min=1e-12)
    # A deviation with zero standard error must be exactly zero (deterministic outcome).
    dev = torch.where(stderr > 0, dev, torch.where((observed - expected).abs() < 1e-12, 0.0, math.inf))
    worst = float(dev.max()) if dev.numel() else 0.0
    report.monte_carlo_checks += 1
    report.max_z = max(report.max_z, worst)
    if worst > z:
        i = int(dev.argmax())
        raise AssertionError(
            f"{what}: Monte Carlo mean {float(observed.flatten()[i]):.6g} vs expected "
            f"{float(expected.flatten()[i]):.6g} is {worst:.2f} standard errors away (tolerance {z})"
        )


def check_exact(report: SamplerReport, what: str, value: Tensor, expected: Tensor) -> None:
    """Count an exact check: ``value`` equals ``expected`` to :data:`EXACT_TOL`.

    Raises:
        AssertionError: with both values.
    """
    report.exact_checks += 1
    err = float((value - expected).abs().max()) if value.numel() else 0.0
    if err > EXACT_TOL:
        raise AssertionError(f"{what}: exact enumeration gives {value.tolist()} but expected {expected.tolist()}")


def enumerate_support(sampler, arg, max_support: int) -> list | None:
    """``sampler.support(arg)`` as a list of ``(outcome, probability)``; ``None`` where the sampler cannot enumerate
    it or it has more than ``max_support`` outcomes."""
    try:
        outcomes = []
        for outcome in sampler.support(arg):
            outcomes.append(outcome)
            if len(outcomes) > max_support:
                return None
        return outcomes
    except NotImplementedError:
        return None
