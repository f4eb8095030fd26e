"""Small statistics the package's timing code shares (the step-time monitor's p90, the benchmark's)."""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["quantile"]


def quantile(values: Sequence[float], q: float) -> float:
    """Quantile with linear interpolation between order statistics (NumPy's default ``"linear"``), ``0 <= q <= 1``."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
