"""Lightning callbacks of lit_prunedpo: per-step peak memory and step time / throughput monitors, the final
checkpoint with its run summary, the SIGTERM (preemption) checkpoint, greedy samples at each validation, a step
progress bar, and the prune-early schedule; and ``PeakMemoryMeter``, the peak-memory unit the monitor, the benchmark
and the study measure with."""

from ._memory import PeakMemoryMeter, PeakReading
from .final_checkpoint import FinalCheckpoint
from .peak_memory import PeakMemoryMonitor
from .progress_bar import StepProgressBar
from .preemption import PreemptionCheckpoint
from .prune_early import PruneEarly
from .step_time import StepTimeMonitor
from .validation_samples import ValidationSamples

__all__ = [
    "FinalCheckpoint", "PeakMemoryMeter", "PeakMemoryMonitor", "PeakReading",
    "PreemptionCheckpoint", "PruneEarly", "StepProgressBar", "StepTimeMonitor", "ValidationSamples",
]
