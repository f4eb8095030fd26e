"""Train every arm and seed of a study, interleaved, with honest clocks and exact held-out evaluation.

A :class:`Run` is one (arm, seed): a real :class:`~lit_prunedpo.PrunedDPO` (its own ``step``, the one
``training_step`` runs in ``lit-prunedpo fit``), AdamW at the arm's learning rate, the package's
``WarmupCosineLR`` (the quickstart's schedule: linear warm-up over the task's ``warmup_steps``, then cosine
decay to 0 over the arm's ``schedule_steps``; constant after the warm-up when the arm has none), and the data
module's length-grouped training order seeded by the run's seed.
The Lightning Trainer is not used: its loop would interleave logging and validation with the timed work,
and it cannot hand the processor to another run between two steps. What differs from ``fit``: a time
budget has no step count known in advance, so the study's command sets ``schedule_steps`` from a measured
cost per step (:mod:`lit_prunedpo.study.calibrate`); no gradient clipping (the quickstart uses none).

Clocks. Only the training steps are timed (plan, execute, estimate, backward, optimizer), by the wall clock
(``time.perf_counter``) and the process's CPU clock (``time.process_time``); evaluation is timed apart and
never counts. With one torch thread, CPU seconds are the work the step did, and barely move when other
processes share the cores, while wall seconds do: the budget is enforced on one of the two (``clock``), both
are recorded. On a GPU (``device``) only the wall clock means the step's work: the CPU clock counts the host's
launches and waits, so a CUDA study must run on ``clock="wall"``, and each timed step starts and ends with
``torch.cuda.synchronize`` (the kernels it queued are inside its time, none of the next step's are:
:mod:`lit_prunedpo.study.devices`). Runs advance in turns of ``turn_steps`` steps (default 1), round-robin over arms
and seeds, so that every arm is timed in the same minutes and load drifting on a shared machine hits every arm alike;
each run keeps the load it was timed under (:mod:`lit_prunedpo.study.turns`).

Evaluation is the module's exact, unpruned objective (every position of both whole responses) on every
held-out pair, at fixed points of the training clock (``k * budget / evals``) and of the step count
(``k * steps / evals``): one run serves the same-time and the same-steps comparisons. A run ends when it has
passed both the time budget and the step budget.

An arm fitted to a memory budget (:mod:`lit_prunedpo.study.memory`) runs the same step with the chunked scorer,
the policy's gradient checkpointing and/or gradient accumulation over micro-batches. A run given a ``meter``
(the calibration's) records each step's peak memory above the step's start (``step_peak_mb``); the meter starts
and stops outside the timed work.

Every evaluation can be handed to ``on_point`` and every finished run to ``on_done`` as they happen (the
command appends them to ``progress.jsonl``, so a study stopped late keeps what it measured).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader

from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.bench.load import load_record
from lit_prunedpo.callbacks import PeakMemoryMeter
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo.models import ModelSource
from lit_prunedpo.optim import WarmupCosineLR
from lit_prunedpo.plan import exact_samplers
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo.study.arms import Arm
from lit_prunedpo.study.devices import check_clock_on, study_device, synchronize
from lit_prunedpo.study.memory import accumulate
from lit_prunedpo.study.tasks import StudyTask
from lit_prunedpo.study.turns import Clock, events, round_robin
from lit_prunedpo.study.warm_start import warm_start

#: The precisions a run trains and evaluates in, with Lightning's meaning: float32 parameters, and each step's forward
#: (the module's ``step``: forwards, scoring, loss) under autocast to this dtype (None: float32 throughout). The
#: backward and the optimizer run outside it, as Lightning's ``MixedPrecision`` plugin runs them. ``bf16-true`` is not
#: offered: AdamW on bfloat16 weights rounds away the short runs' small updates (lr 1e-5 of a weight near 1).
PRECISIONS: dict[str, torch.dtype | None] = {"32-true": None, "bf16-mixed": torch.bfloat16}


def forward_precision(module: torch.nn.Module, precision: str) -> contextlib.AbstractContextManager:
    """The context a step's forward runs in at ``precision`` on ``module``'s device (:data:`PRECISIONS`)."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    device = next(module.parameters()).device
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


@dataclass
class Point:
    """One exact evaluation: where the run stood and what it scored on the held-out pairs."""

    step: int
    wall_s: float
    cpu_s: float
    loss: float
    accuracy: float
    grids: list[str]  # the grid points it stands for: "time" / "steps", repeated if one step passed several


@dataclass
class Run:
    """One arm trained from one seed's initial weights. Build with :func:`make_run`."""

    arm: Arm
    seed: int
    module: PrunedDPO
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: DataLoader
    step: int = 0
    epoch: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    eval_wall_s: float = 0.0
    step_wall: list[float] = field(default_factory=list)
    step_cpu: list[float] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    initial_checksum: float = 0.0
    exact_after_s: float | None = None  # training seconds (on `clock`) after which the samplers are exact
    clock_name: Clock = "cpu"
    diverged: bool = False  # a non-finite training loss stopped the run (only with ``stop_on_nonfinite``)
    warm_start: dict[str, Any] | None = None  # the seed's warm-start record (its cost is not in this run's clocks)
    meter: PeakMemoryMeter | None = None  # measures each step's peak memory (the calibration's runs only)
    step_peak_mb: list[float] = field(default_factory=list)  # per step, MiB above the step's start
    loadavg: list[float | None] = field(default_factory=list)  # the 1-minute load average at each of its turns
    turn_steps: int | None = 1  # steps per turn of the schedule it ran in (:mod:`lit_prunedpo.study.turns`)
    precision: str = "32-true"  # a key of PRECISIONS: the forward's autocast, in training and evaluation
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # the module's and its batches'
    _configured: tuple | None = None
    _batches: Iterator[PreferenceBatch] | None = None

    def clock(self, which: Clock) -> float:
        return self.cpu_s if which == "cpu" else self.wall_s

    def _next_batch(self) -> PreferenceBatch:
        if self._batches is None:
            self.loader.sampler.set_epoch(self.epoch)
            self._batches = iter(self.loader)
        try:
            batch = next(self._batches)
            return batch if self.device.type == "cpu" else batch.to(self.device)
        except StopIteration:
            self.epoch += 1
            self._batches = None
            return self._next_batch()

    def train_step(self) -> None:
        """One timed training step; fetching the batch is not timed (it is the same work for every arm)."""
        batch = self._next_batch()
        module = self.module
        if self.exact_after_s is not None:
            configured = (module.prefix_sampler, module.position_sampler, module.branch_sampler)
            self._configured = self._configured or configured
            exact = self.clock(self.clock_name) >= self.exact_after_s
            module.use_samplers(*(exact_samplers() if exact else self._configured))
        if self.meter is not None:
            self.meter.start()
        synchronize(self.device)
        wall, cpu = time.perf_counter(), time.process_time()
        if self.arm.micro_batches > 1:
            with forward_precision(module, self.precision):  # each micro-batch's backward runs inside it too
                objective = accumulate(module, batch, self.arm.micro_batches)
        else:
            with forward_precision(module, self.precision):
                objective = module.step(batch).estimate.objective
            objective.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        synchronize(self.device)
        dw, dc = time.perf_counter() - wall, time.process_time() - cpu
        if self.meter is not None:
            reading = self.meter.stop()
            if reading is not None:
                self.step_peak_mb.append(reading.above_start / 2**20)
        if not torch.isfinite(objective):
            raise FloatingPointError(f"study run {self.arm.name} seed {self.seed}: non-finite loss at step {self.step}")
        self.wall_s += dw
        self.cpu_s += dc
        self.step_wall.append(dw)
        self.step_cpu.append(dc)
        self.step += 1

    def evaluate(self, batches: Sequence[PreferenceBatch], grids: list[str]) -> Point:
        """The exact held-out objective now (not timed as training)."""
        start = time.perf_counter()
        loss, accuracy = exact_eval(self.module, batches, self.precision)
        self.eval_wall_s += time.perf_counter() - start
        point = Point(self.step, self.wall_s, self.cpu_s, loss, accuracy, grids)
        self.points.append(point)
        return point

    def on_grid(self, grid: str) -> list[Point]:
        """The evaluations standing for the points of ``grid`` (step 0 first), one per grid point."""
        return [p for p in self.points for g in p.grids if g == grid]

    def summary(self) -> dict[str, Any]:
        steps = max(1, len(self.step_cpu))
        return {
            "arm": self.arm.name, "mode": self.arm.mode, "batch_size": self.arm.batch_size, "matched": self.arm.matched,
            "cost_matched": self.arm.cost_matched, "memory_fitted": self.arm.memory_fitted, "fit": self.arm.fit,
            "micro_batches": self.arm.micro_batches, "precision": self.precision, "device": str(self.device),
            "lr": self.optimizer.param_groups[0]["initial_lr"],
            "schedule_steps": self.arm.schedule_steps, "diverged": self.diverged, "seed": self.seed, "steps": self.step,
            "train_wall_s": self.wall_s, "train_cpu_s": self.cpu_s,
            "eval_wall_s": self.eval_wall_s,
            "median_step_wall_s": sorted(self.step_wall)[steps // 2] if self.step_wall else None,
            "median_step_cpu_s": sorted(self.step_cpu)[steps // 2] if self.step_cpu else None,
            "initial_weights_checksum": self.initial_checksum,
            "warm_start": None if self.warm_start is None else {k: v for k, v in self.warm_start.items()
                                                                if k not in ("losses", "trained_rows")},
            "points": [vars(p) for p in self.points],
            "load": load_record(self.wall_s, self.cpu_s, self.loadavg, torch.get_num_threads(), self.turn_steps),
        }


def weights_checksum(model: torch.nn.Module) -> float:
    """A number that changes with any weight (sum of |w| weighted by position): the same-init check."""
    total = 0.0
    for i, p in enumerate(model.parameters()):
        total += float(p.detach().double().abs().sum()) * (i + 1)
    return total


@torch.no_grad()
def exact_eval(module: PrunedDPO, batches: Sequence[PreferenceBatch],
               precision: str = "32-true") -> tuple[float, float]:
    """Mean exact DPO loss and accuracy over every pair of ``batches``: the module's own validation computation
    (:meth:`PrunedDPO.exact_pair_metrics`), averaged over pairs, at ``precision`` (as Lightning validates)."""
    was_training = module.training
    module.eval()
    losses, hits, pairs = 0.0, 0.0, 0
    device = next(module.parameters()).device
    try:
        for batch in batches:
            batch = batch if device.type == "cpu" else batch.to(device)
            with forward_precision(module, precision):
                metrics = module.exact_pair_metrics(batch)
            losses += float(metrics["loss"].sum())
            hits += float(metrics["rewards/accuracies"].sum())
            pairs += batch.num_pairs
    finally:
        module.train(was_training)
    return losses / pairs, hits / pairs


def make_run(task: StudyTask, arm: Arm, seed: int, dm: PreferenceDataModule, budget_s: float | None = None,
             clock: Clock = "cpu", policy: ModelSource | None = None, precision: str = "32-true",
             device: str | torch.device = "cpu") -> Run:
    """A fresh run: the task's initial weights for ``seed`` (the same for every arm; ``policy`` overrides them,
    e.g. a warm start), the arm's samplers and batch size, a training order and sampler stream seeded by
    ``seed``. The reference is the initial policy. The learning rate is the arm's (the task's if it has none),
    the schedule spans the arm's ``schedule_steps``. An arm with a ``prune_fraction`` needs the ``budget_s``
    it is a fraction of. ``precision``: a key of :data:`PRECISIONS`. ``device``: where the module (policy and
    reference) trains and its batches go (:func:`study_device`).

    Raises:
        ValueError: a pruning fraction without ``budget_s``, an unknown ``precision`` (naming the choices), or a
            device this machine does not have.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision: a study run trains in one of {', '.join(PRECISIONS)}, got {precision!r}")
    if arm.prune_fraction is not None and budget_s is None:
        raise ValueError(f"arm {arm.name} prunes for a fraction of the budget: make_run needs budget_s")
    dev = study_device(device)
    prefix, position, branch = arm.samplers()
    module = PrunedDPO(
        policy=policy if policy is not None else task.policy(seed), beta=0.1, prefix_sampler=prefix,
        position_sampler=position, branch_sampler=branch,
        scorer=ChunkedScorer() if arm.chunked else None, gradient_checkpointing=arm.checkpointing,
        optimizer=partial(torch.optim.AdamW, lr=arm.lr if arm.lr is not None else task.lr, weight_decay=0.0),
    )
    module.run_state.sampler_rng = SamplerRNG(seed=seed)
    module.to(dev).train()  # before the optimizer is built: it holds the parameters where they train
    optimizer = module.configure_optimizers()
    scheduler = WarmupCosineLR(optimizer, warmup_steps=task.warmup_steps, total_steps=arm.schedule_steps)
    data = copy.copy(dm)  # the same tokenized splits; only the batch size and the order's seed differ
    data.batch_size, data.seed = arm.batch_size, seed
    run = Run(arm, seed, module, optimizer, scheduler, data.train_dataloader())
    run.initial_checksum = weights_checksum(module.policy)
    run.clock_name, run.precision, run.device = clock, precision, dev
    if arm.prune_fraction is not None:
        run.exact_after_s = arm.prune_fraction * budget_s
    return run


def eval_batches(dm: PreferenceDataModule, max_pairs: int | None = None) -> list[PreferenceBatch]:
    """The held-out batches every evaluation runs: all of them, or whole batches up to ``max_pairs`` pairs.

    Raises:
        ValueError: if ``max_pairs`` < 1 or no held-out pair is left.
    """
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_eval_pairs must be >= 1 (or None: all), got {max_pairs!r}")
    kept, total = [], 0
    for batch in dm.val_dataloader():
        if max_pairs is not None and total >= max_pairs:
            break
        kept.append(batch)
        total += batch.num_pairs
    if total == 0:
        raise ValueError("the study needs held-out pairs to evaluate on, and the data module's validation split has "
                         "none")
    return kept


def train_arms(
    task: StudyTask,
    arms: Sequence[Arm],
    seeds: Sequence[int],
    budget_s: float | None,
    steps: int | Callable[[Arm], int],
    evals: int,
    clock: Clock = "cpu",
    work_dir: Path | str = ".",
    max_eval_pairs: int | None = None,
    dm: PreferenceDataModule | None = None,
    log: Callable[[str], None] | None = None,
    on_point: Callable[[Run, Point], None] | None = None,
    on_done: Callable[[Run], None] | None = None,
    stop_on_nonfinite: bool = False,
    turn_steps: int | None = 1,
    precision: str = "32-true",
    device: str | torch.device = "cpu",
) -> list[Run]:
    """Train every (arm, seed) round-robin until each has passed ``budget_s`` training seconds on ``clock``
    and ``steps`` steps, evaluating exactly at step 0 and at ``evals`` points of each grid. ``budget_s`` None:
    steps only (the epoch-matched comparison); ``steps`` may be a function of the arm (a step count per arm). With
    ``task.warm_start_steps`` > 0 every seed first gets its warm start (:mod:`lit_prunedpo.study.warm_start`,
    cached under ``work_dir``), which all of that seed's arms start from, policy and reference alike.

    ``on_point(run, point)`` is called after every evaluation and ``on_done(run)`` when a run is finished.
    With ``stop_on_nonfinite`` a run whose training loss turns non-finite stops there, marked ``diverged``
    (the learning-rate sweep), instead of stopping the study with ``FloatingPointError``.
    ``turn_steps``: steps each run trains per turn (None: a whole evaluation interval, the schedule before
    :mod:`lit_prunedpo.study.turns`, whose ratios moved with the machine's load). ``precision``: every run's
    (:data:`PRECISIONS`). ``device``: where every run trains and evaluates (:func:`study_device`; a CUDA device
    needs ``clock="wall"``).

    Raises:
        ValueError: on an empty arm or seed list, repeated seeds, a non-positive budget, step or eval count,
            no held-out pair to evaluate on, a device this machine does not have, or the CPU clock on a GPU.
    """
    steps_of = steps if callable(steps) else (lambda arm: steps)
    _check_study(arms, seeds, budget_s, steps_of, evals, clock, turn_steps)
    check_clock_on(study_device(device), clock)
    log = log or (lambda line: None)
    dm = dm if dm is not None else task.datamodule(Path(work_dir))
    batches = eval_batches(dm, max_eval_pairs)
    sources: dict[int, ModelSource | None] = {seed: None for seed in seeds}
    records: dict[int, dict[str, Any] | None] = dict(sources)
    if task.warm_start_steps > 0:
        for seed in seeds:
            sources[seed], records[seed] = warm_start(task, seed, dm, work_dir, task.warm_start_steps,
                                                      lr=task.warm_start_lr, log=log)
    runs = [make_run(task, arm, seed, dm, budget_s, clock, policy=sources[seed], precision=precision, device=device)
            for seed in seeds for arm in arms]
    for run in runs:
        run.warm_start, run.turn_steps = records[run.seed], turn_steps
    grids = {id(r): events(budget_s, steps_of(r.arm), evals) for r in runs}
    for run in runs:
        point = run.evaluate(batches, ["time", "steps"])
        if on_point is not None:
            on_point(run, point)
    round_robin(runs, grids, clock, batches, stop_on_nonfinite, log, on_point, on_done, turn_steps)
    return runs


def _check_study(arms: Sequence[Arm], seeds: Sequence[int], budget_s: float | None, steps_of: Callable[[Arm], int],
                 evals: int, clock: Clock, turn_steps: int | None = 1) -> None:
    """:func:`train_arms`'s arguments checked.

    Raises:
        ValueError: on an empty arm or seed list, repeated seeds, a non-positive budget, step or eval count, an
            unknown clock or steps per turn that are not a positive integer (or None).
    """
    if turn_steps is not None and not (isinstance(turn_steps, int) and turn_steps >= 1):
        raise ValueError("turn_steps must be an integer >= 1 (or None: a whole evaluation interval), got "
                         f"{turn_steps!r}")
    if not arms or not seeds:
        raise ValueError("a study needs at least one arm and one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must differ, got {list(seeds)}")
    for name, value in (("budget_s", budget_s), *((f"steps of {a.name}", steps_of(a)) for a in arms), ("evals", evals)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' or 'wall', got {clock!r}")

