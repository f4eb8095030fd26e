"""The learning-rate sweep's choice, on hand-made scores and on stand-in runs (no training)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.runner import Point
from lit_prunedpo_lab.study.sweep import final_window_loss, pick_lr, sweep, window_of


def fake_run(arm: Arm, seed: int, losses: list[float], diverged: bool = False) -> SimpleNamespace:
    points = [Point(k, float(k), float(k), loss, 0.5, ["time"]) for k, loss in enumerate(losses)]
    return SimpleNamespace(arm=arm, seed=seed, diverged=diverged, on_grid=lambda grid: points)


def test_the_final_window_not_the_best_point_decides():
    # step 0 is no training; over the last 2 evaluations: (0.5 + 0.7) / 2 = 0.6
    run = fake_run(Arm("vanilla", 4), 100, [0.69, 0.4, 0.5, 0.7])
    assert final_window_loss(run, 2) == pytest.approx(0.6)
    assert final_window_loss(run, 10) == pytest.approx((0.4 + 0.5 + 0.7) / 3)
    assert final_window_loss(fake_run(Arm("vanilla", 4), 100, [0.69, 0.1], diverged=True), 1) == math.inf
    assert window_of(10) == 3 and window_of(2) == 1


def test_pick_lr():
    # a diverged seed rules a rate out
    assert pick_lr({1e-3: [0.5, 0.6], 2e-3: [0.4, 0.5], 4e-3: [math.inf, 0.1]}) == 2e-3
    assert pick_lr({2e-3: [0.5], 1e-3: [0.5]}) == 1e-3  # a tie: the smaller rate
    with pytest.raises(ValueError, match="at least one rate"):
        pick_lr({})


def test_sweep_runs_every_arm_at_every_rate_on_the_tuning_seeds_and_keeps_each_arms_best():
    calls = {}

    def run(arms, seeds, evals, stop_on_nonfinite, **study):
        calls.update(arms=arms, seeds=seeds, evals=evals, stop=stop_on_nonfinite, study=study)
        out = []
        for arm in arms:
            # vanilla is best at 2e-3; branch at 1e-3 (its 4e-3 run blows up on one seed)
            best = 2e-3 if arm.mode == "vanilla" else 1e-3
            for seed in seeds:
                diverged = arm.mode == "branch" and arm.lr == 4e-3 and seed == 101
                out.append(fake_run(arm, seed, [0.69, 0.6, 0.5 + abs(math.log(arm.lr / best))], diverged))
        return out

    arms = [Arm("vanilla", 4, schedule_steps=30), Arm("branch", 4, schedule_steps=50)]
    chosen, table = sweep(arms, 2e-3, [0.5, 1.0, 2.0], [100, 101], evals=3, run=run, budget_s=1.0, task="t")
    assert [a.lr for a in calls["arms"]] == [1e-3, 2e-3, 4e-3] * 2
    assert calls["seeds"] == [100, 101] and calls["stop"] is True and calls["study"] == {"budget_s": 1.0, "task": "t"}
    assert chosen == [Arm("vanilla", 4, schedule_steps=30, lr=2e-3), Arm("branch", 4, schedule_steps=50, lr=1e-3)]
    assert len(table) == 6 and [r["lr"] for r in table if r["chosen"]] == [2e-3, 1e-3]
    diverged = next(r for r in table if r["arm"] == "branch@4" and r["lr"] == 4e-3)
    assert diverged["scores"][1] is None and diverged["mean"] is None
    with pytest.raises(ValueError, match="factors"):
        sweep(arms, 2e-3, [0.0, 1.0], [100], evals=3, run=run)
