"""Position samplers: which kept response positions ``t <= L`` are scored.

Each reports the *conditional* first-order inclusion probability ``p_t(L)`` of what it draws; the LM head
and the log-softmax then run on the drawn positions only. All designs are vectorised over the rows of a
batch; all accept a generator and never touch the global RNG.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

import torch
from torch import Tensor

from lit_prunedpo.samplers.base import PositionSampler, check_probability


def _valid(kept: Tensor, width: int) -> Tensor:
    return torch.arange(width)[None, :] < kept[:, None]


class AllPositions(PositionSampler):
    """Score every kept position (no position pruning)."""

    def inclusion(self, kept: Tensor, width: int) -> Tensor:
        return _valid(kept, width).to(torch.float64)

    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        return _valid(kept, width)

    def support(self, kept: int) -> Iterator[tuple[Tensor, float]]:
        yield torch.ones(kept, dtype=torch.bool), 1.0


class BernoulliPositions(PositionSampler):
    """Score each kept position independently with probability ``p(L) = min(1, max(rate, min_expected / L))``.

    Args:
        rate: inclusion probability of a position, in (0, 1].
        min_expected: the floor: short sequences are scored at a higher rate so that at least this many
            positions are scored in expectation; it also caps the IPW weight ``1/p`` at ``L / min_expected``.
            0 disables the floor.

    Raises:
        ValueError: if ``rate`` is outside (0, 1] or ``min_expected`` is negative.
    """

    def __init__(self, rate: float = 0.5, min_expected: float = 1.0) -> None:
        check_probability("rate", rate)
        if min_expected < 0:
            raise ValueError(f"min_expected must be >= 0, got {min_expected!r}")
        self.rate = float(rate)
        self.min_expected = float(min_expected)

    def _p(self, kept: Tensor) -> Tensor:
        floor = self.min_expected / kept.to(torch.float64).clamp(min=1)
        return floor.clamp(min=self.rate).clamp(max=1.0)

    def inclusion(self, kept: Tensor, width: int) -> Tensor:
        return self._p(kept)[:, None] * _valid(kept, width)

    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        u = torch.rand(kept.shape[0], width, generator=generator, dtype=torch.float64)
        return (u < self._p(kept)[:, None]) & _valid(kept, width)

    def support(self, kept: int) -> Iterator[tuple[Tensor, float]]:
        p = float(self._p(torch.tensor([kept])))
        for bits in itertools.product((True, False), repeat=kept):
            mask = torch.tensor(bits, dtype=torch.bool)
            n = int(mask.sum())
            yield mask, p**n * (1 - p) ** (kept - n)


class FixedCountPositions(PositionSampler):
    """Score ``min(k, L)`` kept positions per sequence, drawn uniformly without replacement: ``p = min(1, k / L)``.

    Args:
        k: number of positions scored per sequence, >= 1.

    Raises:
        ValueError: if ``k < 1``.
    """

    def __init__(self, k: int = 16) -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        self.k = int(k)

    def inclusion(self, kept: Tensor, width: int) -> Tensor:
        p = (self.k / kept.to(torch.float64).clamp(min=1)).clamp(max=1.0)
        return p[:, None] * _valid(kept, width)

    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        valid = _valid(kept, width)
        scores = torch.rand(kept.shape[0], width, generator=generator, dtype=torch.float64)
        scores = scores.masked_fill(~valid, 2.0)  # invalid positions sort last
        rank = scores.argsort(dim=1).argsort(dim=1)
        return (rank < self.k) & valid

    def support(self, kept: int) -> Iterator[tuple[Tensor, float]]:
        k = min(self.k, kept)
        prob = 1.0 / math.comb(kept, k)
        for subset in itertools.combinations(range(kept), k):
            mask = torch.zeros(kept, dtype=torch.bool)
            mask[list(subset)] = True
            yield mask, prob


class StratifiedPositions(PositionSampler):
    """Split the kept positions into ``m = ceil(rate * L)`` contiguous strata of near-equal size and score one
    uniformly drawn position in each: ``p_t = 1 / |stratum(t)|``.

    Scored positions are spread along the response, which lowers the variance of the IPW sum compared with
    Bernoulli sampling at the same rate (neighbouring tokens' log-ratios are correlated).

    With ``min_count`` the number of strata is ``min(L, max(min_count, ceil(rate * L)))``: every response keeps
    at least ``min_count`` scored positions (all of them if it is shorter), not only in expectation as with
    :class:`BernoulliPositions`'s ``min_expected``, and still spread along it.

    Args:
        rate: fraction of kept positions scored, in (0, 1].
        min_count: the fewest positions scored per response (an integer >= 1); also caps the IPW weight at
            about ``L / min_count``.

    Raises:
        ValueError: if ``rate`` is outside (0, 1] or ``min_count`` is not an integer >= 1.
    """

    def __init__(self, rate: float = 0.25, min_count: int = 1) -> None:
        check_probability("rate", rate)
        if (isinstance(min_count, bool) or not isinstance(min_count, (int, float)) or int(min_count) != min_count
                or min_count < 1):
            raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
        self.rate = float(rate)
        self.min_count = int(min_count)

    def _strata(self, kept: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
        """Per position: stratum index, stratum start and stratum size (all ``[N, width]``)."""
        L = kept.clamp(min=1)[:, None]
        m = torch.ceil(self.rate * L.to(torch.float64)).long().clamp(min=self.min_count).minimum(L)
        t = torch.arange(width)[None, :]
        j = (t * m) // L
        start = (j * L + m - 1) // m
        size = ((j + 1) * L + m - 1) // m - start
        return j, start, size

    def inclusion(self, kept: Tensor, width: int) -> Tensor:
        _, _, size = self._strata(kept, width)
        return _valid(kept, width) / size.to(torch.float64)

    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        j, start, size = self._strata(kept, width)
        u = torch.rand(kept.shape[0], width, generator=generator, dtype=torch.float64)
        pick = torch.floor(u.gather(1, j.clamp(max=width - 1)) * size).long()
        t = torch.arange(width)[None, :]
        return (t - start == pick) & _valid(kept, width)

    def support(self, kept: int) -> Iterator[tuple[Tensor, float]]:
        j, start, size = (x[0] for x in self._strata(torch.tensor([kept]), kept))
        strata = [list(range(int(start[t]), int(start[t] + size[t]))) for t in range(kept) if t == start[t]]
        prob = 1.0 / math.prod(len(s) for s in strata)
        for picks in itertools.product(*strata):
            mask = torch.zeros(kept, dtype=torch.bool)
            mask[list(picks)] = True
            yield mask, prob


def _pair_uniforms(rows: int, width: int, generator: torch.Generator) -> Tensor:
    """``[rows, width]`` uniforms, one per (pair, column), shared by rows ``2i`` and ``2i + 1``."""
    if rows % 2:
        raise ValueError(f"a coupled position sampler draws for whole pairs (rows 2i, 2i + 1); got {rows} rows")
    u = torch.rand(rows // 2, width, generator=generator, dtype=torch.float64)
    return u.repeat_interleave(2, dim=0)


class CoupledBernoulliPositions(BernoulliPositions):
    """:class:`BernoulliPositions` with common random numbers across a pair's two branches.

    One uniform ``u_{i,t}`` is drawn per pair ``i`` and response position ``t``; the chosen row scores ``t`` iff
    ``u_{i,t} < p(L_w)`` and the rejected row iff ``u_{i,t} < p(L_l)``. Each row's inclusion probability is
    unchanged, so every IPW sum stays exactly unbiased; but the two branches now score the *same* positions
    (all of them when ``p(L_w) = p(L_l)``), so where their log-ratios at a position are nearly equal (a pair that
    differs by a local edit) those terms nearly cancel in the margin's estimate instead of adding up as noise.

    Rows ``2i`` and ``2i + 1`` of the kept lengths must be one pair's chosen and rejected response (as in
    :func:`lit_prunedpo.step.plan.plan_step`). Arguments as for :class:`BernoulliPositions`.
    """

    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        return self.masks(_pair_uniforms(kept.shape[0], width, generator), kept)

    def masks(self, u: Tensor, kept: Tensor) -> Tensor:
        """The scored positions for uniforms ``u`` ``[N, width]`` (deterministic: exact tests enumerate ``u``)."""
        return (u < self._p(kept)[:, None]) & _valid(kept, u.shape[1])


class CoupledStratifiedPositions(StratifiedPositions):
    """:class:`StratifiedPositions` with common random numbers across a pair's two branches.

    The pick within stratum ``j`` is ``floor(u_{i,j} * |stratum|)`` with one uniform per pair ``i`` and stratum
    index ``j``: two responses of equal length score the same positions, of different lengths nearby ones.
    Inclusion probabilities, hence unbiasedness, are those of :class:`StratifiedPositions`. Rows ``2i`` and
    ``2i + 1`` must be one pair's two responses (as in :func:`lit_prunedpo.step.plan.plan_step`).
    """

    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        return self.masks(_pair_uniforms(kept.shape[0], width, generator), kept)

    def masks(self, u: Tensor, kept: Tensor) -> Tensor:
        """The scored positions for uniforms ``u`` ``[N, width]`` (deterministic: exact tests enumerate ``u``)."""
        width = u.shape[1]
        j, start, size = self._strata(kept, width)
        pick = torch.floor(u.gather(1, j.clamp(max=width - 1)) * size).long()
        return (torch.arange(width)[None, :] - start == pick) & _valid(kept, width)
