"""From evaluation points to the study's verdict: the target, time to target, intervals over seeds, the win rule.

The protocol (docs/time-to-quality.md), in the order :mod:`lit_prunedpo_lab.study.report_summary` applies it:

* **Target.** A fixed share (``--target-share``, default 0.8) of the same-batch vanilla arm's *best*
  improvement over the initial quality, on its mean curve over seeds (:func:`improvement_target`): for the
  loss ``L0 - share * (L0 - min L)``, for the accuracy ``A0 + share * (max A - A0)``. Where vanilla's noisy
  curve ends (it may fall, then rise) no longer moves the target; the share below 1 keeps it reachable by
  a curve that only touches its best once.
* **Time to target, per seed.** The first time a seed's curve reaches the target, linearly interpolated
  between the two evaluations around the crossing (:func:`time_to_target`); ``None`` when it never does
  within the budget.
* **Ratio and censoring.** An arm's time ratio to a reference (a vanilla arm) is the ratio of the summed
  per-seed times over the same seeds (seeds are paired: a seed gives every arm the same initial weights and
  data order). A time that was not measured always counts *against the arm being judged*: a seed where the
  arm never reaches the target counts as infinitely slow (the ratio is then "not reached"); a seed where
  only the reference misses counts the reference at the budget (less than its real time, so the ratio can
  only be too high); a seed where both miss counts both at the budget (a tie on that seed). A WIN is
  therefore never claimed on a time that was not measured.
* **Better vanilla.** A pruned arm is judged against the better of its references (same-batch vanilla and
  cost-matched vanilla): the statistic is the *largest* of its ratios to them, on the whole sample and on
  each bootstrap resample, so choosing the better reference is inside the interval.
* **Interval.** Percentile bootstrap over seeds (``--bootstrap`` resamples, default 2000, seeded; 95 %):
  the seeds are drawn with replacement, the statistic recomputed, and the interval is the
  ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` order statistics (no interpolation, so an infinite
  ratio stays infinite).
* **Verdict** (:func:`verdict`): ``WIN`` when the interval's upper end is below 1.0, ``LOSS`` when its lower
  end is above 1.0, otherwise ``TIE`` (undecided at this number of seeds).
* **Best quality within the budget**: per seed the best held-out value over the evaluations of the time
  grid, reported as the mean with a bootstrap interval (:func:`mean_interval`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from lit_prunedpo.intervals import bootstrap_interval



def time_to_target(times: Sequence[float], values: Sequence[float], target: float,
                   lower_is_better: bool = True) -> float | None:
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


def improvement_target(curve: Sequence[float], share: float, lower_is_better: bool = True) -> float:
    """The value ``share`` of the way from ``curve[0]`` to the curve's best value (its minimum for a loss, its
    maximum for an accuracy). A curve that never improves gives its initial value.

    Raises:
        ValueError: on an empty curve or a share outside (0, 1].
    """
    if not curve:
        raise ValueError("improvement_target needs a non-empty curve")
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    best = min(curve) if lower_is_better else max(curve)
    return curve[0] + share * (best - curve[0])


def censored_pairs(arm: Sequence[float | None], reference: Sequence[float | None],
                   budget: float) -> list[tuple[float, float]]:
    """Per seed, (arm's time, reference's time) with the module's censoring rule: arm missed -> ``inf``;
    only the reference missed -> the reference at ``budget``; both missed -> both at ``budget``."""
    if len(arm) != len(reference):
        raise ValueError(f"paired seeds: the arm has {len(arm)} times, the reference {len(reference)}")
    pairs = []
    for a, r in zip(arm, reference):
        if a is None and r is None:
            pairs.append((budget, budget))
        else:
            pairs.append((math.inf if a is None else a, budget if r is None else r))
    return pairs


def ratio_of_sums(pairs: Sequence[tuple[float, float]]) -> float:
    """``sum(arm) / sum(reference)``; both 0 (the target held at the start) is 1.0, an arm time over a zero
    reference is ``inf``."""
    a, r = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    if r == 0:
        return 1.0 if a == 0 else math.inf
    return a / r


def verdict(low: float, high: float) -> str:
    """``WIN`` when the interval lies below 1.0 (faster), ``LOSS`` when above, else ``TIE`` (undecided)."""
    if high < 1.0:
        return "WIN"
    if low > 1.0:
        return "LOSS"
    return "TIE"


@dataclass(frozen=True)
class Ratio:
    """Time to target as a ratio to the better reference, with its bootstrap interval and verdict.

    Attributes:
        value: the ratio on every seed (``inf``: some seed of the arm never reached the target).
        low, high: the bootstrap interval.
        reference: the reference the ratio is largest against on every seed (the better vanilla).
        reached: seeds on which the arm reached the target, of ``seeds``.
    """

    value: float
    low: float
    high: float
    reference: str
    reached: int
    seeds: int

    @property
    def verdict(self) -> str:
        return verdict(self.low, self.high)

    def interval_text(self) -> str:
        def x(v: float) -> str:
            return "not reached" if math.isinf(v) else f"{v:.2f}x"

        return f"{x(self.value)} [{x(self.low)}-{x(self.high)}]"

    def __str__(self) -> str:
        return f"{self.interval_text()} {self.verdict} ({self.reached}/{self.seeds} seeds)"

    def as_dict(self) -> dict:
        # JSON has no infinity: an unmeasured ratio is written as null
        clean = lambda v: None if math.isinf(v) else v  # noqa: E731
        return {"value": clean(self.value), "low": clean(self.low), "high": clean(self.high),
                "reference": self.reference,
                "reached": self.reached, "seeds": self.seeds, "verdict": self.verdict, "text": str(self),
                "interval_text": self.interval_text()}


def time_ratio(arm: Sequence[float | None], references: Mapping[str, Sequence[float | None]], budget: float,
               resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Ratio:
    """The arm's time to target against the better of ``references`` (each a per-seed time list paired with
    ``arm``'s seeds), with the bootstrap interval over seeds; see the module docstring for the rules.

    Raises:
        ValueError: with no reference, or a reference whose seeds do not pair with the arm's.
    """
    if not references:
        raise ValueError("time_ratio needs at least one reference")
    names = list(references)
    per_ref = [censored_pairs(arm, references[name], budget) for name in names]
    per_seed = list(zip(*per_ref))  # per seed: one (arm, reference) pair per reference

    def statistic(seeds: list[tuple[tuple[float, float], ...]]) -> float:
        return max(ratio_of_sums([s[i] for s in seeds]) for i in range(len(names)))

    ratios = [ratio_of_sums(pairs) for pairs in per_ref]
    worst = max(range(len(names)), key=lambda i: ratios[i])  # the better reference: the arm's largest ratio
    low, high = bootstrap_interval(per_seed, statistic, resamples, confidence, seed)
    return Ratio(ratios[worst], low, high, names[worst], sum(t is not None for t in arm), len(arm))


def mean_interval(values: Sequence[float], resamples: int = 2000, confidence: float = 0.95,
                  seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds and its percentile-bootstrap interval."""
    low, high = bootstrap_interval(list(values), lambda vs: sum(vs) / len(vs), resamples, confidence, seed)
    return sum(values) / len(values), low, high
