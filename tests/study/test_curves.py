"""Time to target and ratios to vanilla, on curves worked by hand."""

from __future__ import annotations

import pytest

from lit_prunedpo.study.curves import mean_curve, ratio_to_vanilla, time_to_target


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


def test_ratio_to_vanilla_by_hand():
    grid = [0.0, 10.0, 20.0]
    vanilla = [[1.0, 0.6, 0.3], [1.0, 0.5, 0.1]]  # mean 1.0, 0.55, 0.2: target 0.2, reached at 20
    target = mean_curve(vanilla)[-1]
    # the arm's mean curve 1.0, 0.2, 0.1 reaches 0.2 at 10 -> 0.5x; seed 0 (1.0, 0.3, 0.1) reaches it at 15
    # -> 0.75x, seed 1 (1.0, 0.1, 0.1) at 10 * 0.8 / 0.9 -> 0.444x
    arm = [[1.0, 0.3, 0.1], [1.0, 0.1, 0.1]]
    times = [[0.0, 10.2, 20.1], [0.0, 10.0, 20.0]]  # recorded times may run a little past the grid
    r = ratio_to_vanilla(grid, arm, times, vanilla, target)
    assert r.mean == pytest.approx(0.5)
    assert r.high == pytest.approx((10.2 + 9.9 * 0.1 / 0.2) / 20)
    assert r.low == pytest.approx(10 * 0.8 / 0.9 / 20)
    assert (r.reached, r.seeds) == (2, 2)
    # vanilla against itself: 1.0 on the mean curve
    assert ratio_to_vanilla(grid, vanilla, [grid, grid], vanilla, target).mean == pytest.approx(1.0)
    # an arm that never gets there
    slow = ratio_to_vanilla(grid, [[1.0, 0.9, 0.8]] * 2, [grid, grid], vanilla, target)
    assert slow.mean is None and slow.reached == 0 and "not reached" in str(slow)
