"""The study's summary: per arm, the quality it reaches and its time to the targets against the better vanilla.

:func:`summarise` applies the protocol of :mod:`lit_prunedpo_lab.study.curves` to a study's runs: the targets from
same-batch vanilla's mean curves, every arm's per-seed times to them, the time ratio to the arm's references with
its bootstrap interval and verdict, and the best, final and same-steps quality with their spreads. The summary is
``study.json``'s ``summary`` and the source of ``study.md``'s table (:mod:`lit_prunedpo_lab.study.report_markdown`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from lit_prunedpo_lab.study.curves import (improvement_target, mean_curve, mean_interval, spread, time_ratio,
                                           time_to_target)
from lit_prunedpo_lab.study.runner import Clock, Run

def _curve(r: Run, what: str, on: str = "time") -> list[float]:
    """``what`` (``loss`` or ``accuracy``) at each point of ``r``'s grid ``on`` (``time`` or ``steps``)."""
    return [getattr(p, what) for p in r.on_grid(on)]


def summarise(runs: Sequence[Run], clock: Clock, budget_s: float, evals: int, share: float = 0.8, resamples: int = 2000,
              confidence: float = 0.95, seed: int = 0, controls: Mapping[str, str | Sequence[str]] | None = None,
              same_batch_reference: bool = True) -> dict[str, Any]:
    """Per arm: best and final quality within the budget, quality at the step budget, and the time to the
    improvement targets as a ratio to the better vanilla arm, with bootstrap intervals and verdicts.

    Args:
        controls: per pruned mode, the name (or names) of its control vanilla arms (cost-matched, memory-fitted);
            every arm of that mode is judged against the best of them and the same-batch vanilla arm (only the
            latter without one).
        same_batch_reference: False when the same-batch vanilla arm is over a memory budget: it still sets the
            targets (a memory-fitted vanilla computes the same steps), but pruned arms are judged against their
            controls only.

    Raises:
        ValueError: if no run is a same-batch ``vanilla`` arm (the reference every ratio needs), or a control
            arm or a seed is missing, or a pruned mode is left without a reference.
    """
    arms: dict[str, list[Run]] = {}
    for run in runs:
        arms.setdefault(run.arm.name, []).append(run)
    vanilla = [r for r in runs
               if r.arm.mode == "vanilla" and not r.arm.matched and not r.arm.cost_matched and not r.arm.memory_fitted]
    if not vanilla:
        raise ValueError("a study summary needs the vanilla arm")
    vanilla_name = vanilla[0].arm.name
    seeds = [r.seed for r in vanilla]
    controls = _control_names(controls, arms)
    targets = {
        "loss": improvement_target(mean_curve([_curve(r, "loss") for r in vanilla]), share, True),
        "accuracy": improvement_target(mean_curve([_curve(r, "accuracy") for r in vanilla]), share, False),
    }
    times = {what: {name: _seed_times(rs, seeds, clock, what, targets[what]) for name,
                    rs in arms.items()} for what in targets}
    rows = []
    for name, rs in arms.items():
        refs = _references(rs[0].arm, vanilla_name, controls, same_batch_reference)
        row = _quality_row(rs, clock, resamples, confidence, seed)
        row["references"] = refs
        for what in targets:
            ratio = time_ratio(times[what][name], {ref: times[what][ref] for ref in refs}, budget_s, resamples,
                               confidence, seed)
            row[f"{what}_time_ratio"] = ratio.as_dict()
            row[f"{what}_seed_times"] = times[what][name]
            if len(refs) > 1 or refs != [vanilla_name]:
                same = time_ratio(times[what][name], {vanilla_name: times[what][vanilla_name]}, budget_s, resamples,
                                  confidence, seed)
                row[f"{what}_time_ratio_same_batch"] = same.as_dict()
        rows.append(row)
    grid = [0.0] + [budget_s * k / evals for k in range(1, evals + 1)]
    return {"target_share": share, "target_loss": targets["loss"], "target_accuracy": targets["accuracy"],
            "reference": vanilla_name, "controls": controls, "resamples": resamples, "confidence": confidence,
            "bootstrap_seed": seed, "time_grid": grid, "same_batch_reference": same_batch_reference, "arms": rows}


def _control_names(controls: Mapping[str, str | Sequence[str]] | None, arms: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per mode, its control arms' names as a list, each checked to have runs.

    Raises:
        ValueError: naming a control without runs.
    """
    names = {mode: [given] if isinstance(given, str) else list(given) for mode, given in (controls or {}).items()}
    for mode, listed in names.items():
        for name in listed:
            if name not in arms:
                raise ValueError(f"the control {name!r} of mode {mode!r} has no runs")
    return names


def _seed_times(rs: Sequence[Run], seeds: Sequence[int], clock: Clock, what: str, target: float) -> list[float | None]:
    """Per vanilla seed, when the arm's run of that seed reached ``target`` on ``clock`` (``None``: never).

    Raises:
        ValueError: if the arm ran other seeds than vanilla (they must pair).
    """
    by = {r.seed: r for r in rs}
    if set(by) != set(seeds):
        raise ValueError(f"arm {rs[0].arm.name} ran seeds {sorted(by)}, vanilla {sorted(seeds)}: they must pair")
    return [time_to_target([getattr(p, f"{clock}_s") for p in by[s].on_grid("time")], _curve(by[s], what), target,
                           what == "loss") for s in seeds]


def _references(arm: Any, vanilla_name: str, controls: Mapping[str, list[str]],
                same_batch_reference: bool) -> list[str]:
    """The vanilla arms ``arm`` is judged against: same-batch vanilla (unless over a memory budget) and its mode's
    controls; vanilla arms are judged against same-batch vanilla.

    Raises:
        ValueError: if a pruned arm is left without a reference.
    """
    if arm.mode == "vanilla":
        return [vanilla_name]
    refs = ([vanilla_name] if same_batch_reference else []) + [c for c in controls.get(arm.mode, [])
                                                               if c != vanilla_name]
    if not refs:
        raise ValueError(f"arm {arm.name}: no vanilla reference (the same-batch arm is excluded and mode {arm.mode!r} "
                         "has no control)")
    return refs


def _quality_row(rs: Sequence[Run], clock: Clock, resamples: int, confidence: float, seed: int) -> dict[str, Any]:
    """One arm's settings, step cost and the quality its seeds reach: best (mean with its bootstrap interval),
    final and at the step budget (mean, min and max over seeds)."""
    arm = rs[0].arm
    return {
        "arm": arm.name, "mode": arm.mode, "batch_size": arm.batch_size, "matched": arm.matched,
        "cost_matched": arm.cost_matched, "memory_fitted": arm.memory_fitted, "fit": arm.fit,
        "micro_batches": arm.micro_batches, "lr": rs[0].summary()["lr"], "schedule_steps": arm.schedule_steps,
        "seeds": [r.seed for r in rs],
        "median_step_s": spread([r.summary()[f"median_step_{clock}_s"] for r in rs])[0],
        "steps_in_budget": spread([r.on_grid("time")[-1].step for r in rs])[0],
        "final_loss": spread([_curve(r, "loss")[-1] for r in rs]),
        "final_accuracy": spread([_curve(r, "accuracy")[-1] for r in rs]),
        "best_loss": mean_interval([min(_curve(r, "loss")) for r in rs], resamples, confidence, seed),
        "best_accuracy": mean_interval([max(_curve(r, "accuracy")) for r in rs], resamples, confidence, seed),
        "at_steps_loss": spread([_curve(r, "loss", "steps")[-1] for r in rs]),
        "at_steps_accuracy": spread([_curve(r, "accuracy", "steps")[-1] for r in rs]),
        "at_steps_clock_s": spread([getattr(r.on_grid("steps")[-1], f"{clock}_s") for r in rs]),
    }
