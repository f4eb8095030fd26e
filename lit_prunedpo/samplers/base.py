"""The three sampler interfaces: which prefixes run, which positions get scored, which branches get a gradient.

Every sampler draws from a ``torch.Generator`` it is handed (never the global RNG) and reports the exact
probabilities of what it draws, which the estimator turns into inverse-probability weights. The base
classes are plain abstract classes, not dataclasses, so that jsonargparse accepts user subclasses.

A sampler knows nothing about models: it sees lengths and counts, and returns masks and probabilities.

``support`` enumerates every outcome with its probability. It is optional; where a sampler provides it,
:mod:`lit_prunedpo.testing` checks unbiasedness exactly instead of by Monte Carlo.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator

import torch
from torch import Tensor


def check_probability(name: str, value: float, *, allow_one: bool = True) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``0 < value <= 1`` (or ``< 1``)."""
    upper_ok = value <= 1 if allow_one else value < 1
    if not (value > 0 and upper_ok):
        bound = "(0, 1]" if allow_one else "(0, 1)"
        raise ValueError(f"{name} must be in {bound}, got {value!r}")


class PrefixSampler(ABC):
    """Draws the kept response length ``L`` (1..T) of every executed sequence.

    Only ``prompt ++ y_1..y_{L-1}`` runs through the model. Savings survive padding only if the drawn
    lengths shorten the padded batch, e.g. by sharing one cut fraction across the batch.
    """

    @abstractmethod
    def draw(self, lengths: Tensor, generator: torch.Generator) -> Tensor:
        """Return kept lengths ``[N]`` with ``1 <= L_i <= lengths_i``, for response lengths ``[N]`` (all >= 1)."""

    @abstractmethod
    def survival(self, lengths: Tensor, width: int) -> Tensor:
        """Return ``s[i, t-1] = P(L_i >= t)`` as ``[N, width]`` float64; ``s`` must be > 0 for every ``t <= lengths_i``.

        Entries past a sequence's length are 0.
        """

    def pmf(self, lengths: Tensor, width: int) -> Tensor:
        """``[N, width]``: ``P(L_i = l)`` at column ``l-1``, derived from :meth:`survival`."""
        s = self.survival(lengths, width)
        return s - torch.cat([s[:, 1:], torch.zeros_like(s[:, :1])], dim=1)


class PositionSampler(ABC):
    """Draws which of the kept positions ``t <= L`` get scored (LM head and log-softmax run only there)."""

    #: whether the draws choose only where the log-sum-exp runs, every executed position getting its target logit
    #: (:class:`~lit_prunedpo.samplers.LogSoftmaxSplit`, which sets it); the planner reads it, not the class
    splits_log_softmax: bool = False

    @abstractmethod
    def inclusion(self, kept: Tensor, width: int) -> Tensor:
        """Return ``p[i, t-1] = P(t scored | L_i)`` as ``[N, width]`` float64: > 0 for ``t <= L_i``, 0 after."""

    @abstractmethod
    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        """Return a bool mask ``[N, width]`` of scored positions, False past ``kept_i``."""

    def support(self, kept: int) -> Iterator[tuple[Tensor, float]]:
        """Yield every mask ``[kept]`` this sampler can draw for one sequence, with its probability."""
        raise NotImplementedError(f"{type(self).__name__} does not enumerate its support")


class BranchSampler(ABC):
    """Draws, for each pair, which branches (chosen = 0, rejected = 1) get a gradient.

    Branches without a gradient still run forward, under ``torch.no_grad()``, because the margin needs them.
    """

    @abstractmethod
    def probabilities(self, num_pairs: int) -> Tensor:
        """Return ``q[i, b] = P(branch b of pair i gets a gradient)`` as ``[num_pairs, 2]`` float64, all > 0."""

    @abstractmethod
    def draw(self, num_pairs: int, generator: torch.Generator) -> Tensor:
        """Return a bool mask ``[num_pairs, 2]`` of branches that get a gradient."""

    def support(self, num_pairs: int) -> Iterator[tuple[Tensor, float]]:
        """Yield every mask ``[num_pairs, 2]`` this sampler can draw, with its probability."""
        raise NotImplementedError(f"{type(self).__name__} does not enumerate its support")

    def for_batch(self, response_ids: Tensor, response_mask: Tensor) -> "BranchSampler":
        """The sampler that draws this batch's branches, given its responses (``[B, 2, T]`` ids and mask, on the
        CPU), before any forward. A sampler whose probabilities depend on the pairs returns one bound to them
        (:class:`lit_prunedpo.samplers.divergence.DivergentBranch`); the default is ``self``."""
        return self
