"""The study's arms: a pruning mode (the three samplers, as in the shipped configs) and a batch size.

Modes are the shipped overlays ``configs/modes/<mode>.yaml``, loaded by :mod:`lit_prunedpo.modes`, so that a
study's verdict applies to the configs a user runs: ``vanilla``, ``branch``, ``antithetic``, ``sequence``,
``position`` (the default position mode: coupled stratified draws scoring only the log-sum-exp, every target logit
exact), ``position-bernoulli`` (the paper's Bernoulli positions), ``all``, and the coupled variants
``position-coupled``, ``stratified-coupled`` and ``all-coupled`` (the position draw shared by a pair's two branches:
common random numbers, same inclusion probabilities), and ``stratified-coupled-exact-targets`` (``position`` without its
fallback for heads that cannot give one row:
:class:`~lit_prunedpo.samplers.ExactTargetLogits`). Runs recorded before 2026-12-03 name the Bernoulli design
``position``. The study's reference is online, so
``stratified-coupled-reference-lse`` (a cached reference's control variate) is not a study mode.

An arm is ``same-batch`` (the task's batch), ``compute-matched``: a pruned mode with the batch enlarged by the
FLOP cost model's ideal speedup of the mode on the task's own batches (:func:`matched_batch_size`), so that one
step costs what a vanilla step costs and the arm sees more pairs per second of compute instead of taking more
steps; or ``cost-matched``: the control every pruned mode must beat, vanilla with its batch *shrunk* so that
one step costs what the pruned step costs (chosen from measured step costs, :mod:`lit_prunedpo_lab.study.calibrate`).

An arm can also be *fitted to a memory budget* (:mod:`lit_prunedpo_lab.study.memory`): the same exact step run with the
chunked scorer, activation checkpointing and/or gradient accumulation over ``micro_batches`` micro-batches;
``memory_fitted`` marks the memory-fitted vanilla control.

An arm also carries its own learning rate (the sweep's choice, :mod:`lit_prunedpo_lab.study.sweep`) and the step
count its warm-up-then-cosine schedule spans (``schedule_steps``).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench import cost
from lit_prunedpo.modes import Samplers, samplers_of
from lit_prunedpo.step.plan import plan_step

#: The study's modes (names of shipped overlays), in the order its reports list them; each value returns new
#: sampler objects.
STUDY_MODES = ("vanilla", "branch", "antithetic", "sequence", "position", "position-bernoulli", "all",
               "position-coupled", "stratified-coupled", "all-coupled", "stratified-coupled-exact-targets")
MODES: dict[str, Callable[[], Samplers]] = {name: functools.partial(samplers_of, name) for name in STUDY_MODES}


@dataclass(frozen=True)
class Arm:
    """One configuration of the study: a mode at a batch size.

    Attributes:
        mode: a key of :data:`MODES`.
        batch_size: pairs per training step.
        matched: True for the compute-matched arm (batch enlarged to a vanilla step's cost).
        prune_fraction: prune only during this share of the time budget, then train exactly (the study's
            version of ``lit_prunedpo.callbacks.PruneEarly``, on the training clock instead of steps); ``None``
            prunes throughout.
        cost_matched: True for a cost-matched vanilla arm (batch shrunk to a pruned step's cost).
        lr: the AdamW learning rate; ``None``: the task's.
        schedule_steps: the steps the warm-up-then-cosine schedule decays over (``WarmupCosineLR``'s
            ``total_steps``); ``None``: constant after the warm-up.
        chunked: score with :class:`~lit_prunedpo.chunked_scorer.ChunkedScorer` (no ``K x V`` logits).
        checkpointing: the policy's gradient checkpointing (``PrunedDPO(gradient_checkpointing=True)``).
        micro_batches: split each step's batch into this many micro-batches, gradients accumulated (same step).
        memory_fitted: True for the memory-fitted vanilla control (vanilla at the task's batch, fitted to a budget).
        settings: ``(argument, value)`` pairs that replace the mode's sampler arguments (a point of the sampling-ratio
            grid, e.g. ``(("rate", 0.125),)`` on ``stratified-coupled``): each names a constructor argument of
            exactly one of the mode's three samplers.
    """

    mode: str
    batch_size: int
    matched: bool = False
    prune_fraction: float | None = None
    cost_matched: bool = False
    lr: float | None = None
    schedule_steps: int | None = None
    chunked: bool = False
    checkpointing: bool = False
    micro_batches: int = 1
    memory_fitted: bool = False
    settings: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose from {','.join(MODES)}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r}")
        if self.prune_fraction is not None and not 0.0 <= self.prune_fraction <= 1.0:
            raise ValueError(f"prune_fraction must be in [0, 1], got {self.prune_fraction!r}")
        if self.cost_matched and self.mode != "vanilla":
            raise ValueError(f"a cost-matched arm is a vanilla arm, got mode {self.mode!r}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.schedule_steps is not None and self.schedule_steps < 1:
            raise ValueError(f"schedule_steps must be >= 1, got {self.schedule_steps!r}")
        if not 1 <= self.micro_batches <= self.batch_size:
            raise ValueError(f"micro_batches must be in [1, batch_size={self.batch_size}], got {self.micro_batches!r}")
        if self.memory_fitted and self.mode != "vanilla":
            raise ValueError(f"a memory-fitted control is a vanilla arm, got mode {self.mode!r}")
        if self.settings:
            self.samplers()  # an argument no sampler of the mode takes, or a value it refuses, fails here

    @property
    def name(self) -> str:
        early = f" then exact after {self.prune_fraction:g}" if self.prune_fraction is not None else ""
        kind = " (matched)" if self.matched else " (cost-matched)" if self.cost_matched else ""
        kind += " (memory-fitted)" if self.memory_fitted else ""
        fit = f" [{self.fit}]" if self.fit != "as is" else ""
        return f"{self.design}@{self.batch_size}{early}{fit}{kind}"

    @property
    def design(self) -> str:
        """The mode and its replaced sampler arguments, e.g. ``stratified-coupled:rate=0.125``."""
        return self.mode + (":" + ",".join(f"{k}={v:g}" for k, v in self.settings) if self.settings else "")

    @property
    def fit(self) -> str:
        """How the step is fitted to a memory budget, in words: ``"as is"`` or e.g.
        ``"chunked scorer + accumulation x2"``."""
        parts = (["chunked scorer"] if self.chunked else []) + (["checkpointing"] if self.checkpointing else [])
        parts += [f"accumulation x{self.micro_batches}"] if self.micro_batches > 1 else []
        return " + ".join(parts) or "as is"

    def samplers(self) -> Samplers:
        return with_settings(MODES[self.mode](), self.settings, self.mode)


def _arguments(sampler: object) -> dict[str, object]:
    """A sampler's constructor arguments, read back from the attributes of the same names."""
    names = [n for n in inspect.signature(type(sampler).__init__).parameters if n != "self"]
    return {n: getattr(sampler, n) for n in names if hasattr(sampler, n)}


def _settable(sampler: object) -> list[str]:
    """The arguments a setting can name: the sampler's own and those of the samplers it wraps (a control variate's
    ``positions``), a wrapped sampler itself excluded."""
    names = []
    for name, value in _arguments(sampler).items():
        names.extend(_settable(value) if hasattr(value, "draw") else [name])
    return names


def _with_argument(sampler: object, name: str, value: float) -> object:
    """``sampler`` rebuilt with ``name`` set, in itself or in the sampler it wraps that takes it."""
    arguments = _arguments(sampler)
    if name not in arguments:
        arguments = {k: _with_argument(v, name, value) if hasattr(v, "draw") and name in _settable(v) else v
                     for k, v in arguments.items()}
    else:
        arguments[name] = value
    return type(sampler)(**arguments)


def with_settings(samplers: Samplers, settings: Iterable[tuple[str, float]], mode: str = "the mode") -> Samplers:
    """``samplers`` rebuilt with ``settings`` replacing constructor arguments (new objects, validated by the
    samplers' own constructors); an argument of a wrapped sampler (``position``'s ``rate``) counts as its wrapper's.

    Raises:
        ValueError: for an argument that none, or more than one, of the three samplers takes.
    """
    rebuilt = list(samplers)
    for name, value in settings:
        owners = [i for i, s in enumerate(rebuilt) if name in _settable(s)]
        if len(owners) != 1:
            takes = "; ".join(f"{type(s).__name__}: {', '.join(_settable(s)) or 'no arguments'}" for s in rebuilt)
            raise ValueError(f"sampler argument {name!r} "
                             f"{'is taken by no' if not owners else 'is ambiguous among the'} samplers of {mode} "
                             f"({takes})")
        rebuilt[owners[0]] = _with_argument(rebuilt[owners[0]], name, value)
    return tuple(rebuilt)  # type: ignore[return-value]


def ideal_speedup(mode: str, batches: Iterable[PreferenceBatch], dims: cost.ModelDims, seed: int = 0) -> float:
    """The cost model's ``flops(vanilla) / flops(mode)`` over ``batches`` (online reference, plain scorer)."""
    g = torch.Generator().manual_seed(seed)
    vanilla, pruned = [], []
    for batch in batches:
        vanilla.append(cost.step_flops(plan_step(batch, *MODES["vanilla"](), g), dims))
        pruned.append(cost.step_flops(plan_step(batch, *MODES[mode](), g), dims))
    return cost.ideal_speedup(vanilla, pruned)


def matched_batch_size(batch_size: int, speedup: float) -> int:
    """The batch whose pruned step costs about a vanilla step of ``batch_size`` pairs (rounded, >= batch_size)."""
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup!r}")
    return max(batch_size, round(batch_size * speedup))
