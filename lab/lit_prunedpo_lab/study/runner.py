"""Train every arm and seed of a study, interleaved, with honest clocks and exact held-out evaluation.

A :class:`Run` is one (arm, seed): a real :class:`~lit_prunedpo.PrunedDPO` (its own ``step``, the one
``training_step`` runs in ``lit-prunedpo fit``), AdamW at the arm's learning rate, the package's
``WarmupCosineLR`` (the quickstart's schedule: linear warm-up over the task's ``warmup_steps``, then cosine
decay to 0 over the arm's ``schedule_steps``; constant after the warm-up when the arm has none), and the data
module's length-grouped training order seeded by the run's seed.
The Lightning Trainer is not used: its loop would interleave logging and validation with the timed work,
and it cannot hand the processor to another run between two steps. What differs from ``fit``: a time
budget has no step count known in advance, so the study's command sets ``schedule_steps`` from a measured
cost per step (:mod:`lit_prunedpo_lab.study.calibrate`); no gradient clipping (the quickstart uses none).

Clocks. Only the training steps are timed (plan, execute, estimate, backward, optimizer), by the wall clock
(``time.perf_counter``) and the process's CPU clock (``time.process_time``); evaluation is timed apart and
never counts. With one torch thread, CPU seconds are the work the step did, and barely move when other
processes share the cores, while wall seconds do: the budget is enforced on one of the two (``clock``), both
are recorded. On a GPU (``device``) only the wall clock means the step's work: the CPU clock counts the host's
launches and waits, so a CUDA study must run on ``clock="wall"``, and each timed step starts and ends with
``torch.cuda.synchronize`` (the kernels it queued are inside its time, none of the next step's are:
:mod:`lit_prunedpo_lab.study.devices`). Runs advance in turns of ``turn_steps`` steps (default 1), round-robin over arms
and seeds, so that every arm is timed in the same minutes and load drifting on a shared machine hits every arm alike;
each run keeps the load it was timed under (:mod:`lit_prunedpo_lab.study.turns`).

Evaluation is the module's exact, unpruned objective (every position of both whole responses) on every
held-out pair, at fixed points of the training clock (``k * budget / evals``) and of the step count
(``k * steps / evals``): one run serves the same-time and the same-steps comparisons. A run ends when it has
passed both the time budget and the step budget.

An arm fitted to a memory budget (:mod:`lit_prunedpo_lab.study.memory`) runs the same step with the chunked scorer,
the policy's gradient checkpointing and/or gradient accumulation over micro-batches. A run given a ``meter``
(the calibration's) records each step's peak memory above the step's start (``step_peak_mb``); the meter starts
and stops outside the timed work.

Every evaluation can be handed to ``on_point`` and every finished run to ``on_done`` as they happen (the
command appends them to ``progress.jsonl``, so a study stopped late keeps what it measured).
"""

from __future__ import annotations

import copy
import gc
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader

from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench.load import load_record
from lit_prunedpo.callbacks import PeakMemoryMeter
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo.models import ModelSource
from lit_prunedpo.optim import WarmupCosineLR
from lit_prunedpo.step.plan import exact_samplers
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.devices import (PRECISIONS, available_bytes, check_clock_on, check_runs_fit,
                                            forward_precision, study_device, synchronize, training_state_bytes)
from lit_prunedpo_lab.study.evaluation import eval_batches, exact_eval
from lit_prunedpo_lab.study.memory import accumulate
from lit_prunedpo_lab.study.tasks import StudyTask
from lit_prunedpo_lab.study.turns import Clock, events, round_robin
from lit_prunedpo_lab.study.warm_start import warm_start

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
    turn_steps: int | None = 1  # steps per turn of the schedule it ran in (:mod:`lit_prunedpo_lab.study.turns`)
    precision: str = "32-true"  # a key of PRECISIONS: the forward's autocast, in training and evaluation
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # the module's and its batches'
    _configured: tuple | None = None
    _lr: float | None = None  # kept by release()
    _batches: Iterator[PreferenceBatch] | None = None

    def clock(self, which: Clock) -> float:
        return self.cpu_s if which == "cpu" else self.wall_s

    @property
    def lr(self) -> float:
        """The learning rate the run trains at (its schedule's base)."""
        return self._lr if self._lr is not None else self.optimizer.param_groups[0]["initial_lr"]

    def release(self) -> None:
        """Drop the model, optimizer and data of a finished run; its record (points, clocks, summary) stays. A study
        that trains its seeds a few at a time keeps only the runs training together in memory."""
        self._lr = self.lr
        self.module = self.optimizer = self.scheduler = self.loader = self._batches = None  # type: ignore[assignment]

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
            "lr": self.lr,
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
    seeds_at_once: int | None = None,
) -> list[Run]:
    """Train every (arm, seed) round-robin until each has passed ``budget_s`` training seconds on ``clock``
    and ``steps`` steps, evaluating exactly at step 0 and at ``evals`` points of each grid. ``budget_s`` None:
    steps only (the epoch-matched comparison); ``steps`` may be a function of the arm (a step count per arm). With
    ``task.warm_start_steps`` > 0 every seed first gets its warm start (:mod:`lit_prunedpo_lab.study.warm_start`,
    cached under ``work_dir``), which all of that seed's arms start from, policy and reference alike.

    ``on_point(run, point)`` is called after every evaluation and ``on_done(run)`` when a run is finished.
    With ``stop_on_nonfinite`` a run whose training loss turns non-finite stops there, marked ``diverged``
    (the learning-rate sweep), instead of stopping the study with ``FloatingPointError``.
    ``turn_steps``: steps each run trains per turn (None: a whole evaluation interval, the schedule before
    :mod:`lit_prunedpo_lab.study.turns`, whose ratios moved with the machine's load). ``precision``: every run's
    (:data:`PRECISIONS`). ``device``: where every run trains and evaluates (:func:`study_device`; a CUDA device
    needs ``clock="wall"``). ``seeds_at_once``: train the seeds in groups of this many, one group after another, each
    finished run released (its record kept): the memory of ``len(arms) * seeds_at_once`` runs instead of all of them;
    the arms of a seed still alternate step by step, so a pruned arm and the vanilla arms it is judged against are
    timed in the same minutes (None: every seed at once).

    Raises:
        ValueError: on an empty arm or seed list, repeated seeds, a non-positive budget, step or eval count,
            no held-out pair to evaluate on, a device this machine does not have, or the CPU clock on a GPU.
    """
    steps_of = steps if callable(steps) else (lambda arm: steps)
    _check_study(arms, seeds, budget_s, steps_of, evals, clock, turn_steps, seeds_at_once)
    check_clock_on(study_device(device), clock)
    log = log or (lambda line: None)
    dm = dm if dm is not None else task.datamodule(Path(work_dir))
    batches = eval_batches(dm, max_eval_pairs)
    together = dict(task=task, arms=arms, budget_s=budget_s, steps_of=steps_of, evals=evals, clock=clock,
                    work_dir=work_dir, dm=dm, batches=batches, log=log, on_point=on_point, on_done=on_done,
                    stop_on_nonfinite=stop_on_nonfinite, turn_steps=turn_steps, precision=precision, device=device)
    if seeds_at_once is None:
        return _train_together(seeds=list(seeds), **together)
    runs: list[Run] = []
    for first in range(0, len(seeds), seeds_at_once):
        group = _train_together(seeds=list(seeds[first:first + seeds_at_once]), **together)
        for run in group:
            run.release()
        gc.collect()  # the released models' reference cycles, before the next group's are built
        runs += group
    return runs


def _train_together(task: StudyTask, arms: Sequence[Arm], seeds: list[int], budget_s: float | None,
                    steps_of: Callable[[Arm], int], evals: int, clock: Clock, work_dir: Path | str,
                    dm: PreferenceDataModule, batches: list[PreferenceBatch], log: Callable[[str], None],
                    on_point: Callable[[Run, Point], None] | None, on_done: Callable[[Run], None] | None,
                    stop_on_nonfinite: bool, turn_steps: int | None, precision: str,
                    device: str | torch.device) -> list[Run]:
    """:func:`train_arms` for ``seeds`` all at once: their warm starts, every (arm, seed) run, the step-0
    evaluations, then the round-robin schedule."""
    sources: dict[int, ModelSource | None] = {seed: None for seed in seeds}
    records: dict[int, dict[str, Any] | None] = dict(sources)
    if task.warm_start_steps > 0:
        for seed in seeds:
            sources[seed], records[seed] = warm_start(task, seed, dm, work_dir, task.warm_start_steps,
                                                      lr=task.warm_start_lr, log=log)
    pairs = [(arm, seed) for seed in seeds for arm in arms]
    runs = [make_run(task, *pairs[0], dm, budget_s, clock, policy=sources[pairs[0][1]], precision=precision,
                     device=device)]
    free = available_bytes(runs[0].device)  # measured with the first run built: the others must fit beside it
    check_runs_fit(len(pairs), training_state_bytes(runs[0].module), runs[0].device,
                   None if free is None else free + training_state_bytes(runs[0].module))
    runs += [make_run(task, arm, seed, dm, budget_s, clock, policy=sources[seed], precision=precision, device=device)
             for arm, seed in pairs[1:]]
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
                 evals: int, clock: Clock, turn_steps: int | None = 1, seeds_at_once: int | None = None) -> None:
    """:func:`train_arms`'s arguments checked.

    Raises:
        ValueError: on an empty arm or seed list, repeated seeds, a non-positive budget, step or eval count, an
            unknown clock, or steps per turn or seeds at once that are not a positive integer (or None).
    """
    if seeds_at_once is not None and not (isinstance(seeds_at_once, int) and seeds_at_once >= 1):
        raise ValueError(f"seeds_at_once must be an integer >= 1 (or None: all), got {seeds_at_once!r}")
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

