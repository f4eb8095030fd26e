"""The ``auto`` option on the regime map: what ``AutoPruning`` picks in each cell, and what that choice costs.

For each cell, :func:`calibrate_cell` runs the callback's own calibration
(:func:`lit_prunedpo.callbacks.auto_pruning.calibrate`, with the callback's defaults) on the cell's vanilla run at
its initial weights (the warm start the study used, for the first verdict seed) and on the first batch that run
trains on, timed on the process's CPU clock as the study's runs are (always, to show what it would pick).
:func:`auto_row` then applies the callback's rule for short runs (``max_share``: no calibration when its work
exceeds that share of the run's steps, here vanilla's steps in the budget) and builds ``auto``'s per-seed times to
the loss target from the cell's study: the chosen arm's times (the same-batch arm of the chosen mode, or same-batch
vanilla) plus the calibration's CPU seconds when it ran, censored past the budget, and its ratio to same-batch
vanilla (the configuration a user would otherwise run) with the study's bootstrap interval. The row also keeps what
the calibration picked and cost when forced (``max_share`` null). The target set for ``auto`` is a ratio
of at most 1.05 in every cell.

What this leaves out, stated: the choice is made once per cell (on the first seed's batch), where a real run would
calibrate on its own seed; and in a cell with a memory budget ``auto`` is compared with same-batch vanilla as it
runs, not fitted to the budget (the callback does not fit memory).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from lit_prunedpo.callbacks import DEFAULT_MAX_SHARE, skip_reason
from lit_prunedpo_lab.study.curves import time_ratio


def calibrate_cell(cell: Any, modes: Sequence[str], seed: int, work_dir: Path) -> dict[str, Any]:
    """``AutoPruning``'s calibration on the cell's first vanilla batch (module docstring): its decision as a dict,
    with ``calibration_cpu_s``."""
    from lit_prunedpo.callbacks import AutoPruning
    from lit_prunedpo.callbacks import calibrate
    from lit_prunedpo.modes import load_mode
    from lit_prunedpo_lab.study.arms import Arm
    from lit_prunedpo_lab.study.runner import make_run
    from lit_prunedpo_lab.study.warm_start import warm_start

    defaults = AutoPruning()
    task = cell.task
    with tempfile.TemporaryDirectory(prefix="lit-prunedpo-map-") as tmp:
        dm = task.datamodule(Path(tmp))
    policy = None
    if task.warm_start_steps > 0:  # the study's warm start for this seed, cached under work_dir
        policy, _ = warm_start(task, seed, dm, work_dir, task.warm_start_steps, lr=task.warm_start_lr,
                               log=lambda line: print(line, file=sys.stderr, flush=True))
    run = make_run(task, Arm("vanilla", task.batch_size), seed, dm, policy=policy)
    batch = next(iter(run.loader))
    candidates = {m: load_mode(m).samplers for m in modes}
    start = time.process_time()
    decision = calibrate(run.module, batch, candidates, defaults.pairs, defaults.draws, defaults.min_gain,
                         defaults.seed)
    cpu_s = time.process_time() - start
    # the decision's own calibration_s is wall time; the map's runs are timed on one of the two clocks
    return {**decision.as_dict(), "calibration_cpu_s": cpu_s, "calibration_wall_s": decision.calibration_s,
            "seed": seed,
            "batch_size": batch.num_pairs}


def auto_row(cell: Mapping[str, Any], study: Mapping[str, Any], auto: Mapping[str, Any],
             max_share: float | None = DEFAULT_MAX_SHARE) -> dict[str, Any]:
    """``auto``'s row of the map for one finished cell (module docstring).

    Raises:
        ValueError: if the study has no same-batch arm of the chosen mode, or no same-batch vanilla.
    """
    summary = study["summary"]
    batch = study["task"]["batch_size"]
    same_batch = {r["mode"]: r for r in summary["arms"]
                  if r["batch_size"] == batch and not r["matched"] and not r["cost_matched"]
                  and not r.get("memory_fitted")}
    if "vanilla" not in same_batch or auto["choice"] not in same_batch:
        raise ValueError(f"cell {cell['name']}: the study has no same-batch arm of {auto['choice']!r} or of vanilla")
    budget = float(study["budget_s"])
    # the callback's own rule: a run too short to repay a calibration trains vanilla without one
    run_steps = int(same_batch["vanilla"]["steps_in_budget"])
    skipped = skip_reason(run_steps, auto["pairs"], auto["draws"], len(auto["arms"]) - 1, max_share)
    choice = "vanilla" if skipped else auto["choice"]
    calibrated_s = float(auto["calibration_cpu_s" if study.get("clock", "cpu") == "cpu" else "calibration_wall_s"])
    extra = 0.0 if skipped else calibrated_s
    chosen = same_batch[choice]["loss_seed_times"]
    times = [None if t is None or t + extra > budget else t + extra for t in chosen]
    vanilla = same_batch["vanilla"]["loss_seed_times"]
    ratio = time_ratio(times, {same_batch["vanilla"]["arm"]: vanilla}, budget, summary["resamples"],
                       summary["confidence"],
                       summary["bootstrap_seed"])
    reached = [t for t in vanilla if t is not None]
    written = ratio.as_dict()
    return {
        **cell, "choice": choice, "reason": skipped or auto["reason"], "calibrated": skipped is None,
        "calibrated_choice": auto["choice"], "calibration_s": extra, "forced_calibration_s": calibrated_s,
        "run_steps": run_steps,
        # a cell whose vanilla reached the target at once (no progress to make) has no share
        "calibration_share_of_vanilla": calibrated_s / (sum(reached) / len(reached)) if reached and sum(reached) > 0
        else None,
        # as the study's JSON: a ratio that was not reached (infinite) is null
        "loss_ratio": written["value"], "loss_interval": [written["low"], written["high"]],
        "loss_text": ratio.interval_text(), "loss_verdict": ratio.verdict, "met": ratio.value <= 1.05,
    }
