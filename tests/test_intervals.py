"""The shared statistics: the paired-round ratio interval the benchmark reports (the bootstrap itself is tested with
the study's curves, tests/lab/study/test_curves.py)."""

from __future__ import annotations

import math
import random

import pytest

from lit_prunedpo.intervals import paired_ratio_interval, quantile


def test_quantile_interpolates_between_order_statistics():
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(4.6)
    assert quantile([7.0], 0.9) == 7.0


def test_a_load_shared_by_each_round_cancels_in_the_paired_interval():
    # rounds ten times apart in speed: an unpaired resampling would spread the ratio widely, the paired one cannot
    ours = [1.0, 10.0, 2.0, 7.0, 3.0, 9.0]
    assert paired_ratio_interval([2.5 * t for t in ours], ours) == pytest.approx((2.5, 2.5))


def test_the_interval_is_deterministic_and_holds_the_ratio_of_medians():
    rng = random.Random(3)
    ours = [rng.uniform(1, 3) for _ in range(8)]
    theirs = [2 * t * rng.uniform(0.8, 1.25) for t in ours]
    low, high = paired_ratio_interval(theirs, ours, seed=5)
    assert (low, high) == paired_ratio_interval(theirs, ours, seed=5)
    point = (sorted(theirs)[3] + sorted(theirs)[4]) / (sorted(ours)[3] + sorted(ours)[4])
    assert low <= point <= high


def test_the_interval_covers_the_true_ratio_over_repeated_benchmarks():
    # the arm's step is 3x ours times a per-round log-normal factor of median 1: over 200 benchmarks of 8 rounds the
    # 90 % interval should hold 3 about 90 % of the time (the percentile bootstrap of a median of 8 runs wide)
    rng, covered, width = random.Random(0), 0, []
    for bench in range(200):
        ours = [rng.uniform(5, 15) for _ in range(8)]
        theirs = [3 * t * math.exp(rng.gauss(0, 0.2)) for t in ours]
        low, high = paired_ratio_interval(theirs, ours, resamples=400, confidence=0.9, seed=bench)
        covered += low <= 3.0 <= high
        width.append(high - low)
    assert 0.85 <= covered / 200 <= 1.0
    assert 0.1 < sorted(width)[100] < 1.5  # not the trivial interval


def test_unpaired_or_empty_samples_are_refused():
    with pytest.raises(ValueError, match="paired samples, got 3 and 2"):
        paired_ratio_interval([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least one sample"):
        paired_ratio_interval([], [])
