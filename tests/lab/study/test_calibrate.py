"""The calibration: the cost-matched vanilla batch from step costs per batch size, the fitted cost line, the FLOP
cross-check, each arm's schedule length, and measured costs on a tiny real task."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.calibrate import (
    StepCost,
    cost_matched_batch,
    fit_line,
    flop_matched_batch,
    measure_step_costs,
    schedule_steps,
    vanilla_probe_sizes,
)
from lit_prunedpo_lab.study.tasks import QUICKSTART_MODEL, EditedTask

TINY = {**QUICKSTART_MODEL, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
        "num_key_value_heads": 1}


def test_the_cost_matched_batch_is_the_nearest_cost():
    # the HH numbers: vanilla 0.746 s/step at 16 pairs, position-coupled 0.235 at 16; a vanilla step
    # costing 0.02 + 0.045 b s: b = 5 costs 0.245 (0.010 away), b = 4 costs 0.200 (0.035 away)
    costs = {b: 0.02 + 0.045 * b for b in range(1, 17)}
    assert cost_matched_batch(costs, 0.235) == 5
    assert cost_matched_batch(costs, 0.01) == 1  # cheaper than any vanilla step: the smallest batch
    assert cost_matched_batch(costs, 5.0) == 16  # dearer than vanilla's own step: never above the same batch
    assert cost_matched_batch({2: 0.25, 3: 0.75}, 0.5) == 3  # a tie: the larger batch
    assert cost_matched_batch({4: 0.5, 8: 0.3}, 0.31) == 8  # measured costs need not grow with the batch
    with pytest.raises(ValueError, match="at least one"):
        cost_matched_batch({}, 0.3)


def test_the_vanilla_cost_line_and_the_flop_cross_check():
    a, c = fit_line({16: 0.02 + 0.045 * 16, 8: 0.02 + 0.045 * 8, 4: 0.02 + 0.045 * 4, 1: 0.065})
    assert (a, c) == pytest.approx((0.02, 0.045))
    assert fit_line({8: 0.4}) == pytest.approx((0.0, 0.05))  # one size: through the origin
    with pytest.raises(ValueError, match="at least one"):
        fit_line({})
    assert (vanilla_probe_sizes(16) == [16, 8, 4, 1] and vanilla_probe_sizes(2) == [2, 1]
            and vanilla_probe_sizes(1) == [1])
    assert flop_matched_batch(16, 3.2) == 5 and flop_matched_batch(16, 0.5) == 16 and flop_matched_batch(16, 100.0) == 1


def test_each_arm_is_scheduled_over_the_steps_it_will_run():
    assert schedule_steps(Arm("position", 4), cost_s=0.1, vanilla_cost_s=0.3, budget_s=2.0, steps=10) == 20
    assert schedule_steps(Arm("position", 4), cost_s=0.1, vanilla_cost_s=0.3, budget_s=2.0, steps=40) == 40
    # pruning for half the budget at 0.1 s/step (10 steps), then exact at 0.2 s/step (5 steps)
    early = Arm("branch", 4, prune_fraction=0.5)
    assert schedule_steps(early, cost_s=0.1, vanilla_cost_s=0.2, budget_s=2.0, steps=1) == 15
    with pytest.raises(ValueError, match="costs"):
        schedule_steps(Arm("vanilla", 4), cost_s=0.0, vanilla_cost_s=0.2, budget_s=2.0, steps=1)


def test_measured_step_costs_on_a_tiny_task(tmp_path):
    torch.set_num_threads(1)
    task = EditedTask(name="tiny-cal", num_rows=120, batch_size=4, model=dict(TINY))
    dm = task.datamodule(tmp_path)
    arms = [Arm("vanilla", 4), Arm("vanilla", 1), Arm("branch", 4)]
    costs = measure_step_costs(task, arms, dm, steps=2)
    assert list(costs) == arms
    assert all(isinstance(c, StepCost) and c.cpu_s > 0 and c.wall_s > 0 and c.steps == 2 for c in costs.values())
    assert costs[arms[0]].on("cpu") == costs[arms[0]].cpu_s and costs[arms[0]].on("wall") == costs[arms[0]].wall_s
    with pytest.raises(ValueError, match="budget_s"):  # a prune-early arm is priced, not measured
        measure_step_costs(task, [Arm("branch", 4, prune_fraction=0.5)], dm, steps=1)
    with pytest.raises(ValueError, match="steps >= 1"):
        measure_step_costs(task, arms, dm, steps=0)
