"""Lightning callbacks of lit_prunedpo: per-step peak memory and step time / throughput monitors, the final
checkpoint with its run summary, the SIGTERM (preemption) checkpoint, greedy samples at each validation, a step
progress bar, the prune-early schedule, the auto-pruning calibration, the logs under TRL's keys and ``torch.compile``
of the model bodies; and, for the package's own harnesses, the
peak-memory meter those callbacks use.

Each name is imported from its module on first use (PEP 562 ``__getattr__``): the callbacks import lightning, which
a command that needs none of them (``lit-prunedpo --help``, ``lit-prunedpo export``) should not pay for.
``from lit_prunedpo.callbacks import FinalCheckpoint`` and a config's ``class_path: lit_prunedpo.callbacks.X`` work
as ever.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and readers; at run time __getattr__ imports them
    from ._memory import PeakMemoryMeter, PeakReading
    from .auto_pruning import DEFAULT_MAX_SHARE, AutoPruning, calibrate, skip_reason
    from .compile_model import CompileModel
    from .final_checkpoint import FinalCheckpoint
    from .last_checkpoint import LastCheckpointAtValidation
    from .peak_memory import PeakMemoryMonitor
    from .preemption import PreemptionCheckpoint
    from .progress_bar import StepProgressBar
    from .prune_early import PruneEarly
    from .step_time import StepTimeMonitor
    from .trl_keys import TRLKeys
    from .validation_samples import ValidationSamples

__all__ = [
    "AutoPruning", "CompileModel", "FinalCheckpoint", "LastCheckpointAtValidation", "PeakMemoryMonitor",
    "PreemptionCheckpoint", "PruneEarly", "StepProgressBar", "StepTimeMonitor",
    "TRLKeys", "ValidationSamples",
    # the unit the memory callbacks are built from, for harnesses measuring outside a Trainer (lit_prunedpo_lab.bench,
    # lit_prunedpo_lab.study): the peak-memory meter
    "PeakMemoryMeter", "PeakReading",
    # AutoPruning's calibration and its rule for short runs, for the regime map's "auto" row (lit_prunedpo_lab.study)
    "DEFAULT_MAX_SHARE", "calibrate", "skip_reason",
]

#: public name -> the module (in this package) that defines it
_LAZY = {
    "PeakMemoryMeter": "_memory", "PeakReading": "_memory", "AutoPruning": "auto_pruning",
    "CompileModel": "compile_model",
    "FinalCheckpoint": "final_checkpoint", "LastCheckpointAtValidation": "last_checkpoint",
    "PeakMemoryMonitor": "peak_memory", "PreemptionCheckpoint": "preemption", "StepProgressBar": "progress_bar",
    "PruneEarly": "prune_early", "DEFAULT_MAX_SHARE": "auto_pruning", "calibrate": "auto_pruning",
    "skip_reason": "auto_pruning",
    "StepTimeMonitor": "step_time", "TRLKeys": "trl_keys", "ValidationSamples": "validation_samples",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
