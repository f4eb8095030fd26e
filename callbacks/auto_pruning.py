"""Auto pruning: a short calibration on the run's first batch picks the pruning mode, or none, and logs why.

Whether pruning pays depends on the run (the regime map, ``docs/time-to-quality.md``): a pruned step is
cheaper than a vanilla one by a factor ``k`` but adds gradient noise ``within`` to the batch's own ``between``
(:mod:`lit_prunedpo.gradient_noise`). Against the user's simplest alternative, vanilla with the batch shrunk to the
same cost per step, pruning lowers the gradient variance per second only when ``(1 + within / between) / k < 1``.
:class:`AutoPruning` measures these on the run itself before the first optimizer step, on the first training
batch at the initial weights:

1. ``between``: the unbiased variance of the exact per-pair gradients of up to ``pairs`` pairs of the batch;
2. per arm (vanilla and each candidate mode), ``draws`` forward + backward passes of the module's own step on the
   whole batch, interleaved and timed (wall clock; the median is the arm's step time, ``k`` = vanilla's over the
   arm's), the pruned draws' squared distances to the exact batch gradient giving the mode's ``within``;
3. the choice: the candidate with the lowest ``(1 + within / between) / k`` if that is at most ``1 - min_gain``,
   else vanilla (the module's exact samplers); the rule and every arm's figures are logged (console lines,
   ``auto/*`` metrics) and kept in checkpoints, so a resumed run keeps its choice without calibrating again.

Departures from the noise model, stated: the step times leave out the optimizer step (the same for every arm), so
``k`` is slightly optimistic for pruning; ``min_gain`` is the margin that absorbs it and the measurement's noise.
The model compares variances, which decide the pace only while gradient noise dominates; where it does not,
cheaper steps pay more than the model says and the rule errs towards vanilla. The calibration's passes are not
training steps (no optimizer step follows them) and cost about ``1 + pairs / B + draws (1 + sum 1/k)`` vanilla
steps once per run (the logged ``auto/calibration_s``): on the quickstart about a second, on a model whose step
takes seconds about a minute. ``budget_s`` bounds the rounds of timed passes in wall seconds (at least one round
runs; the decision names the rounds run). The per-pair gradients are folded into ``between`` one at a time
(:class:`~lit_prunedpo.gradient_noise.RunningBetween`), so the calibration holds about three gradients, not
``pairs`` of them in double precision. No timed pass runs under a profiler (the CPU tensor meter is one): it would
time the profiler's records, and the calibration warns if one is running.

A calibration is worth running only if the run is long enough to repay it: with ``max_share`` (default 0.02) the
callback first bounds the calibration's work by :func:`calibration_steps` (in vanilla steps, counting every pass as
a full step) and skips it when that exceeds ``max_share`` of the run's optimizer steps, training vanilla and logging
why. A skipped calibration is not a choice: a resume whose steps left (a larger ``max_steps``) now repay one
calibrates at its first batch, and says so. On the regime map's 10-CPU-second runs a calibration cost 4 % to 200 % of
vanilla's time to target, and it never picked a pruning mode there (``docs/time-to-quality.md``).

Single process only: under DDP or FSDP each rank would measure its own batch (and pick on its own); calibrate with
one process and put the mode it picks into the distributed config.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.gradient_noise import (
    RunningBetween,
    gradient,
    pair,
    relative_inefficiency,
    squared_distance,
    timed_gradient,
    within_variance,
)
from lit_prunedpo.modes import load_mode, mode_names
from lit_prunedpo.step.plan import exact_samplers

if TYPE_CHECKING:
    from lit_prunedpo.module import PrunedDPO

VANILLA = "vanilla"
#: the default position mode (the only design that has beaten a cost-matched vanilla) and antithetic branches, the
#: branch design the regime map measures
DEFAULT_CANDIDATES = ("position", "antithetic")
DEFAULT_MAX_SHARE = 0.02
#: the samplers' keys under a config's ``model``, in the order ``PrunedDPO.use_samplers`` takes them (for messages)
_MODEL_KEYS = ("prefix_sampler", "position_sampler", "branch_sampler")


def calibration_steps(pairs: int, draws: int, candidates: int) -> int:
    """An upper bound on a calibration's work in vanilla steps: the warm-up, one pass per measured pair, and
    ``draws`` rounds of one vanilla and one pass per candidate (each pass counted as a full vanilla step)."""
    return 1 + pairs + draws * (1 + candidates)


def skip_reason(run_steps: int | None, pairs: int, draws: int, candidates: int, max_share: float | None) -> str | None:
    """Why a run of ``run_steps`` optimizer steps should not calibrate (its bound exceeds ``max_share`` of the
    run), or ``None`` to calibrate; ``max_share`` ``None`` always calibrates, an unknown run length never skips."""
    if max_share is None or run_steps is None or run_steps <= 0:
        return None
    work = calibration_steps(pairs, draws, candidates)
    if work <= max_share * run_steps:
        return None
    return (f"calibration skipped: its work (up to {work} vanilla steps) exceeds max_share {max_share:g} of this "
            f"run's {run_steps} steps; training vanilla (a longer run, or max_share null, calibrates)")


@dataclass(frozen=True)
class ArmCalibration:
    """One arm's calibration: its median step time, ``k`` (vanilla's time over its own), the extra within-pair
    variance it adds (0 for vanilla) and its relative inefficiency ``(1 + within / between) / k``."""

    mode: str
    step_s: float
    k: float
    within: float
    inefficiency: float


@dataclass(frozen=True)
class AutoDecision:
    """What :func:`calibrate` found and chose."""

    choice: str
    """The mode the run trains with (``vanilla``: the module's exact samplers)."""
    reason: str
    """One sentence: the rule and the figures that decided."""
    between: float
    """Trace of the covariance of the exact per-pair gradients."""
    arms: tuple[ArmCalibration, ...]
    """Vanilla first, then the candidates in the order given."""
    pairs: int
    draws: int
    calibration_s: float
    """Wall seconds the calibration took."""
    skipped: bool = False
    """The run was too short to repay a calibration (:func:`skip_reason`): none ran, and a longer run (a resume
    with a larger ``max_steps``) decides again."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "AutoDecision":
        skipped = state.get("skipped", not state["arms"] and state["reason"].startswith("calibration skipped"))
        return cls(**{**state, "arms": tuple(ArmCalibration(**a) for a in state["arms"]), "skipped": skipped})


def decide(between: float, vanilla_s: float, candidates: dict[str, tuple[float, float]],
           min_gain: float) -> tuple[str, str, tuple[ArmCalibration, ...]]:
    """The choice rule on measured figures: ``candidates`` maps a mode to ``(step_s, within)``.

    Returns:
        ``(choice, reason, arms)``: the candidate with the lowest relative inefficiency if it is at most
        ``1 - min_gain`` (ties: the first given), else ``vanilla``.
    """
    if not vanilla_s > 0 or any(not s > 0 for s, _ in candidates.values()):
        raise ValueError(f"step times must be > 0, got vanilla {vanilla_s!r} and {candidates!r}")
    arms = [ArmCalibration(VANILLA, vanilla_s, 1.0, 0.0, 1.0)]
    for mode, (step_s, within) in candidates.items():
        k = vanilla_s / step_s
        arms.append(ArmCalibration(mode, step_s, k, within, relative_inefficiency(between, within, k)))
    best = min(arms[1:], key=lambda a: a.inefficiency, default=None)
    figures = "; ".join(f"{a.mode}: k {a.k:.2f}, within/between {a.within / between if between else float('nan'):.2f}, "
                        f"(1 + within/between)/k {a.inefficiency:.2f}" for a in arms[1:])
    if best is not None and best.inefficiency <= 1.0 - min_gain:
        return (best.mode, f"{best.mode}: (1 + within/between)/k {best.inefficiency:.2f} <= {1 - min_gain:.2f} "
                f"({figures})", tuple(arms))
    return (VANILLA, f"no candidate reaches (1 + within/between)/k <= {1 - min_gain:.2f}: vanilla ({figures})",
            tuple(arms))


def calibrate(module: PrunedDPO, batch: PreferenceBatch, candidates: dict[str, Sequence[Any]], pairs: int = 8,
              draws: int = 4, min_gain: float = 0.1, seed: int = 0, budget_s: float | None = None) -> AutoDecision:
    """Measure ``between``, each arm's step time and each candidate's ``within`` on ``batch`` through ``module``'s
    own step, and choose (module docstring). ``candidates`` maps a mode name to its three samplers. The module's
    gradients are cleared afterwards; its weights, samplers and sampler stream are not touched (the draws use a
    generator of their own, seeded by ``seed``). With ``budget_s``, no further round of timed passes starts once
    the calibration has run that many seconds (one round always runs); the decision's ``draws`` is the rounds run.

    Raises:
        ValueError: on a batch of fewer than 2 pairs, ``pairs`` < 2, ``draws`` < 1 or a ``budget_s`` that is not > 0.
    """
    if batch.num_pairs < 2:
        raise ValueError(f"AutoPruning needs a first batch of >= 2 pairs to measure the batch's own noise, "
                         f"got {batch.num_pairs}")
    check_counts(pairs, draws, budget_s)
    if torch.autograd._profiler_enabled():  # a profiler (a CPU tensor meter too) slows what it would time
        rank_zero_warn("AutoPruning: calibrating under a running torch profiler: every timed pass is slowed by "
                       "its records, so k is not the run's; calibrate without a profiler or memory tracer")
    start = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    exact = exact_samplers()
    exact_gradient = gradient(module, batch, exact, g)  # also the untimed warm-up
    running = RunningBetween()  # one pair's gradient at a time: no stack of them in memory
    for i in range(min(pairs, batch.num_pairs)):
        running.add(gradient(module, pair(batch, i), exact, g))
    times: dict[str, list[float]] = {VANILLA: [], **{m: [] for m in candidates}}
    distances: dict[str, list[float]] = {m: [] for m in candidates}
    for _ in range(draws):  # interleaved, so that a slow spell of a shared machine hits every arm alike
        times[VANILLA].append(timed_gradient(module, batch, exact, g)[1])
        for mode, samplers in candidates.items():
            estimate, seconds = timed_gradient(module, batch, tuple(samplers), g)
            times[mode].append(seconds)
            distances[mode].append(squared_distance(estimate, exact_gradient))
            del estimate
        if budget_s is not None and time.perf_counter() - start >= budget_s:
            break
    module.zero_grad(set_to_none=True)
    rounds = len(times[VANILLA])
    measured = {m: (statistics.median(times[m]), within_variance(distances[m], batch.num_pairs)) for m in candidates}
    choice, reason, arms = decide(running.value, statistics.median(times[VANILLA]), measured, min_gain)
    if rounds < draws:
        reason += f"; budget_s {budget_s:g} reached after {rounds} of {draws} draws"
    return AutoDecision(choice, reason, running.value, arms, running.n, rounds, time.perf_counter() - start)


def check_counts(pairs: int, draws: int, budget_s: float | None) -> None:
    """Refuse ``pairs`` < 2, ``draws`` < 1 and a ``budget_s`` that is not a finite number > 0 (``None``: no budget)."""
    if pairs < 2 or draws < 1:
        raise ValueError(f"AutoPruning needs pairs >= 2 and draws >= 1, got pairs={pairs!r}, draws={draws!r}")
    if budget_s is not None and not (isinstance(budget_s, (int, float)) and math.isfinite(budget_s) and budget_s > 0):
        raise ValueError(f"AutoPruning: budget_s must be a number of seconds > 0 or null, got {budget_s!r}")


class AutoPruning(Callback):
    """Before the first optimizer step, calibrate on the first training batch and train with the pruning mode that
    the calibration picks, or with none (module docstring).

    Args:
        candidates: shipped modes (``configs/modes/<name>.yaml``) to choose from besides vanilla.
        pairs: pairs of the first batch whose exact gradients measure the batch's own noise (>= 2).
        draws: timed passes per arm, and pruned draws per candidate (>= 1).
        min_gain: a candidate is chosen only when its relative inefficiency is at most ``1 - min_gain``, in [0, 1).
        seed: seed of the calibration's own sampler draws.
        max_share: skip the calibration (and train vanilla) when its work, bounded by :func:`calibration_steps`,
            exceeds this share of the run's optimizer steps; ``None``: always calibrate.
        budget_s: wall seconds after which the calibration starts no further round of timed passes and decides on
            the rounds run (at least one); ``None`` (the default): all ``draws`` rounds.

    Raises:
        ValueError: on an unknown or repeated mode, ``vanilla`` among the candidates, a bad count or gain; at fit
            start, on more than one process, or on a module configured with pruning samplers (the callback
            chooses them).

    Example::

        trainer:
          callbacks:
            - class_path: lit_prunedpo.callbacks.AutoPruning
              init_args: {candidates: [position, antithetic]}
    """

    def __init__(self, candidates: Sequence[str] = DEFAULT_CANDIDATES, pairs: int = 8, draws: int = 4,
                 min_gain: float = 0.1, seed: int = 0, max_share: float | None = DEFAULT_MAX_SHARE,
                 budget_s: float | None = None) -> None:
        candidates = list(candidates)
        known = mode_names()
        unknown = [m for m in candidates if m not in known]
        if unknown:
            raise ValueError(f"AutoPruning: unknown candidate mode(s) {unknown}; the shipped modes are "
                             f"{', '.join(known)}")
        if VANILLA in candidates:
            raise ValueError("AutoPruning: 'vanilla' is always measured; list only pruning modes as candidates")
        if len(set(candidates)) != len(candidates):
            raise ValueError(f"AutoPruning: candidates repeat a mode: {candidates}")
        check_counts(pairs, draws, budget_s)
        if not 0.0 <= min_gain < 1.0:
            raise ValueError(f"AutoPruning: min_gain must be in [0, 1), got {min_gain!r}")
        if max_share is not None and not 0.0 < max_share <= 1.0:
            raise ValueError(f"AutoPruning: max_share must be in (0, 1] or null, got {max_share!r}")
        self.max_share = None if max_share is None else float(max_share)
        self.budget_s = None if budget_s is None else float(budget_s)
        self.candidates = candidates
        self.pairs, self.draws, self.min_gain, self.seed = int(pairs), int(draws), float(min_gain), int(seed)
        self.decision: AutoDecision | None = None
        self._applied = False

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.world_size > 1:
            raise ValueError(f"AutoPruning calibrates on one process, this run has {trainer.world_size}: run a short "
                             "single-process fit with it, then put the mode it picks into the distributed config")
        configured = (pl_module.prefix_sampler, pl_module.position_sampler, pl_module.branch_sampler)
        pruned = [f"model.{key}: {type(s).__name__}"
                  for key, s, exact in zip(_MODEL_KEYS, configured, exact_samplers(), strict=True)
                  if type(s).__name__ != type(exact).__name__]
        if pruned and not self._applied:
            raise ValueError(f"AutoPruning chooses the samplers itself, but the model is configured with "
                             f"{', '.join(pruned)}; leave them unset")

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._applied:
            return
        if self.decision is not None and self.decision.skipped:
            self._decide_again(trainer)
        if self.decision is None:
            run_steps = _estimated_steps(trainer)
            skipped = skip_reason(run_steps, self.pairs, self.draws, len(self.candidates), self.max_share)
            if skipped is not None:
                self.decision = AutoDecision(VANILLA, skipped, math.nan, (), self.pairs, self.draws, 0.0, skipped=True)
                rank_zero_info(f"AutoPruning: {skipped}")
            else:
                modes = {m: load_mode(m).samplers for m in self.candidates}
                self.decision = calibrate(pl_module, batch, modes, self.pairs, self.draws, self.min_gain, self.seed,
                                          self.budget_s)
                rank_zero_info(f"AutoPruning: chose {self.decision.choice} in {self.decision.calibration_s:.1f} s of "
                               f"calibration on {self.decision.pairs} pairs x {self.decision.draws} draws: "
                               f"{self.decision.reason}")
        elif not self.decision.skipped:
            rank_zero_info(f"AutoPruning: resumed with {self.decision.choice} (calibrated before: "
                           f"{self.decision.reason})")
        if self.decision.choice != VANILLA:
            pl_module.use_samplers(*load_mode(self.decision.choice).samplers)
        self._applied = True
        metrics = {"auto/calibration_s": self.decision.calibration_s}
        if self.decision.arms:
            metrics["auto/between"] = self.decision.between
        for arm in self.decision.arms[1:]:
            metrics.update({f"auto/{arm.mode}/k": arm.k, f"auto/{arm.mode}/inefficiency": arm.inefficiency})
        metrics["auto/pruned"] = float(self.decision.choice != VANILLA)
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=batch.num_pairs)

    def _decide_again(self, trainer: pl.Trainer) -> None:
        """A resumed run whose earlier part skipped the calibration: the steps left now may repay one."""
        run_steps = _estimated_steps(trainer)
        left = None if run_steps is None else run_steps - trainer.global_step
        again = skip_reason(left, self.pairs, self.draws, len(self.candidates), self.max_share)
        if again is None:
            rank_zero_info(f"AutoPruning: resumed at step {trainer.global_step} with {left} steps left, enough to "
                           "repay a calibration (skipped before: too short a run): calibrating now")
            self.decision = None
        else:
            self.decision = dataclasses.replace(self.decision, reason=again)
            rank_zero_info(f"AutoPruning: resumed at step {trainer.global_step}, still vanilla: {again}")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._applied and self.decision is not None and self.decision.choice != VANILLA:
            pl_module.use_samplers(*exact_samplers())  # leave the module as configured (e.g. for a second fit)
        self._applied = False

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"decision": None if self.decision is None else self.decision.as_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        decision = state_dict.get("decision")
        self.decision = None if decision is None else AutoDecision.from_dict(decision)


def _estimated_steps(trainer: pl.Trainer) -> int | None:
    """The run's optimizer steps: Lightning's estimate (``max_steps``, or epochs x batches when that is fewer)."""
    try:
        steps = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - no estimate (e.g. an iterable without a length): calibrate
        return None
    return int(steps) if math.isfinite(steps) else None
