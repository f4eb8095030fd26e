"""Small statistics the package's timing code shares: the step-time monitor's and the benchmark's p90, the percentile
bootstrap the study's intervals over seeds and the benchmark's intervals over its paired rounds use."""

from __future__ import annotations

import math
import random
import statistics
from typing import Callable, Sequence, TypeVar

__all__ = ["bootstrap_interval", "paired_ratio_interval", "quantile"]

T = TypeVar("T")


def quantile(values: Sequence[float], q: float) -> float:
    """Quantile with linear interpolation between order statistics (NumPy's default ``"linear"``), ``0 <= q <= 1``."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bootstrap_interval(samples: Sequence[T], statistic: Callable[[list[T]], float], resamples: int = 2000,
                       confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap: resample ``samples`` with replacement ``resamples`` times (a ``random.Random(seed)``
    stream, so the same call gives the same interval), and return the ``(1 - confidence) / 2`` and
    ``(1 + confidence) / 2`` order statistics of ``statistic`` (no interpolation: infinities are kept).

    Raises:
        ValueError: on no samples, ``resamples < 1`` or a confidence outside (0, 1).
    """
    if not samples:
        raise ValueError("bootstrap_interval needs at least one sample")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    rng = random.Random(seed)
    n = len(samples)
    values = sorted(statistic([samples[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    k = math.floor((1.0 - confidence) / 2 * resamples)
    return values[k], values[resamples - 1 - k]


def paired_ratio_interval(numerator: Sequence[float], denominator: Sequence[float], resamples: int = 2000,
                          confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of ``median(numerator) / median(denominator)`` over paired samples: the benchmark's rounds,
    each of which ran every configuration on the same batch, so a resample draws whole rounds (both step times of
    a round together) and the interval keeps the pairing. ``numerator`` and ``denominator`` are step times in round
    order, of equal length.

    Raises:
        ValueError: on sequences of different lengths (not paired), or as :func:`bootstrap_interval`.
    """
    if len(numerator) != len(denominator):
        raise ValueError(f"paired_ratio_interval needs paired samples, got {len(numerator)} and {len(denominator)}")

    def ratio(pairs: list[tuple[float, float]]) -> float:
        return statistics.median(a for a, _ in pairs) / statistics.median(b for _, b in pairs)

    return bootstrap_interval(list(zip(numerator, denominator)), ratio, resamples, confidence, seed)
