"""How the study's runs share the machine: turns of a few steps, round-robin, and the load each run was timed under.

Why turns are short. A design's cost is only comparable with vanilla's if both were timed in the same minutes:
the CPU clock of this process moves with what the neighbours do (another process on the same core, or on the
other hyper-thread, slows every instruction, and the wall clock far more). Runs that each trained a long stretch
one after another (one evaluation interval per turn, the old schedule) gave a published 1.51x per-step ratio that
re-ran as 1.29x on the same bit-identical models. With ``turn_steps`` steps per turn (default 1), every run of a
study advances in the same minutes, so a change of load lasting longer than one round of turns hits every arm
alike: the *ratios* of the summed clocks (time per epoch, time to a target) and of the step medians are the
bench's alternated-round ratios, taken over the whole run. Absolute seconds still move with the load; they are
recorded with it (:func:`~lit_prunedpo_lab.bench.load.load_record`) and never compared across runs taken apart.

The load a run was timed under: the 1-minute load average sampled at each of its turns, and the ratio of its
training wall seconds to its CPU seconds (about 1 on a quiet core with one torch thread; a neighbour sharing the
core raises it). :func:`~lit_prunedpo_lab.bench.load.under_load` is the rule the reports use to say a figure was
taken under load.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench.load import loadavg, under_load

Clock = Literal["cpu", "wall"]


class Run(Protocol):
    """What the schedule needs of a run (:class:`lit_prunedpo_lab.study.runner.Run`, which imports this module)."""

    arm: Any
    seed: int
    step: int
    diverged: bool
    points: list[Any]
    loadavg: list[float | None]

    def clock(self, which: Clock) -> float: ...

    def train_step(self) -> None: ...

    def evaluate(self, batches: Sequence[PreferenceBatch], grids: list[str]) -> Any: ...



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
                on_point: Callable[[Run, Any], None] | None, on_done: Callable[[Run], None] | None,
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
            run.loadavg.append(loadavg())
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


def record_load(record: Mapping[str, Any], threads: int | None) -> dict[str, Any] | None:
    """The load ``record`` was timed under: its own, or for a record from before the interleaved schedule the
    wall/CPU ratio of its training clocks (``threads``: the torch threads its cell's provenance names; None when
    unknown, then nothing)."""
    if record.get("load"):
        return dict(record["load"])
    wall, cpu = record.get("train_wall_s"), record.get("train_cpu_s")
    if threads is None or not wall or not cpu:
        return None
    return {"wall_per_cpu": wall / cpu, "torch_threads": threads, "turn_steps": None}


def load_summary(records: Sequence[Mapping[str, Any]], threads: int | None = None) -> dict[str, Any]:
    """How a cell's clocks were taken: the schedules (steps per turn; ``None`` stands for records from before the
    interleaved schedule, whose ratios move with the load), how many records predate it, the median wall/CPU ratio
    and mean load average over its records, and each record taken under load
    (:func:`under_load`)."""
    loads = [record_load(r, threads) for r in records]
    kept = [load for load in loads if load]
    ratios = sorted(load["wall_per_cpu"] for load in kept if load.get("wall_per_cpu") is not None)
    means = [load["loadavg_mean"] for load in kept if load.get("loadavg_mean") is not None]
    return {"turn_steps": sorted({load.get("turn_steps") for load in kept}, key=str),
            "before_interleaving": sum(1 for r in records if not r.get("load")),
            "wall_per_cpu_median": ratios[len(ratios) // 2] if ratios else None,
            "loadavg_mean": sum(means) / len(means) if means else None,
            "under_load": [f"{r.get('design') or r.get('arm')} seed {r['seed']}: {why}" for r,
                           load in zip(records, loads)
                           if (why := under_load(load))]}


def load_text(load: Mapping[str, Any] | None) -> str:
    """One sentence for the provenance list: the schedule and the load the cell's clocks were taken under."""
    if not load:
        return "load not recorded"
    old, parts = load.get("before_interleaving", 0), []
    interleaved = [t for t in load.get("turn_steps", []) if t is not None]
    if interleaved:
        parts.append(f"timed in turns of {', '.join(str(t) for t in interleaved)} step(s), designs interleaved")
    if old:
        parts.append(f"{old} record(s) timed one design after another (before the interleaved schedule): their "
                     "ratios move with the load")
    if load.get("wall_per_cpu_median") is not None:
        parts.append(f"wall/CPU median {load['wall_per_cpu_median']:.2f}")
    if load.get("loadavg_mean") is not None:
        parts.append(f"load average {load['loadavg_mean']:.1f}")
    if load.get("under_load"):
        parts.append(f"**taken under load**: {len(load['under_load'])} record(s), e.g. {load['under_load'][0]}")
    return "; ".join(parts)
