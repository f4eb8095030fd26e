"""The training step, in the order the data flows: :mod:`~lit_prunedpo.step.plan` (every sampler draws, before any
compute) -> :mod:`~lit_prunedpo.step.execute` (the truncated forwards, the LM head on the gathered positions) ->
:mod:`~lit_prunedpo.step.estimate` (the inverse-probability sums, the margin, the surrogate), with the step's typed
ends in :mod:`~lit_prunedpo.step.io` (``StepParts`` in, ``StepOutput`` out). ``PrunedDPO.step``
(``lit_prunedpo/module.py``) wires the stages into Lightning.

``from lit_prunedpo.step import StepParts, StepOutput`` works: the names are imported on first use, so that importing
one stage does not import the others (the layouts import the plan, and the step's ends import the layouts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lit_prunedpo.step.io import StepOutput, StepParts

__all__ = ["StepOutput", "StepParts"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("lit_prunedpo.step.io"), name)
    globals()[name] = value
    return value
