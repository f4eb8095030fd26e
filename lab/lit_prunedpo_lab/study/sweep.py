"""The learning-rate sweep: each arm at its own rate, chosen on seeds the verdict never uses.

Every arm trains at a few multiples of the base rate (``--lr-factors``, default 0.5, 1, 2 times ``--lr``) on
the tuning seeds (``--tune-seeds``, default 100 and 101; the command refuses tuning seeds that are also
verdict seeds), with the study's own budgets, evaluations and schedule, interleaved like the study
(:func:`~lit_prunedpo_lab.study.runner.train_arms`). A rate's score is its mean over tuning seeds of the held-out
loss over the *final window* of the time grid (the last third of the evaluations, at least one): a rate that
learns fast then blows up scores badly. A run whose training loss turns non-finite scores ``inf``. Each arm
keeps the rate with the lowest score (ties: the smaller rate).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.runner import Run, train_arms


def final_window_loss(run: Run, window: int) -> float:
    """Mean held-out loss over the last ``window`` evaluations of the time grid; ``inf`` for a diverged run."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window!r}")
    if run.diverged:
        return math.inf
    losses = [p.loss for p in run.on_grid("time")][1:][-window:]  # the step-0 evaluation is no training
    return sum(losses) / len(losses) if losses else math.inf


def window_of(evals: int) -> int:
    """The final window: the last third of ``evals`` evaluations, at least one."""
    return max(1, evals // 3)


def pick_lr(scores: Mapping[float, Sequence[float]]) -> float:
    """The rate with the lowest mean score over tuning seeds (ties: the smaller rate).

    Raises:
        ValueError: with no rate, or a rate without scores.
    """
    if not scores or any(not s for s in scores.values()):
        raise ValueError(f"pick_lr needs at least one rate, each with scores; got {dict(scores)!r}")
    return min(scores, key=lambda lr: (sum(scores[lr]) / len(scores[lr]), lr))


def sweep(arms: Sequence[Arm], base_lr: float, factors: Sequence[float], seeds: Sequence[int], evals: int,
          run: Callable[..., list[Run]] = train_arms, **study: Any) -> tuple[list[Arm], list[dict[str, Any]]]:
    """Run every arm at ``base_lr * f`` for each factor on ``seeds`` and return the arms at their chosen rates
    (same order) and one row per (arm, rate) with its per-seed scores. ``study`` holds ``train_arms``'s other
    arguments (task, budgets, data module, callbacks); arms whose own ``lr`` is set are swept around it."""
    if not factors or any(not f > 0 for f in factors):
        raise ValueError(f"the sweep needs positive learning-rate factors, got {list(factors)!r}")
    candidates = {arm: [dataclasses.replace(arm, lr=(arm.lr or base_lr) * f) for f in factors] for arm in arms}
    runs = run(arms=[c for cs in candidates.values() for c in cs], seeds=seeds, evals=evals, stop_on_nonfinite=True,
               **study)
    window = window_of(evals)
    scores: dict[Arm, list[float]] = {}
    for r in runs:
        scores.setdefault(r.arm, []).append(final_window_loss(r, window))
    chosen, table = [], []
    for arm, cs in candidates.items():
        best = pick_lr({c.lr: scores[c] for c in cs})
        chosen.append(dataclasses.replace(arm, lr=best))
        for c in cs:
            finite = [s for s in scores[c] if math.isfinite(s)]
            table.append({"arm": arm.name, "lr": c.lr, "scores": [s if math.isfinite(s) else None for s in scores[c]],
                          "mean": sum(finite) / len(finite) if len(finite) == len(scores[c]) else None,
                          "chosen": c.lr == best})
    return chosen, table
