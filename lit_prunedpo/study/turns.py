"""How the study's runs share the machine: turns of a few steps, round-robin, and the load each run was timed under.

Why turns are short. A design's cost is only comparable with vanilla's if both were timed in the same minutes:
the CPU clock of this process moves with what the neighbours do (another process on the same core, or on the
other hyper-thread, slows every instruction, and the wall clock far more). Runs that each trained a long stretch
one after another (one evaluation interval per turn, the old schedule) gave a published 1.51x per-step ratio that
re-ran as 1.29x on the same bit-identical models. With ``turn_steps`` steps per turn (default 1), every run of a
study advances in the same minutes, so a change of load lasting longer than one round of turns hits every arm
alike: the *ratios* of the summed clocks (time per epoch, time to a target) and of the step medians are the
bench's alternated-round ratios, taken over the whole run. Absolute seconds still move with the load; they are
recorded with it (:func:`load_record`) and never compared across runs taken apart.

The load a run was timed under: the 1-minute load average sampled at each of its turns, and the ratio of its
training wall seconds to its CPU seconds (about 1 on a quiet core with one torch thread; a neighbour sharing the
core raises it). :func:`under_load` is the rule the reports use to say a figure was taken under load.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lit_prunedpo.batch import PreferenceBatch

if TYPE_CHECKING:
    from lit_prunedpo.study.runner import Clock, Point, Run

#: A run timed with one torch thread whose wall seconds exceed its CPU seconds by more than this waited for the core.
WAITED = 1.2
#: Runnable tasks beyond this process's own threads (1-minute load average) that mark a run as under load.
NEIGHBOURS = 1.0


def events(budget_s: float | None, steps: int, evals: int) -> tuple[list[float], list[int]]:
    """The evaluation points of one run: ``evals`` times on the clock (none without a budget) and ``evals`` steps."""
    times = [] if budget_s is None else [budget_s * k / evals for k in range(1, evals + 1)]
    return times, [round(steps * k / evals) for k in range(1, evals + 1)]


def advance(run: Run, time_grid: list[float], step_grid: list[int], clock: Clock, batches: Sequence[PreferenceBatch],
            stop_on_nonfinite: bool = False, turn_steps: int | None = None) -> bool:
    """Train ``run`` towards its next grid point (of either grid) for at most ``turn_steps`` steps (None: all the
    way), evaluating once it gets there; False once both grids are done, or (with ``stop_on_nonfinite``) once a
    non-finite loss marked the run ``diverged``."""
    if not time_grid and not step_grid:
        return False
    taken = 0
    while (not time_grid or run.clock(clock) < time_grid[0]) and (not step_grid or run.step < step_grid[0]):
        if turn_steps is not None and taken >= turn_steps:
            return True
        try:
            run.train_step()
        except FloatingPointError:
            if not stop_on_nonfinite:
                raise
            run.diverged = True
            time_grid.clear()
            step_grid.clear()
            return False
        taken += 1
    grids = []
    while time_grid and run.clock(clock) >= time_grid[0]:
        time_grid.pop(0)
        grids.append("time")
    while step_grid and run.step >= step_grid[0]:
        step_grid.pop(0)
        grids.append("steps")
    run.evaluate(batches, grids)
    return bool(time_grid or step_grid)


def round_robin(runs: Sequence[Run], grids: dict[int, tuple[list[float], list[int]]], clock: Clock,
                batches: Sequence[PreferenceBatch], stop_on_nonfinite: bool, log: Callable[[str], None],
                on_point: Callable[[Run, Point], None] | None, on_done: Callable[[Run], None] | None,
                turn_steps: int | None = 1) -> None:
    """Turn after turn, advance every unfinished run by ``turn_steps`` steps (:func:`advance`), sampling the load
    for each, logging and handing on each evaluation, until every run has passed both its grids (or diverged)."""
    active = list(runs)
    turn = 0
    while active:
        turn += 1
        still = []
        for run in active:
            seen = len(run.points)
            run.loadavg.append(_loadavg())
            more = advance(run, *grids[id(run)], clock, batches, stop_on_nonfinite, turn_steps)
            if len(run.points) > seen:
                p = run.points[-1]
                rate = "" if run.arm.lr is None else f" lr {run.arm.lr:.3g}"
                log(f"turn {turn} {run.arm.name}{rate} seed {run.seed}: step {p.step} cpu {p.cpu_s:.1f}s "
                    f"wall {p.wall_s:.1f}s val/loss {p.loss:.4f} acc {p.accuracy:.3f}")
                if on_point is not None:
                    on_point(run, p)
            if run.diverged:
                log(f"turn {turn} {run.arm.name} seed {run.seed}: non-finite training loss at step {run.step}: stopped")
            if more:
                still.append(run)
            elif on_done is not None:
                on_done(run)
        active = still


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return None


def load_record(wall_s: float, cpu_s: float, loadavg: Sequence[float | None], threads: int,
                turn_steps: int | None) -> dict[str, Any]:
    """What a run's clocks were taken under: wall/CPU seconds, the load average over its turns (mean, max; None
    where unreadable), this process's torch threads, the machine's CPUs and the schedule (steps per turn)."""
    seen = [x for x in loadavg if x is not None]
    return {"wall_per_cpu": wall_s / cpu_s if cpu_s > 0 else None,
            "loadavg_mean": sum(seen) / len(seen) if seen else None, "loadavg_max": max(seen) if seen else None,
            "torch_threads": threads, "cpus": os.cpu_count(), "turn_steps": turn_steps}


def under_load(load: dict[str, Any] | None) -> str | None:
    """Why a run's clocks were taken under load (one phrase), or None when nothing says so (or nothing was kept)."""
    if not load:
        return None
    reasons = []
    ratio, threads = load.get("wall_per_cpu"), load.get("torch_threads") or 1
    if ratio is not None and threads == 1 and ratio > WAITED:
        reasons.append(f"wall {ratio:.2f}x its CPU time")
    mean = load.get("loadavg_mean")
    if mean is not None and mean - threads > NEIGHBOURS:
        reasons.append(f"load average {mean:.1f} beside its {threads} thread(s) on {load.get('cpus')} CPUs")
    return "; ".join(reasons) or None
