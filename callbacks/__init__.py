"""Lightning callbacks of lit_prunedpo: per-step peak memory and step time / throughput monitors, the final
checkpoint with its run summary, the SIGTERM (preemption) checkpoint, greedy samples at each validation, a step
progress bar, the prune-early schedule and the auto-pruning calibration; and, for the package's own harnesses, the peak-memory meter and the
prune-early switch those callbacks use."""

from ._memory import PeakMemoryMeter, PeakReading
from .auto_pruning import AutoPruning
from .final_checkpoint import FinalCheckpoint
from .last_checkpoint import LastCheckpointAtValidation
from .peak_memory import PeakMemoryMonitor
from .progress_bar import StepProgressBar
from .preemption import PreemptionCheckpoint
from .prune_early import SAMPLER_ATTRS, PruneEarly, use_exact_samplers
from .step_time import StepTimeMonitor
from .validation_samples import ValidationSamples

__all__ = [
    "AutoPruning", "FinalCheckpoint", "LastCheckpointAtValidation", "PeakMemoryMonitor", "PreemptionCheckpoint", "PruneEarly", "StepProgressBar", "StepTimeMonitor",
    "ValidationSamples",
    # the units the callbacks are built from, for harnesses that time and switch outside a Trainer (lit_prunedpo.bench,
    # lit_prunedpo.study): the peak-memory meter and the prune-early switch
    "PeakMemoryMeter", "PeakReading", "SAMPLER_ATTRS", "use_exact_samplers",
]
