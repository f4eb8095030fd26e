"""Gradient noise of a pruned step against the batch's own noise: the quantities that decide whether pruning pays.

A step's gradient estimate at batch ``B`` is ``g_hat = (1/B) sum_i g_hat_i`` over ``B`` pairs drawn from the
data; ``g_i`` is pair ``i``'s exact DPO gradient and ``g_hat_i`` its pruned estimate (``E[g_hat_i | i] = g_i``).
By the law of total variance its total variance (the trace of the covariance) is

    Var[g_hat] = between / B + E|g_hat - g_B|^2,        g_B = (1/B) sum_i g_i,

``between`` being the trace of the covariance of ``g_i`` over pairs. The second term, scaled by ``B``, is the
sampler's **extra within-pair variance** ``within = B E|g_hat - g_B|^2``; measured on the whole batch it also
counts samplers that couple pairs (antithetic branches). A pruned step at batch ``B`` that costs ``1/k`` of a
vanilla step has variance ``(between + within) / B``; vanilla shrunk to the same cost per step (batch ``B / k``)
has ``k between / B``. So at equal cost pruning has the lower variance iff ``within < (k - 1) between``, and
:func:`relative_inefficiency` ``(1 + within / between) / k`` is the pruned step's variance times cost relative to
vanilla's: below 1, pruning buys more variance reduction per second.

This module measures these through the module's own step (plan, execute, estimate, backward), so the samplers
measured are the ones a run trains with. ``lit_prunedpo.callbacks.AutoPruning`` calibrates a run with it;
``lit_prunedpo_lab.study.noise`` builds the regime map's noise model on it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch

if TYPE_CHECKING:
    from lit_prunedpo.module import PrunedDPO

__all__ = [
    "RunningBetween", "Samplers", "between_variance", "gradient", "pair", "relative_inefficiency", "squared_distance",
    "timed_gradient", "within_variance"
]

Samplers = tuple[Any, Any, Any]  # (prefix, position, branch) sampler objects, as lit_prunedpo.modes gives them


def between_variance(per_pair: Tensor) -> float:
    """Trace of the covariance of per-pair gradients ``[n, P]`` (``n >= 2``), unbiased: ``sum_i |g_i - mean|^2 / (n -
    1)``."""
    if per_pair.ndim != 2 or per_pair.shape[0] < 2:
        raise ValueError(f"between_variance needs [n >= 2, P] per-pair gradients, got shape {tuple(per_pair.shape)}")
    g = per_pair.double()
    return float(((g - g.mean(0)) ** 2).sum() / (g.shape[0] - 1))


#: elements per slice of :func:`squared_distance` (32 MiB of doubles): its temporaries stay that small on any model
_CHUNK = 1 << 22


class RunningBetween:
    """:func:`between_variance` of per-pair gradients added one at a time (Welford's update, in double precision):
    the same figure, up to rounding, in the memory of two gradients instead of a stack of ``n`` gradients and three
    double copies of it (about 30 GB for 8 pairs of a 135M-parameter model)."""

    def __init__(self) -> None:
        self.n = 0
        self._mean: Tensor | None = None
        self._m2 = 0.0

    def add(self, g: Tensor) -> None:
        """Add one pair's flattened gradient."""
        x = g.detach().flatten().to(torch.float64, copy=True)  # a copy: updated in place below
        self.n += 1
        if self._mean is None:
            self._mean = x
            return
        x.sub_(self._mean)  # the deviation from the mean of the earlier ones
        self._m2 += float(x.dot(x)) * (self.n - 1) / self.n
        self._mean.add_(x, alpha=1.0 / self.n)

    @property
    def value(self) -> float:
        """``sum_i |g_i - mean|^2 / (n - 1)``.

        Raises:
            ValueError: with fewer than 2 gradients added.
        """
        if self.n < 2:
            raise ValueError(f"between_variance needs n >= 2 per-pair gradients, got {self.n}")
        return self._m2 / (self.n - 1)


def squared_distance(a: Tensor, b: Tensor) -> float:
    """``|a - b|^2`` in double precision, a slice at a time (no double copy of a whole gradient)."""
    if a.shape != b.shape:
        raise ValueError(f"squared_distance needs equal shapes, got {tuple(a.shape)} and {tuple(b.shape)}")
    a, b = a.reshape(-1), b.reshape(-1)
    return sum(float((a[i:i + _CHUNK].double() - b[i:i + _CHUNK].double()).pow_(2).sum())
               for i in range(0, a.numel(), _CHUNK)) if a.numel() else 0.0


def within_variance(squared_distances: Sequence[float], batch_size: int) -> float:
    """``batch_size * mean_d |g_hat_d - g_B|^2`` from the draws' squared distances to the exact batch gradient:
    the extra within-pair variance per pair (module docstring)."""
    if not squared_distances:
        raise ValueError("within_variance needs at least one draw")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    return batch_size * sum(squared_distances) / len(squared_distances)


def relative_inefficiency(between: float, within: float, k: float) -> float:
    """``(1 + within / between) / k``: a pruned step's gradient variance times its cost, relative to a vanilla
    step's (module docstring); ``inf`` when ``between`` is 0 and ``within`` is not.

    Raises:
        ValueError: on a negative variance or a non-positive ``k``.
    """
    if between < 0 or within < 0 or not k > 0:
        raise ValueError(f"need variances >= 0 and k > 0, got between={between!r}, within={within!r}, k={k!r}")
    if between == 0:
        return 1.0 / k if within == 0 else float("inf")
    return (1.0 + within / between) / k


def pair(batch: PreferenceBatch, i: int) -> PreferenceBatch:
    """Pair ``i`` of ``batch`` alone (its padding columns kept: they are masked)."""
    return PreferenceBatch(**{f.name: getattr(batch, f.name)[i:i + 1] for f in dataclasses.fields(batch)})


def gradient(module: PrunedDPO, batch: PreferenceBatch, samplers: Samplers, generator: torch.Generator) -> Tensor:
    """The flattened gradient of the trainable policy parameters of one step of ``module`` on ``batch`` with
    ``samplers`` (the module's own scorer, reference and layout); the module's gradients are left set."""
    module.zero_grad(set_to_none=True)
    prefix, position, branch = samplers
    parts = module.parts_with(prefix, position, branch)  # admitted as training admits them (its fallback, say)
    module.step(batch, parts, generator).estimate.objective.backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in module.policy.parameters() if p.requires_grad])


def timed_gradient(module: PrunedDPO, batch: PreferenceBatch, samplers: Samplers,
                   generator: torch.Generator) -> tuple[Tensor, float]:
    """:func:`gradient` and the seconds (wall clock) it took."""
    start = time.perf_counter()
    g = gradient(module, batch, samplers, generator)
    return g, time.perf_counter() - start
