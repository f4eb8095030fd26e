"""The load a timing was taken under: how busy the machine was while the clocks ran.

Ratios of arms alternated in the same minutes hold under a steady neighbour; absolute seconds do not, and a load
that changes between arms moves even a ratio. So every record of timed work (a bench run, a study run) keeps the
load it was taken under: the 1-minute load average sampled while it ran, and the ratio of its wall seconds to its
CPU seconds (about 1 on a quiet core with one torch thread; a neighbour sharing the core raises it). With several
torch threads the wall/CPU ratio also reflects the step's serial parts, so only the load average speaks there.
:func:`under_load` is the one rule the reports use to say a figure was taken under load.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import torch

#: A run timed with one torch thread whose wall seconds exceed its CPU seconds by more than this waited for the core.
WAITED = 1.2
#: Runnable tasks beyond this process's own threads (1-minute load average) that mark a run as under load.
NEIGHBOURS = 1.0


def loadavg() -> float | None:
    """The machine's 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def load_record(wall_s: float, cpu_s: float, loadavg: Sequence[float | None], threads: int,
                turn_steps: int | None) -> dict[str, Any]:
    """What a run's clocks were taken under: wall/CPU seconds, the load average over its samples (mean, max; None
    where unreadable), this process's torch threads, the machine's CPUs and the schedule (steps per turn; None
    where there is none, as in the bench)."""
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


class LoadMeter:
    """The load over a stretch of timed work: :meth:`sample` at each round, :meth:`record` at the end (this
    process's wall and CPU seconds since construction)."""

    def __init__(self) -> None:
        self.samples: list[float | None] = [loadavg()]
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def sample(self) -> None:
        self.samples.append(loadavg())

    def record(self, turn_steps: int | None = None) -> dict[str, Any]:
        return load_record(time.perf_counter() - self._wall, time.process_time() - self._cpu, self.samples,
                           torch.get_num_threads(), turn_steps)
