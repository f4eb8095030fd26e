"""Branch pruning only where a pair's two responses diverge (a design for the regime map's near-duplicate pairs).

Back-propagating one branch of a pair adds ``|c|^2 |grad R_w + grad R_l|^2`` of variance (``q = 1/2``): about
the signal ``|grad R_w - grad R_l|^2`` when the two responses are unrelated, many times it for near-duplicates,
whose two gradients nearly cancel in the signal but add up in the noise. :class:`DivergentBranch` therefore
prunes a branch only in pairs whose responses differ in a large share of their tokens, read from the token ids
before any forward, and back-propagates both branches of the others. Its probabilities are exact per pair
(:class:`PerPairBranch`), so the planner's IPW weights ``1 / q`` keep the estimator unbiased.

The share is what remains of the longer response once the two responses' common prefix and common suffix are
removed: a local edit (a substituted, inserted or deleted token) leaves ``~1/T``, unrelated responses ``~1``.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator, Sequence

import torch
from torch import Tensor

from lit_prunedpo.samplers.base import BranchSampler, check_probability


def differing_share(response_ids: Tensor, response_mask: Tensor) -> Tensor:
    """``[B]`` float64: per pair, ``(max(T_w, T_l) - common prefix - common suffix) / max(T_w, T_l)``, where the
    common prefix and suffix of the two responses' real tokens (``[B, 2, T]`` ids and mask) do not overlap."""
    if response_ids.ndim != 3 or response_ids.shape[1] != 2 or response_mask.shape != response_ids.shape:
        raise ValueError(f"differing_share needs [B, 2, T] response ids and mask, got {tuple(response_ids.shape)} "
                         f"and {tuple(response_mask.shape)}")
    shares = []
    for ids, mask in zip(response_ids.cpu(), response_mask.cpu()):
        w, l = ids[0][mask[0]], ids[1][mask[1]]
        n, longest = min(len(w), len(l)), max(len(w), len(l))
        if longest == 0:
            shares.append(0.0)
            continue
        same = (w[:n] == l[:n]).long()
        prefix = int(same.cumprod(0).sum())
        tail = (w.flip(0)[: n - prefix] == l.flip(0)[: n - prefix]).long()
        suffix = int(tail.cumprod(0).sum())
        shares.append((longest - prefix - suffix) / longest)
    return torch.tensor(shares, dtype=torch.float64)


class PerPairBranch(BranchSampler):
    """Pair ``i`` back-propagates one branch, chosen or rejected by a fair coin, with probability ``prune[i]``,
    and both branches otherwise: ``q_ib = 1 - prune[i] / 2``.

    What :class:`DivergentBranch` binds to a batch; usable alone for a fixed number of pairs.

    Args:
        prune: per-pair probability of back-propagating a single branch, each in [0, 1].

    Raises:
        ValueError: if ``prune`` is empty, not one-dimensional, or has an entry outside [0, 1].
    """

    def __init__(self, prune: Sequence[float] | Tensor) -> None:
        prune = torch.as_tensor(prune, dtype=torch.float64)
        if prune.ndim != 1 or prune.numel() == 0:
            raise ValueError("prune must be a non-empty list of per-pair probabilities, got shape "
                             f"{tuple(prune.shape)}")
        bad = ~((prune >= 0) & (prune <= 1))
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(f"prune[{i}] must be in [0, 1], got {float(prune[i])!r}")
        self.prune = prune

    def _check(self, num_pairs: int) -> None:
        if num_pairs != self.prune.numel():
            raise ValueError(f"{type(self).__name__} holds probabilities for {self.prune.numel()} pairs, asked for "
                             f"{num_pairs}")

    def probabilities(self, num_pairs: int) -> Tensor:
        self._check(num_pairs)
        return (1.0 - self.prune / 2)[:, None].expand(num_pairs, 2).clone()

    def draw(self, num_pairs: int, generator: torch.Generator) -> Tensor:
        self._check(num_pairs)
        u = torch.rand(num_pairs, 2, generator=generator, dtype=torch.float64)
        single, chosen = u[:, 0] < self.prune, u[:, 1] < 0.5
        return torch.stack([~single | chosen, ~single | ~chosen], dim=1)

    def support(self, num_pairs: int) -> Iterator[tuple[Tensor, float]]:
        self._check(num_pairs)
        outcomes = ((True, True), (True, False), (False, True))
        for combo in itertools.product(range(3), repeat=num_pairs):
            prob = math.prod(1.0 - float(r) if c == 0 else float(r) / 2 for c, r in zip(combo, self.prune))
            if prob > 0:
                yield torch.tensor([outcomes[c] for c in combo], dtype=torch.bool), prob


class DivergentBranch(BranchSampler):
    """Back-propagate one random branch only of the pairs whose responses differ in at least ``min_difference``
    of their tokens (:func:`differing_share`), with probability ``prune_probability``; both branches of the rest.

    Needs the batch's responses, so the planner binds it first (:meth:`for_batch` returns a
    :class:`PerPairBranch`); drawing from an unbound one is refused.

    Args:
        min_difference: the share of differing tokens from which a pair may be pruned, in [0, 1]. 0 prunes every
            pair (as :class:`~lit_prunedpo.samplers.RandomBranch` at ``prune_probability`` 1).
        prune_probability: probability that such a pair back-propagates a single branch, in (0, 1].

    Raises:
        ValueError: if ``min_difference`` is outside [0, 1] or ``prune_probability`` outside (0, 1].
    """

    def __init__(self, min_difference: float = 0.5, prune_probability: float = 1.0) -> None:
        if not 0.0 <= min_difference <= 1.0:
            raise ValueError(f"min_difference must be in [0, 1], got {min_difference!r}")
        check_probability("prune_probability", prune_probability)
        self.min_difference = float(min_difference)
        self.prune_probability = float(prune_probability)

    def for_batch(self, response_ids: Tensor, response_mask: Tensor) -> PerPairBranch:
        diverges = differing_share(response_ids, response_mask) >= self.min_difference
        return PerPairBranch(diverges.to(torch.float64) * self.prune_probability)

    def _unbound(self) -> RuntimeError:
        return RuntimeError(f"{type(self).__name__} sets each pair's probabilities from its responses: draw from "
                            "for_batch(response_ids, response_mask), which the planner must call first")

    def probabilities(self, num_pairs: int) -> Tensor:
        raise self._unbound()

    def draw(self, num_pairs: int, generator: torch.Generator) -> Tensor:
        raise self._unbound()
