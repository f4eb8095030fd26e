"""Lightning callbacks of lit_prunedpo: per-step peak memory and step time / throughput monitors."""

from .peak_memory import PeakMemoryMonitor
from .step_time import StepTimeMonitor

__all__ = ["PeakMemoryMonitor", "StepTimeMonitor"]
