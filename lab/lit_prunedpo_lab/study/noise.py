"""The map's noise model: gradient variances that predict a cell's verdict before training.

A step's gradient estimate at batch ``B`` is ``g_hat = (1/B) sum_i g_hat_i`` over ``B`` pairs drawn from the
data; ``g_i`` is pair ``i``'s exact DPO gradient and ``g_hat_i`` its pruned estimate (``E[g_hat_i | i] = g_i``).
By the law of total variance its total variance (the trace of the covariance) is

    Var[g_hat] = between / B + E|g_hat - g_B|^2,        g_B = (1/B) sum_i g_i,

``between`` being the trace of the covariance of ``g_i`` over pairs. The second term, scaled by ``B``, is the
mode's **extra within-pair variance** ``within = B E|g_hat - g_B|^2``: with pairs pruned independently it is the
mean over pairs of ``E|g_hat_i - g_i|^2``, and measured on the whole batch it also counts samplers that couple
pairs (antithetic branches). So ``Var[pruned at B] = (between + within) / B``, while vanilla shrunk by the cost
ratio ``k`` (batch ``B / k``, the same cost per step when a step's cost is proportional to its batch) has
``Var = k between / B``: at equal cost per step pruning has the lower variance iff

    within < (k - 1) between                                          (:func:`predict`)

The variances and the gradients are :mod:`lit_prunedpo.gradient_noise`'s (shared with the ``AutoPruning``
callback's calibration). Measured (:func:`measure`) at a cell's initial weights, where the policy equals the reference:
every margin is exactly 0, also the pruned estimate's, so the pruned estimator has no bias there and ``within`` is a
pure variance. ``between`` is the unbiased sample variance of per-pair gradients ``(1/(n-1)) sum_i |g_i - mean|^2``
(:func:`between_variance`), each ``g_i`` the gradient of the real exact step on pair ``i`` alone; ``within``
is ``B`` times the mean over ``draws`` real pruned steps (plan, execute, estimate, backward of the module's own
``step``) of ``|g_hat - g_B|^2`` (:func:`within_variance`), ``g_B`` the exact step's gradient on the batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.gradient_noise import between_variance, gradient, pair, squared_distance, within_variance
from lit_prunedpo_lab.study.arms import MODES

__all__ = ["NoiseReport", "agreement", "between_variance", "measure", "pair", "predict", "squared_distance",
           "within_variance"]


def _gradient(module: PrunedDPO, batch: PreferenceBatch, mode: str, generator: torch.Generator) -> Tensor:
    return gradient(module, batch, MODES[mode](), generator)


def predict(between: float, within: float, k: float) -> str:
    """``"prune better"`` iff ``within < (k - 1) * between`` (lower variance at equal cost per step), else
    ``"vanilla better"``.

    Raises:
        ValueError: on a negative variance or a non-positive ``k``.
    """
    if between < 0 or within < 0 or not k > 0:
        raise ValueError(f"need variances >= 0 and k > 0, got between={between!r}, within={within!r}, k={k!r}")
    return "prune better" if within < (k - 1.0) * between else "vanilla better"


def agreement(prediction: str, verdict: str) -> str:
    """Whether a measured verdict (``WIN``: pruning faster, ``LOSS``: slower, ``TIE``) agrees with ``prediction``."""
    if verdict == "TIE":
        return "undecided (TIE)"
    measured = "prune better" if verdict == "WIN" else "vanilla better"
    return "agrees" if measured == prediction else "disagrees"


@dataclass(frozen=True)
class NoiseReport:
    """What :func:`measure` found on one batch: ``between``, per mode ``within`` and the exact gradient's size."""

    pairs: int
    draws: int
    between: float
    within: dict[str, float]
    grad_norm_sq: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def measure(module: PrunedDPO, batch: PreferenceBatch, modes: Sequence[str], draws: int, seed: int = 0) -> NoiseReport:
    """``between`` from the exact per-pair gradients of ``batch`` and each mode's ``within`` from ``draws``
    pruned steps, through ``module``'s own step (module docstring).

    Raises:
        ValueError: on fewer than 2 pairs, ``draws`` < 1 or an unknown mode.
    """
    if batch.num_pairs < 2 or draws < 1:
        raise ValueError(f"the noise model needs >= 2 pairs and >= 1 draw, got {batch.num_pairs} and {draws}")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown modes {unknown}; choose from {','.join(MODES)}")
    g = torch.Generator().manual_seed(seed)
    per_pair = torch.stack([_gradient(module, pair(batch, i), "vanilla", g) for i in range(batch.num_pairs)])
    exact = _gradient(module, batch, "vanilla", g)
    within = {m: within_variance([squared_distance(_gradient(module, batch, m, g), exact) for _ in range(draws)],
                                 batch.num_pairs)
              for m in modes if m != "vanilla"}
    module.zero_grad(set_to_none=True)
    return NoiseReport(batch.num_pairs, draws, between_variance(per_pair), within, float(exact.double().pow(2).sum()))
