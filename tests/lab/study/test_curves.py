"""The study's protocol bookkeeping on curves and times worked by hand: time to target, the improvement target,
censoring, the bootstrap interval, the better-vanilla ratio and the win rule."""

from __future__ import annotations

import math
import random

import pytest

from lit_prunedpo.intervals import bootstrap_interval
from lit_prunedpo_lab.study.curves import (
    censored_pairs,
    improvement_target,
    mean_curve,
    mean_interval,
    ratio_of_sums,
    time_ratio,
    time_to_target,
    verdict,
)


def test_time_to_target_interpolates_the_first_crossing():
    # loss 1.0 -> 0.6 -> 0.2 at t = 0, 10, 20: reaches 0.4 halfway between 10 and 20
    assert time_to_target([0, 10, 20], [1.0, 0.6, 0.2], 0.4) == pytest.approx(15.0)
    # an exact hit is its own time; a later dip does not move the first crossing
    assert time_to_target([0, 10, 20, 30], [1.0, 0.4, 0.5, 0.1], 0.4) == pytest.approx(10.0)
    assert time_to_target([0, 10], [0.3, 0.1], 0.4) == 0.0
    assert time_to_target([0, 10, 20], [1.0, 0.8, 0.5], 0.4) is None


def test_time_to_target_higher_is_better():
    # accuracy 0.5 -> 0.7 -> 0.9: reaches 0.85 at 10 + 10 * 0.15 / 0.2 = 17.5
    assert time_to_target([0, 10, 20], [0.5, 0.7, 0.9], 0.85, lower_is_better=False) == pytest.approx(17.5)


def test_bad_curves_are_refused():
    with pytest.raises(ValueError, match="as many times"):
        time_to_target([0, 1], [1.0], 0.5)
    with pytest.raises(ValueError, match="decrease"):
        time_to_target([0, 2, 1], [1.0, 0.8, 0.2], 0.5)
    with pytest.raises(ValueError, match="one length"):
        mean_curve([[1.0, 2.0], [1.0]])


def test_the_target_does_not_depend_on_where_a_falling_then_rising_curve_ends():
    # vanilla's mean loss falls to 0.5, then rises to 0.7 (the HH curve): the old target, the final
    # value 0.7, was reached by anything slow; 0.8 of the best improvement is 1.0 - 0.8 * 0.5 = 0.6
    grid = [0, 10, 20, 30]
    falls_then_rises = [1.0, 0.6, 0.5, 0.7]
    target = improvement_target(falls_then_rises, 0.8)
    assert target == pytest.approx(0.6)
    assert improvement_target([1.0, 0.6, 0.5, 0.9], 0.8) == pytest.approx(target)  # any later end: the same target
    assert time_to_target(grid, falls_then_rises, target) == pytest.approx(10.0)
    # an arm that only gets to 0.65 does not reach it, though it ends below vanilla's final 0.7
    assert time_to_target(grid, [1.0, 0.8, 0.7, 0.65], target) is None
    # accuracy: 0.5 -> best 0.8 -> 0.6; 0.5 + 0.8 * 0.3 = 0.74
    assert improvement_target([0.5, 0.7, 0.8, 0.6], 0.8, lower_is_better=False) == pytest.approx(0.74)
    assert improvement_target([0.7, 0.8, 0.9], 1.0) == pytest.approx(0.7)  # never improves: its start
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="share"):
            improvement_target(falls_then_rises, share)


def test_a_seed_that_never_reaches_the_target_counts_against_the_arm():
    # per seed (arm, vanilla): reached by both / arm missed / vanilla missed / both missed; budget 20
    pairs = censored_pairs([5.0, None, 6.0, None], [10.0, 8.0, None, None], budget=20.0)
    assert pairs == [(5.0, 10.0), (math.inf, 8.0), (6.0, 20.0), (20.0, 20.0)]
    assert ratio_of_sums(pairs) == math.inf
    # only vanilla missed on the second seed: it counts at the budget, which can only raise the arm's ratio
    assert ratio_of_sums(censored_pairs([5.0, 6.0], [10.0, None], 20.0)) == pytest.approx(11 / 30)
    assert ratio_of_sums([(0.0, 0.0)]) == 1.0 and ratio_of_sums([(1.0, 0.0)]) == math.inf
    r = time_ratio([4.0, None, 4.0, 4.0, 4.0], {"vanilla": [8.0] * 5}, budget=20.0, resamples=500)
    assert r.value == math.inf and r.high == math.inf and (r.reached, r.seeds) == (4, 5)
    assert r.verdict != "WIN" and "not reached" in str(r) and r.as_dict()["value"] is None
    with pytest.raises(ValueError, match="paired"):
        censored_pairs([1.0], [1.0, 2.0], 20.0)


def test_bootstrap_is_deterministic_with_its_seed():
    pairs = [(3.0, 10.0), (6.0, 9.0), (8.0, 8.0), (2.0, 11.0), (5.0, 7.0)]
    first = bootstrap_interval(pairs, ratio_of_sums, resamples=1000, seed=7)
    assert bootstrap_interval(pairs, ratio_of_sums, resamples=1000, seed=7) == first
    assert bootstrap_interval(pairs, ratio_of_sums, resamples=1000, seed=8) != first
    low, high = first
    assert low < ratio_of_sums(pairs) < high


def test_identical_seeds_give_a_zero_width_interval():
    assert bootstrap_interval([(3.0, 6.0)] * 5, ratio_of_sums) == (0.5, 0.5)
    same = time_ratio([6.0] * 5, {"vanilla": [6.0] * 5}, budget=20.0)
    assert (same.value, same.low, same.high, same.verdict) == (1.0, 1.0, 1.0, "TIE")
    assert mean_interval([0.6] * 5) == (0.6, 0.6, 0.6)


def test_the_bootstrap_interval_covers_the_true_ratio():
    # a constructed population: vanilla's time r ~ U(5, 15), the arm's a = r * u with u ~ U(0.4, 0.8)
    # independent of r, so the true ratio of mean times is E[u] = 0.6. Over 100 studies of 8 seeds the 90 %
    # interval should cover it about 90 % of the time (the percentile bootstrap runs a little narrow at 8 seeds)
    rng = random.Random(0)
    covered, wins = 0, 0
    for study in range(100):
        rs = [rng.uniform(5, 15) for _ in range(8)]
        arm = [r * rng.uniform(0.4, 0.8) for r in rs]
        ratio = time_ratio(arm, {"vanilla": rs}, budget=20.0, resamples=400, confidence=0.9, seed=study)
        covered += ratio.low <= 0.6 <= ratio.high
        wins += ratio.verdict == "WIN"
    assert covered >= 80
    assert wins == 100  # 0.6x with this spread is a clear win at 8 seeds
    # a hand-made case: the arm takes 0.6 of vanilla's time give or take 1 s that cancels over the seeds
    rs = [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]
    arm = [0.6 * r + e for r, e in zip(rs, [1, -1, 1, -1, 1, -1])]
    r = time_ratio(arm, {"vanilla": rs}, budget=30.0)
    assert r.value == pytest.approx(0.6) and r.low < 0.6 < r.high < 1.0 and r.verdict == "WIN"


def test_the_win_rule():
    assert verdict(0.5, 0.99) == "WIN"
    assert verdict(0.5, 1.0) == "TIE"  # the upper end must be below 1.0
    assert verdict(0.9, 1.1) == "TIE"
    assert verdict(1.0, 1.5) == "TIE"  # and the lower end above 1.0 for a loss
    assert verdict(1.01, 2.0) == "LOSS"
    assert verdict(1.2, math.inf) == "LOSS"
    assert verdict(0.8, math.inf) == "TIE"


def test_the_ratio_is_against_the_better_vanilla():
    # the arm needs 4 s; same-batch vanilla 8 s (0.5x), cost-matched vanilla 5 s (0.8x): judged at 0.8x
    r = time_ratio([4.0, 4.0, 4.0], {"vanilla@16": [8.0] * 3, "vanilla@5 (cost-matched)": [5.0] * 3}, budget=20.0)
    assert r.value == pytest.approx(0.8) and r.reference == "vanilla@5 (cost-matched)"
    assert (r.low, r.high) == pytest.approx((0.8, 0.8)) and r.verdict == "WIN"
    # where the better reference differs between seeds, each resample takes the larger ratio: the interval's
    # lower end is never below the ratio against either reference alone
    arm = [4.0, 4.0, 4.0, 4.0]
    refs = {"a": [8.0, 4.5, 8.0, 4.5], "b": [4.5, 8.0, 4.5, 8.0]}
    both = time_ratio(arm, refs, budget=20.0, resamples=500)
    alone = [time_ratio(arm, {k: v}, budget=20.0, resamples=500) for k, v in refs.items()]
    assert both.low >= max(a.low for a in alone) - 1e-12
    with pytest.raises(ValueError, match="reference"):
        time_ratio(arm, {}, budget=20.0)
