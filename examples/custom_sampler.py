"""A user's own position sampler, plugged in by ``class_path`` without touching the package.

``TailWeightedPositions`` scores later response positions more often than early ones (the inclusion
probability rises linearly from ``first`` at t = 1 to ``last`` at t = L), e.g. because late tokens carry
more of the preference signal in long answers. It only has to report its inclusion probabilities
honestly; ``lit_prunedpo.testing.check_position_sampler`` verifies that it does (see
``tests/test_examples.py``), and the estimator re-weights by them.

Run it:  PYTHONPATH=examples lit-prunedpo fit --config examples/custom_sampler.yaml
"""

from __future__ import annotations

import itertools
from typing import Iterator

import torch
from torch import Tensor

from lit_prunedpo.samplers import PositionSampler


class TailWeightedPositions(PositionSampler):
    """Independent Bernoulli positions with ``p_t = first + (last - first) * (t - 1) / max(1, L - 1)``.

    Args:
        first: inclusion probability of the first position, in (0, 1].
        last: inclusion probability of the last kept position, in (0, 1].
    """

    def __init__(self, first: float = 0.2, last: float = 0.8) -> None:
        for name, value in (("first", first), ("last", last)):
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        self.first, self.last = float(first), float(last)

    def inclusion(self, kept: Tensor, width: int) -> Tensor:
        t = torch.arange(width, dtype=torch.float64)[None, :]
        span = (kept.to(torch.float64) - 1).clamp(min=1)[:, None]
        p = self.first + (self.last - self.first) * t / span
        return torch.where(t < kept[:, None], p, torch.zeros_like(p))

    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        u = torch.rand(kept.shape[0], width, generator=generator, dtype=torch.float64)
        return u < self.inclusion(kept, width)

    def support(self, kept: int) -> Iterator[tuple[Tensor, float]]:
        p = self.inclusion(torch.tensor([kept]), kept)[0]
        for bits in itertools.product((True, False), repeat=kept):
            mask = torch.tensor(bits)
            yield mask, float(torch.where(mask, p, 1 - p).prod())
