"""LengthGroupedSampler: a permutation, less padding than random order, deterministic, shardable."""

from __future__ import annotations

import random

import torch
from torch.utils.data import DistributedSampler

from lit_prunedpo.data.length_grouped import LengthGroupedSampler


def _lengths(n: int = 1000, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 500) for _ in range(n)]


def _padded(order: list[int], lengths: list[int], batch_size: int) -> int:
    """Tokens a batch padded to its longest row holds, summed over batches."""
    return sum(
        max(lengths[i] for i in order[s : s + batch_size]) * len(order[s : s + batch_size])
        for s in range(0, len(order), batch_size)
    )


def test_yields_a_permutation() -> None:
    lengths = _lengths(1003)
    sampler = LengthGroupedSampler(lengths, batch_size=8)
    order = list(sampler)
    assert sorted(order) == list(range(1003)) and len(sampler) == 1003


def test_grouping_pads_less_than_random_order() -> None:
    lengths = _lengths()
    grouped = _padded(list(LengthGroupedSampler(lengths, batch_size=8)), lengths, 8)
    shuffled = _padded(torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0)).tolist(), lengths, 8)
    real = sum(lengths)
    assert grouped - real < 0.2 * (shuffled - real)


def test_deterministic_per_seed_and_epoch() -> None:
    lengths = _lengths()
    a, b = LengthGroupedSampler(lengths, 8, seed=3), LengthGroupedSampler(lengths, 8, seed=3)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != first
    assert list(LengthGroupedSampler(lengths, 8, seed=4)) != first


def test_longest_batch_comes_first() -> None:
    lengths = _lengths()
    order = list(LengthGroupedSampler(lengths, batch_size=8))
    assert max(lengths[i] for i in order[:8]) == max(lengths)


def test_shards_across_ranks_with_aligned_grouped_batches() -> None:
    lengths = _lengths(1001)
    world, batch = 3, 4
    ranks = [LengthGroupedSampler(lengths, batch, seed=1, num_replicas=world, rank=r) for r in range(world)]
    # A DistributedSampler, so Lightning does not wrap (and reshuffle) it under DDP.
    assert all(isinstance(s, DistributedSampler) for s in ranks)
    orders = [list(s) for s in ranks]
    assert all(len(o) == len(s) == 334 for o, s in zip(orders, ranks))
    covered = set().union(*orders)
    assert covered == set(range(1001))
    # At the same step every rank's batch comes from one sorted global batch: similar lengths.
    for step in range(0, 334 - batch, batch):
        lens = [lengths[i] for o in orders for i in o[step : step + batch]]
        assert max(lens) - min(lens) < 150
