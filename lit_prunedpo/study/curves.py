"""From evaluation points to the study's verdict: mean curves over seeds and time to target.

The target is vanilla's quality at the end of the budget: the mean over seeds of vanilla's final held-out
loss (lower is better) and accuracy (higher is better; reaching it within ``tolerance`` counts, the issue's
"within 1 point"). An arm's time to target is the first time its mean curve reaches it, linearly interpolated
between the two evaluations around the crossing; the ratio divides that by vanilla's own time on its mean
curve (at most the budget, by construction). The spread is the range of the per-seed ratios (each seed's own
curve against vanilla's mean time); a seed that never reaches the target within the budget is counted, not
dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def time_to_target(times: Sequence[float], values: Sequence[float], target: float, lower_is_better: bool = True) -> float | None:
    """First time a curve reaches ``target``, linearly interpolated between evaluations; ``None`` if never.

    Raises:
        ValueError: if the curve is empty, its lengths differ or its times decrease.
    """
    if len(times) != len(values) or not times:
        raise ValueError(f"a curve needs as many times as values (> 0), got {len(times)} and {len(values)}")
    if any(b < a for a, b in zip(times, times[1:])):
        raise ValueError("a curve's times must not decrease")
    sign = 1.0 if lower_is_better else -1.0
    gap = [sign * (v - target) for v in values]  # <= 0 once the target is reached
    if gap[0] <= 0:
        return float(times[0])
    for i in range(1, len(gap)):
        if gap[i] <= 0:
            t0, t1, g0, g1 = times[i - 1], times[i], gap[i - 1], gap[i]
            return float(t0 + (t1 - t0) * g0 / (g0 - g1))
    return None


def mean_curve(curves: Sequence[Sequence[float]]) -> list[float]:
    """Pointwise mean of equally long curves (one per seed)."""
    if not curves or len({len(c) for c in curves}) != 1:
        raise ValueError(f"need curves of one length, got lengths {[len(c) for c in curves]}")
    return [sum(vs) / len(vs) for vs in zip(*curves)]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, min, max)."""
    return sum(values) / len(values), min(values), max(values)


@dataclass(frozen=True)
class Ratio:
    """Time to target as a ratio to vanilla's. ``mean`` comes from the mean curves; ``low``/``high`` from the
    seeds that reached the target; ``reached`` of ``seeds`` did. ``mean`` is None when the mean curve never
    reaches the target in the budget (then the arm is slower than vanilla, by more than ``budget/vanilla``)."""

    mean: float | None
    low: float | None
    high: float | None
    reached: int
    seeds: int

    def __str__(self) -> str:
        if self.mean is None:
            return f"not reached ({self.reached}/{self.seeds} seeds)"
        rng = f" [{self.low:.2f}-{self.high:.2f}]" if self.low is not None else ""
        return f"{self.mean:.2f}x{rng} ({self.reached}/{self.seeds} seeds)"


def ratio_to_vanilla(
    grid: Sequence[float],
    arm_curves: Sequence[Sequence[float]],
    arm_seed_times: Sequence[Sequence[float]],
    vanilla_curves: Sequence[Sequence[float]],
    target: float,
    lower_is_better: bool = True,
) -> Ratio:
    """Time to ``target`` of an arm relative to vanilla's.

    Args:
        grid: the nominal evaluation times (the same for every run).
        arm_curves: per seed, the arm's values at ``grid``.
        arm_seed_times: per seed, the times actually recorded at those evaluations.
        vanilla_curves: per seed, vanilla's values at ``grid``.
        target: the value to reach.
        lower_is_better: True for a loss, False for an accuracy.
    """
    # Vanilla's mean curve ends at the target, so it reaches it within the budget; only an untrained-looking
    # curve (already at the target at time 0) has no positive time: the budget is then the fair denominator.
    vanilla_time = time_to_target(grid, mean_curve(vanilla_curves), target, lower_is_better) or grid[-1]
    arm_time = time_to_target(grid, mean_curve(arm_curves), target, lower_is_better)
    per_seed = [time_to_target(t, v, target, lower_is_better) for t, v in zip(arm_seed_times, arm_curves, strict=True)]
    reached = [t / vanilla_time for t in per_seed if t is not None]
    return Ratio(
        mean=None if arm_time is None else arm_time / vanilla_time,
        low=min(reached) if reached else None,
        high=max(reached) if reached else None,
        reached=len(reached),
        seeds=len(per_seed),
    )

