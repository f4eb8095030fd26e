"""Lightning callbacks of lit_prunedpo: per-step peak memory and step time / throughput monitors, and the
prune-early schedule."""

from .peak_memory import PeakMemoryMonitor
from .prune_early import PruneEarly
from .step_time import StepTimeMonitor

__all__ = ["PeakMemoryMonitor", "PruneEarly", "StepTimeMonitor"]
