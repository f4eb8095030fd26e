"""Which arms a study runs, and how long each one's schedule is: the calibration step of the study's protocol.

:func:`plan_arms` builds the arms (vanilla and each pruned mode at the task's batch, the compute-matched
variants), measures every arm's step cost and peak step memory from the first verdict seed's weights
(:mod:`lit_prunedpo_lab.study.calibrate`), fits the vanilla cost line, and adds the **cost-matched vanilla** control of
each pruned mode. Under a memory budget (:mod:`lit_prunedpo_lab.study.memory`) arms over it are replaced by their
fastest exact fit and the memory-fitted vanilla joins the controls. :meth:`ArmPlan.scheduled_arms` then gives
every arm (prune-early variants included) the schedule length its measured cost implies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from lit_prunedpo_lab.bench.cost import ModelDims
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo_lab.study import calibrate
from lit_prunedpo_lab.study.arguments import StudyOptions, UsageError
from lit_prunedpo_lab.study.arms import Arm, ideal_speedup, matched_batch_size
from lit_prunedpo_lab.study.calibrate import (
    StepCost, cost_matched_batch, fit_line, flop_matched_batch, schedule_steps, vanilla_probe_sizes,
)
from lit_prunedpo_lab.study.report_markdown import ONE_PAIR_NOTE
from lit_prunedpo_lab.study.tasks import StudyTask

Log = Callable[[str], None]


@dataclass
class ArmPlan:
    """The calibrated arms of a study, before their schedules are set (:meth:`scheduled_arms`)."""

    batch_size: int
    """The task's batch: the same-batch arms'."""
    pruned: list[str]
    """The pruned modes, in the order asked for."""
    clock: str
    speedups: dict[str, float]
    """Per pruned mode, the FLOP model's ideal speedup on the task's batches."""
    base: list[Arm]
    """Vanilla and each pruned mode at the task's batch (a pruned arm over a memory budget: its fit)."""
    enlarged: list[Arm]
    """The compute-matched arms (larger batches), none under a memory budget."""
    costs: dict[Arm, StepCost]
    """Every measured arm's step cost and peak memory."""
    line: tuple[float, float]
    """The vanilla step cost ``a + c * batch`` fitted on the probed batches."""
    record: dict[str, Any] = field(default_factory=dict)
    """The calibration as ``study.json`` and ``progress.jsonl`` hold it."""
    cost_matched: dict[Arm, float] = field(default_factory=dict)
    """The vanilla controls (cost-matched, memory-fitted) and their step costs."""
    matched_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per pruned mode, its measured cost and the cost-matched batch (measured and by the FLOP model)."""
    controls: dict[str, Any] = field(default_factory=dict)
    """Per pruned mode, the name (a memory budget: the names) of its vanilla controls."""
    memory: dict[str, Any] | None = None
    """The memory budget's record (``None``: no budget)."""
    same_batch_reference: bool = True
    """False when same-batch vanilla is over the memory budget: pruned arms are judged against their controls only."""

    def vanilla_cost(self, batch: int) -> float:
        """A vanilla step's cost at ``batch`` on the fitted line; never 0 (it divides)."""
        return max(self.line[0] + self.line[1] * batch, 1e-9)

    def scheduled_arms(self, budget: float, steps: int, prune_early: float | None) -> list[Arm]:
        """Every arm the study runs, in order (the task's batch, the controls, prune-early, compute-matched), each
        with the schedule length its measured cost gives (:func:`~lit_prunedpo_lab.study.calibrate.schedule_steps`);
        a prune-early arm is priced from its mode's cost."""
        B, clock = self.batch_size, self.clock

        def priced(arm: Arm) -> Arm:
            own = self.cost_matched.get(arm) or (self.costs[arm].on(clock) if arm in self.costs
                                                 else self.costs[Arm(arm.mode, B)].on(clock))
            return dataclasses.replace(arm, schedule_steps=schedule_steps(arm, own, self.vanilla_cost(arm.batch_size),
                                                                          budget, steps))

        early = [Arm(m, B, prune_fraction=prune_early) for m in self.pruned] if prune_early is not None else []
        controls = [a for a in self.cost_matched if a not in self.base]
        return [priced(a) for a in self.base + controls + early + self.enlarged]


def plan_arms(task: StudyTask, dm: PreferenceDataModule, options: StudyOptions, log: Log) -> ArmPlan:
    """Build and calibrate the study's arms (measured from ``options.seeds[0]``'s initial weights), logging what the
    calibration found.

    Raises:
        UsageError: when a memory budget cannot be met (nothing fits, or a mode is left without a vanilla reference).
    """
    B, pruned = task.batch_size, options.pruned
    dims = ModelDims.from_model(task.policy(0).build())
    sample = [b for _, b in zip(range(8), dm.train_dataloader())]
    speedups = {m: ideal_speedup(m, sample, dims) for m in pruned}
    base = [Arm(m, B) for m in options.modes]
    enlarged = [Arm(m, matched_batch_size(B, speedups[m]), matched=True) for m in pruned if options.matched]
    enlarged = [a for a in enlarged if a.batch_size > B and options.memory_budget_mb is None]

    # calibration: measured step costs, the cost-matched vanilla batch per mode, each arm's schedule length
    probes = [Arm("vanilla", b) for b in vanilla_probe_sizes(B)]
    log(f"calibration: {options.calibration_steps} timed steps of {len(probes) + len(pruned) + len(enlarged)} arms")

    def measure(arms: list[Arm]) -> dict:  # step costs and peak step memory, from the first verdict seed's weights
        # looked up when called, so that it can be replaced (the memory-budget tests hand in a made-up calibration)
        return calibrate.measure_step_costs(task, arms, dm, options.calibration_steps, warmup=1, seed=options.seeds[0],
                                            memory=True, precision=options.precision, device=options.device)

    costs = measure(probes + base[1:] + enlarged)
    line = fit_line({a.batch_size: costs[a].on(options.clock) for a in probes})
    plan = ArmPlan(B, pruned, options.clock, speedups, base, enlarged, costs, line)
    _add_cost_matched_controls(plan)
    if options.memory_budget_mb is not None:
        _fit_memory_budget(plan, options.memory_budget_mb, measure, log)
    plan.record = {"clock": options.clock, "precision": options.precision, "device": options.device,
                   "steps": options.calibration_steps,
                   "warmup": 1, "seed": options.seeds[0],
                   "vanilla_measured": {a.batch_size: costs[a].on(options.clock) for a in probes},
                   "vanilla_line": list(line), "arms": {a.name: dataclasses.asdict(c) for a, c in costs.items()},
                   "cost_matched": plan.matched_info}
    for m, info in plan.matched_info.items():
        log(f"calibration: {m}@{B} {info['pruned_cost_s']:.4f} {options.clock}-s/step -> cost-matched vanilla batch "
            f"{info['batch']} (FLOP model: {info['flop_batch']})")
    if B == 1 and pruned:
        log(f"warning: {ONE_PAIR_NOTE}")
    return plan


def _add_cost_matched_controls(plan: ArmPlan) -> None:
    """Per pruned mode, the vanilla batch whose fitted step cost is nearest the pruned step's measured cost: its
    control (a cost-matched arm when that batch is smaller than the task's, else same-batch vanilla itself)."""
    B = plan.batch_size
    fitted = {b: plan.vanilla_cost(b) for b in range(1, B + 1)}
    for m in plan.pruned:
        speedup = plan.speedups[m]
        target = plan.costs[Arm(m, B)].on(plan.clock)
        b = cost_matched_batch(fitted, target)
        plan.matched_info[m] = {"pruned_cost_s": target, "batch": b, "vanilla_cost_at_batch_s": fitted[b],
                                "flop_speedup": speedup, "flop_batch": flop_matched_batch(B, speedup),
                                "measured_speedup": plan.vanilla_cost(B) / target}
        if b < B:  # else the pruned step is no cheaper: same-batch vanilla is its own cost-matched control
            plan.cost_matched.setdefault(Arm("vanilla", b, cost_matched=True), plan.vanilla_cost(b))
        plan.controls[m] = Arm("vanilla", b, cost_matched=b < B).name


def _fit_memory_budget(plan: ArmPlan, budget_mb: float, measure: Callable[[list[Arm]], dict], log: Log) -> None:
    """Fit ``plan``'s arms to the memory budget (:func:`~lit_prunedpo_lab.study.memory.fit_to_budget`): pruned arms over
    it replaced by their fits, the memory-fitted vanilla added to the controls, each mode's controls narrowed to the
    vanillas that fit.

    Raises:
        UsageError: nothing fits an arm, or a mode is left without a vanilla reference within the budget.
    """
    from lit_prunedpo.callbacks import PeakMemoryMeter
    from lit_prunedpo_lab.study.memory import budget_binds, fit_to_budget, not_binding_text

    B, clock = plan.batch_size, plan.clock
    log(f"memory budget {budget_mb:g} MB: measuring peaks, and the exact variants of every arm over it")
    try:
        fit = fit_to_budget(budget_mb, Arm("vanilla", B), plan.base[1:], list(plan.cost_matched), plan.costs, measure,
                            clock, PeakMemoryMeter(torch.device("cpu"), settle=True).measure)
    except ValueError as exc:
        raise UsageError(f"--memory-budget-mb: {exc}") from None
    plan.memory, plan.same_batch_reference = fit.record, fit.same_batch_fits
    # same-batch vanilla runs as is even over the budget: it sets the targets (the fitted one computes the same steps)
    plan.base = plan.base[:1] + [fit.fitted.get(a, a) for a in plan.base[1:]]
    if fit.vanilla is not None:
        plan.cost_matched[fit.vanilla] = plan.costs[fit.fitted[Arm("vanilla", B)]].on(clock)
    for m in plan.pruned:
        controls = [c.name for c in fit.controls_fitting if c.batch_size == plan.matched_info[m]["batch"]]
        plan.controls[m] = controls + ([fit.vanilla.name] if fit.vanilla is not None else [])
        if not plan.controls[m] and not fit.same_batch_fits:
            raise UsageError(f"--memory-budget-mb {budget_mb:g}: mode {m} has no vanilla reference within the budget")
    memory = plan.memory
    for name, f in memory["fits"].items():
        log(f"memory budget: {name} ({memory['peaks'][name]:.1f} MB) fitted as {f}")
    log("memory budget: references " + ", ".join(memory["references"])
        + ("; " + memory["gpu_note"] if memory["gpu_needed"] else ""))
    if not budget_binds(memory):
        log(f"warning: {not_binding_text(memory)}")
