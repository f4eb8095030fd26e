"""Prefix (sequence) samplers: how much of each response is executed.

``SharedFractionPrefix`` draws one cut fraction ``u ~ Uniform[min_fraction, 1]`` per batch and keeps
``L_i = ceil(u * T_i)`` tokens of every response. Sharing ``u`` is what makes the saving survive padding:
the longest executed response shrinks with ``u``, so the padded tensor that runs is shorter. The estimator
only needs each sequence's marginal survival ``P(L_i >= t)``, which is exact and closed-form:

    P(ceil(u T) >= t) = P(u > (t - 1) / T) = (1 - max(min_fraction, (t - 1) / T)) / (1 - min_fraction)
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_prunedpo.samplers.base import PrefixSampler, check_probability


def _positions(width: int) -> Tensor:
    return torch.arange(1, width + 1, dtype=torch.float64)


class FullPrefix(PrefixSampler):
    """Keep every response whole (no sequence pruning)."""

    def draw(self, lengths: Tensor, generator: torch.Generator) -> Tensor:
        return lengths.clone()

    def survival(self, lengths: Tensor, width: int) -> Tensor:
        return (_positions(width)[None, :] <= lengths[:, None]).to(torch.float64)


class SharedFractionPrefix(PrefixSampler):
    """Keep ``ceil(u * T_i)`` tokens of every response, with one ``u ~ Uniform[min_fraction, 1]`` per batch.

    Args:
        min_fraction: smallest fraction of a response that is kept, in (0, 1]. Expected executed response
            length is about ``(1 + min_fraction) / 2`` of the full one; the IPW weight of a long response's last
            token is ``1 / P(L = T) = T * (1 - min_fraction)``, so small values raise the variance.

    Raises:
        ValueError: if ``min_fraction`` is outside (0, 1].
    """

    def __init__(self, min_fraction: float = 0.5) -> None:
        check_probability("min_fraction", min_fraction)
        self.min_fraction = float(min_fraction)

    def draw(self, lengths: Tensor, generator: torch.Generator) -> Tensor:
        if self.min_fraction == 1.0:
            return lengths.clone()
        u = self.min_fraction + (1.0 - self.min_fraction) * torch.rand((), generator=generator, dtype=torch.float64)
        kept = torch.ceil(u * lengths.to(torch.float64)).long()
        return kept.clamp(min=1).minimum(lengths)

    def survival(self, lengths: Tensor, width: int) -> Tensor:
        T = lengths.to(torch.float64)[:, None]
        t = _positions(width)[None, :]
        if self.min_fraction == 1.0:
            return (t <= T).to(torch.float64)
        m = self.min_fraction
        s = (1.0 - torch.clamp((t - 1) / T, min=m)) / (1.0 - m)
        return torch.where(t <= T, s.clamp(0.0, 1.0), torch.zeros_like(s))
