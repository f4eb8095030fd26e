"""Branch samplers: which preference branch of each pair is back-propagated.

``RandomBranch`` picks one branch per pair independently; ``AntitheticBranch`` gives exactly half the
pairs of a batch the chosen branch and half the rejected one (the odd pair, if any, by a fair coin),
which keeps the marginals at 1/2 while making the batch's gradient mix less noisy.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

import torch
from torch import Tensor

from lit_prunedpo.samplers.base import BranchSampler, check_probability


def _one_branch_mask(chosen: Tensor) -> Tensor:
    return torch.stack([chosen, ~chosen], dim=1)


class BothBranches(BranchSampler):
    """Back-propagate both branches of every pair (no branch pruning: concatenated DPO)."""

    def probabilities(self, num_pairs: int) -> Tensor:
        return torch.ones(num_pairs, 2, dtype=torch.float64)

    def draw(self, num_pairs: int, generator: torch.Generator) -> Tensor:
        return torch.ones(num_pairs, 2, dtype=torch.bool)

    def support(self, num_pairs: int) -> Iterator[tuple[Tensor, float]]:
        yield torch.ones(num_pairs, 2, dtype=torch.bool), 1.0


class RandomBranch(BranchSampler):
    """Back-propagate exactly one branch per pair: chosen with ``chosen_probability``, else rejected.

    Args:
        chosen_probability: probability of back-propagating the chosen branch, in (0, 1).

    Raises:
        ValueError: if ``chosen_probability`` is outside (0, 1): the other branch would never get a gradient.
    """

    def __init__(self, chosen_probability: float = 0.5) -> None:
        check_probability("chosen_probability", chosen_probability, allow_one=False)
        self.chosen_probability = float(chosen_probability)

    def probabilities(self, num_pairs: int) -> Tensor:
        q = torch.tensor([self.chosen_probability, 1.0 - self.chosen_probability], dtype=torch.float64)
        return q.expand(num_pairs, 2).clone()

    def draw(self, num_pairs: int, generator: torch.Generator) -> Tensor:
        chosen = torch.rand(num_pairs, generator=generator, dtype=torch.float64) < self.chosen_probability
        return _one_branch_mask(chosen)

    def support(self, num_pairs: int) -> Iterator[tuple[Tensor, float]]:
        for bits in itertools.product((True, False), repeat=num_pairs):
            chosen = torch.tensor(bits, dtype=torch.bool)
            k = int(chosen.sum())
            (yield _one_branch_mask(chosen),
             self.chosen_probability**k * (1 - self.chosen_probability) ** (num_pairs - k))


class AntitheticBranch(BranchSampler):
    """Back-propagate the chosen branch of a random half of the pairs and the rejected branch of the rest.

    Each pair's marginal probability is 1/2 for either branch. With an odd number of pairs the left-over pair
    takes its branch by a fair coin.
    """

    def probabilities(self, num_pairs: int) -> Tensor:
        return torch.full((num_pairs, 2), 0.5, dtype=torch.float64)

    def draw(self, num_pairs: int, generator: torch.Generator) -> Tensor:
        order = torch.randperm(num_pairs, generator=generator)
        chosen = torch.zeros(num_pairs, dtype=torch.bool)
        half = num_pairs // 2
        chosen[order[:half]] = True
        if num_pairs % 2:
            chosen[order[-1]] = bool(torch.rand((), generator=generator) < 0.5)
        return _one_branch_mask(chosen)

    def support(self, num_pairs: int) -> Iterator[tuple[Tensor, float]]:
        half = num_pairs // 2
        sizes = [half] if num_pairs % 2 == 0 else [half, half + 1]
        for size in sizes:
            prob = 1.0 / (len(sizes) * math.comb(num_pairs, size))
            for subset in itertools.combinations(range(num_pairs), size):
                chosen = torch.zeros(num_pairs, dtype=torch.bool)
                chosen[list(subset)] = True
                yield _one_branch_mask(chosen), prob
