"""Measured cost of a training step per arm, the cost-matched vanilla batch, and each arm's schedule length.

Before any curve is measured, a short calibration trains every arm for ``warmup + steps`` steps from one
seed's initial weights (throwaway runs, round-robin one step at a time so that load drifting on a shared
machine hits every arm alike) and takes the median cost of the last ``steps`` on both clocks
(:func:`measure_step_costs`). Vanilla is measured at a few batch sizes (the task's ``B``, ``B/2``, ``B/4``,
1: :func:`vanilla_probe_sizes`) and a line ``a + c * b`` is fitted to them by least squares
(:func:`fit_line`): the cost of a vanilla step at every batch from 1 to ``B``. The steps are the runner's
(:meth:`~lit_prunedpo_lab.study.runner.Run.train_step`), not a Lightning ``Trainer``'s: a ``fit`` trains one arm to its
end, where the calibration alternates the arms step by step and reads each step's clocks and peak memory with no
hook of the loop inside them.

* **Cost-matched vanilla** (:func:`cost_matched_batch`): for a pruned mode, the vanilla batch whose fitted step
  cost is nearest to the pruned step's measured cost (ties: the larger batch; never above ``B``). The FLOP
  cost model's answer, ``round(B / ideal_speedup)``, is recorded beside it as a cross-check
  (:func:`flop_matched_batch`).
* **Peak memory** (``measure_step_costs(memory=True)``): each measured step's peak memory above its start
  (:class:`~lit_prunedpo.callbacks.PeakMemoryMeter`, settled before each step, outside the timed work: on the CPU the
  peak of live tensor storage, on CUDA ``max_memory_allocated``); an arm's peak is the largest over its measured
  steps. The CPU meter slows the step it measures (it records every operator), so there the timed steps run
  unmetered and ``steps`` more steps per arm, round-robin and untimed, are metered instead. A memory budget fits arms
  with it (:mod:`lit_prunedpo_lab.study.memory`).
* **Schedule length** (:func:`schedule_steps`): a run lasts until it has passed both the time budget and the
  step budget, so its learning-rate schedule spans ``max(steps, ceil(budget / cost per step))`` steps: the
  measured cost on the study's clock, for a prune-early arm the pruned cost for its share of the budget and
  vanilla's after. A run that outlasts the estimate stays at the schedule's final rate (0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from lit_prunedpo.callbacks import PeakMemoryMeter
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.runner import Clock, make_run
from lit_prunedpo_lab.study.tasks import StudyTask


@dataclass(frozen=True)
class StepCost:
    """Median cost of one training step of an arm, on both clocks, over ``steps`` measured steps."""

    cpu_s: float
    wall_s: float
    steps: int
    peak_mb: float | None = None
    """Largest peak step memory above the step's start over the measured steps, MiB (``None``: not measured)."""

    def on(self, clock: Clock) -> float:
        return self.cpu_s if clock == "cpu" else self.wall_s


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def measure_step_costs(task: StudyTask, arms: Sequence[Arm], dm: PreferenceDataModule, steps: int, warmup: int = 1,
                       seed: int = 0, memory: bool = False, precision: str = "32-true",
                       device: str = "cpu") -> dict[Arm, StepCost]:
    """Train each arm ``warmup + steps`` steps from ``seed``'s initial weights, round-robin one step at a time,
    and return the median cost of the last ``steps`` per arm (the first steps pay one-off costs). Arms that
    prune early are not measured: :func:`schedule_steps` prices them from their mode's and vanilla's costs.
    With ``memory`` every step's peak memory is measured too (``StepCost.peak_mb``; ``None`` where this machine
    cannot read it). ``precision``: the steps' (a key of :data:`~lit_prunedpo_lab.study.runner.PRECISIONS`), and
    ``device`` where they run, as the study's runs train.

    Raises:
        ValueError: if ``steps`` < 1, ``warmup`` < 0 or an arm prunes early.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"calibration needs steps >= 1 and warmup >= 0, got {steps!r} and {warmup!r}")
    runs = {arm: make_run(task, arm, seed, dm, precision=precision, device=device) for arm in dict.fromkeys(arms)}
    meters = {arm: PeakMemoryMeter(next(run.module.policy.parameters()).device, settle=True) for arm, run in
              runs.items()} if memory else {}
    apart = any(m.intrusive for m in meters.values())  # a meter that slows the step: metered steps of their own
    for arm, run in runs.items():
        run.meter = None if apart else meters.get(arm)
    for _ in range(warmup + steps):
        for run in runs.values():
            run.train_step()
    if apart:
        for arm, run in runs.items():
            run.meter, run.step_peak_mb = meters[arm], []
        for _ in range(steps):
            for run in runs.values():
                run.train_step()
    last = warmup + steps
    peaks = {arm: run.step_peak_mb if apart else run.step_peak_mb[warmup:] for arm, run in runs.items()}
    return {arm: StepCost(_median(run.step_cpu[warmup:last]), _median(run.step_wall[warmup:last]), steps,
                          max(peaks[arm]) if peaks[arm] else None)
            for arm, run in runs.items()}


def vanilla_probe_sizes(batch_size: int) -> list[int]:
    """The vanilla batch sizes the calibration measures: ``B``, ``B/2``, ``B/4`` and 1 (distinct, descending)."""
    return sorted({batch_size, max(1, batch_size // 2), max(1, batch_size // 4), 1}, reverse=True)


def fit_line(costs: Mapping[int, float]) -> tuple[float, float]:
    """Least-squares ``(a, c)`` of ``cost = a + c * batch`` over the measured ``{batch: cost}``; one size
    gives the line through the origin.

    Raises:
        ValueError: with no measurement.
    """
    if not costs:
        raise ValueError("fit_line needs at least one measured batch size")
    xs, ys = list(costs), list(costs.values())
    if len(xs) == 1:
        return 0.0, ys[0] / xs[0]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def cost_matched_batch(costs: Mapping[int, float], target: float) -> int:
    """The batch whose step cost in ``costs`` (``{batch: cost}``, e.g. the fitted vanilla line at every batch
    from 1 to ``B``) is nearest to ``target`` (the pruned step's cost); ties go to the larger batch.

    Raises:
        ValueError: with no candidate batch.
    """
    if not costs:
        raise ValueError("cost_matched_batch needs at least one candidate batch size")
    return min(costs, key=lambda b: (abs(costs[b] - target), -b))


def flop_matched_batch(batch_size: int, speedup: float) -> int:
    """The FLOP model's cost-matched vanilla batch: ``round(batch_size / speedup)``, between 1 and ``batch_size``."""
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup!r}")
    return min(batch_size, max(1, round(batch_size / speedup)))


def schedule_steps(arm: Arm, cost_s: float, vanilla_cost_s: float, budget_s: float, steps: int) -> int:
    """The steps a run of ``arm`` will take: ``max(steps, ceil(budget / cost))``; a prune-early arm pays
    ``cost_s`` for its pruned share of the budget and ``vanilla_cost_s`` (the exact step at its batch) after.

    Raises:
        ValueError: on a non-positive cost.
    """
    if not (cost_s > 0 and vanilla_cost_s > 0):
        raise ValueError(f"step costs must be > 0, got {cost_s!r} and {vanilla_cost_s!r}")
    if arm.prune_fraction is None:
        timed = budget_s / cost_s
    else:
        timed = arm.prune_fraction * budget_s / cost_s + (1 - arm.prune_fraction) * budget_s / vanilla_cost_s
    return max(steps, math.ceil(timed))
