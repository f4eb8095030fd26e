"""Renamed :mod:`lit_prunedpo.step_io` (the step's typed input and output: it holds no step); this alias warns and
goes in the release after 0.1.0."""

from __future__ import annotations

import warnings

from lit_prunedpo.step_io import StepOutput, StepParts

__all__ = ["StepOutput", "StepParts"]

warnings.warn("lit_prunedpo.step is now lit_prunedpo.step_io (StepParts, StepOutput); import from there",
              FutureWarning, stacklevel=2)
