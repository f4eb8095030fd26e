"""The paper's form of the comparison: every design trains the same number of epochs, and what it saves is measured.

The method's published result is per epoch (branch pruning 1.426x faster per step than concatenated DPO, about
30 % less training time, a slight drop in accuracy; position and sequence pruning mainly lower peak memory). A
:class:`Design` is a pruning mode, optionally with its sampler arguments replaced (a point of the sampling-ratio
grid), at a batch size, trained for a number of epochs; vanilla's own frontier is vanilla at other batch sizes
and for fewer epochs. :func:`run_cell` trains every design from each seed's same initial weights (the study's
runner: the real ``PrunedDPO`` step, AdamW at the task's learning rate for every design, warm-up then cosine decay
over the design's own steps, length-grouped order seeded by the seed), evaluates the exact, unpruned held-out loss
and accuracy at the end (and half-way), then measures each design's peak step memory in a few extra steps.

Departures from the time-to-quality study (:mod:`lit_prunedpo_lab.study.cli`), on purpose: no learning-rate sweep
(the paper compares at equal hyperparameters), no cost-matched control (that is the study's question, not the
paper's), and a design's seeds run one after another, the designs of one seed round-robin, one step each per turn.

Clocks: the runner's, per timed step (CPU seconds of this process, and wall seconds), the designs of a seed
interleaved one step per turn (:mod:`lit_prunedpo_lab.study.turns`). Memory: each design's median over ``probe_steps``
extra steps, taken after its final evaluation so that the meter (which slows what it measures on the CPU, and
settles memory before each step) never touches a timed step; CPU: peak live tensor storage above the step's start
(the tensor meter, ``PeakMemoryMeter(settle=True)``; cells before 2026-12-06 read peak RSS); CUDA:
``max_memory_allocated`` above it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.tasks import StudyTask

#: The table's designs: each mode of the paper and the best design we have in each dimension (antithetic
#: branches, coupled stratified positions, the coupled combination); vanilla is the reference.
TABLE_DESIGNS = ("vanilla", "branch", "antithetic", "sequence", "position-bernoulli", "stratified-coupled", "all",
                 "all-coupled")

#: The sampling-ratio grid added by ``--pareto`` (beside the table's designs): position rates, prefix fractions,
#: branch probabilities and their combinations; vanilla at half and twice the batch and for fewer epochs.
PARETO_DESIGNS = (
    "position-bernoulli:rate=0.125", "position-bernoulli:rate=0.5", "stratified-coupled:rate=0.125",
    "stratified-coupled:rate=0.5",
    "sequence:min_fraction=0.25", "sequence:min_fraction=0.75", "branch:chosen_probability=0.25",
    "all-coupled:rate=0.25,min_fraction=0.75", "all-coupled:rate=0.125,min_fraction=0.5",
    "vanilla@/2", "vanilla@x2", "vanilla/0.5", "vanilla/0.75",
)

_DESIGN = re.compile(r"^(?P<mode>[a-z][a-z-]*)(?::(?P<settings>[^@/]+))?"
                     r"(?:@(?P<batch>x2|/2|\d+))?(?:/(?P<epochs>[0-9.]+))?$")


@dataclass(frozen=True)
class Design:
    """A mode (with replaced sampler arguments) at a batch size for a number of epochs."""

    arm: Arm
    epochs: float

    @property
    def label(self) -> str:
        epochs = "" if self.epochs == 1 else f"/{self.epochs:g}"
        return f"{self.arm.design}@{self.arm.batch_size}{epochs}"


def parse_design(text: str, batch_size: int, epochs: float) -> tuple[str, tuple[tuple[str, float], ...], int, float]:
    """``MODE[:arg=value,...][@BATCH|@x2|@/2][/EPOCHS]`` -> (mode, settings, batch, epochs): the batch and epochs
    default to the cell's, ``@x2`` and ``@/2`` double or halve its batch, ``/0.5`` trains half as many epochs.

    Raises:
        ValueError: naming the text, for anything else.
    """
    match = _DESIGN.match(text.strip())
    if match is None:
        raise ValueError(f"design {text!r}: expected MODE[:arg=value,...][@BATCH|@x2|@/2][/EPOCHS], "
                         "e.g. stratified-coupled:rate=0.125 or vanilla@/2 or vanilla/0.5")
    settings = []
    for part in filter(None, (match["settings"] or "").split(",")):
        name, sep, value = part.partition("=")
        try:
            settings.append((name.strip(), float(value)))
        except ValueError:
            raise ValueError(f"design {text!r}: sampler argument {part!r} is not name=number") from None
        if not sep or not name.strip():
            raise ValueError(f"design {text!r}: sampler argument {part!r} is not name=number")
    batch = {"x2": batch_size * 2, "/2": max(1, batch_size // 2), None: batch_size}.get(match["batch"])
    batch = int(match["batch"]) if batch is None else batch
    factor = float(match["epochs"]) if match["epochs"] else 1.0
    if not factor > 0 or not math.isfinite(factor):
        raise ValueError(f"design {text!r}: the epochs must be a number > 0")
    return match["mode"], tuple(settings), batch, epochs * factor


def steps_per_epoch(train_pairs: int, batch_size: int) -> int:
    """Steps of one pass over ``train_pairs`` pairs (the last batch may be smaller)."""
    return math.ceil(train_pairs / batch_size)


def make_designs(texts: Sequence[str], task: StudyTask, train_pairs: int, epochs: float) -> list[Design]:
    """The designs named by ``texts`` on ``task``, each with its arm's step count: ``epochs x steps_per_epoch``
    (its schedule decays over them). Duplicates are dropped; the first is ``vanilla`` at the task's batch.

    Raises:
        ValueError: for a malformed design, an unknown mode or a sampler argument its mode does not take.
    """
    designs: dict[str, Design] = {}
    for text in ("vanilla", *texts):
        mode, settings, batch, design_epochs = parse_design(text, task.batch_size, epochs)
        steps = max(1, round(design_epochs * steps_per_epoch(train_pairs, batch)))
        try:
            arm = Arm(mode, batch, schedule_steps=steps, settings=settings)
        except (ValueError, TypeError) as error:
            raise ValueError(f"design {text!r}: {error}") from None
        design = Design(arm, design_epochs)
        designs.setdefault(design.label, design)
    return list(designs.values())


def run_cell(task: StudyTask, dm: Any, designs: Sequence[Design], seeds: Sequence[int], work_dir: Path, evals: int = 2,
             probe_steps: int = 5, log: Callable[[str], None] | None = None,
             on_record: Callable[[dict[str, Any]], None] | None = None, done: set[tuple[str, int]] | None = None,
             precision: str = "32-true") -> list[dict[str, Any]]:
    """Train every design for its epochs from each seed, one seed at a time, on ``dm`` (``task``'s set-up data
    module); one record per (design, seed).

    ``done`` holds ``(label, seed)`` pairs already recorded (a resumed cell): a seed whose designs are all done is
    skipped, a seed with some missing is run again whole (its designs share the seed's turns). ``precision``: the
    runs' (:data:`lit_prunedpo_lab.study.runner.PRECISIONS`).
    """
    from lit_prunedpo_lab.study.runner import train_arms

    by_arm = {d.arm: d for d in designs}
    records = []
    for seed in seeds:
        if done is not None and all((d.label, seed) in done for d in designs):
            continue

        def finished(run: Any) -> None:
            record = design_record(by_arm[run.arm], run, probe_steps)
            records.append(record)
            if on_record is not None:
                on_record(record)

        train_arms(task, [d.arm for d in designs], [seed], budget_s=None, steps=lambda arm: arm.schedule_steps,
                  evals=evals, work_dir=work_dir, dm=dm, log=log, on_done=finished, precision=precision)
    return records


def design_record(design: Design, run: Any, probe_steps: int) -> dict[str, Any]:
    """The finished run's summary (clocks, step times, evaluations), then its peak step memory over ``probe_steps``
    extra steps (not timed into the summary)."""
    record = run.summary()
    final = run.points[-1]
    record.update(design=design.label, mode=design.arm.mode, settings=dict(design.arm.settings), epochs=design.epochs,
                  final_loss=final.loss, final_accuracy=final.accuracy,
                  peak_step_mb=probe_memory(run, probe_steps) if probe_steps > 0 else None,
                  memory_measure=memory_measure(run) if probe_steps > 0 else None)
    return record


def memory_measure(run: Any) -> str:
    """What :func:`probe_memory` reads for ``run``, in words (the meter's ``measure``)."""
    from lit_prunedpo.callbacks import PeakMemoryMeter

    return PeakMemoryMeter(next(run.module.policy.parameters()).device, settle=True).measure


def probe_memory(run: Any, steps: int) -> float | None:
    """Median peak memory (MiB above each step's start) of ``steps`` more metered steps of ``run``; None where
    this machine cannot read it. The run's clocks and step lists are restored: the probe is not training."""
    from lit_prunedpo.callbacks import PeakMemoryMeter

    saved = {name: getattr(run, name) for name in ("step", "wall_s", "cpu_s", "step_wall", "step_cpu")}
    saved["step_wall"], saved["step_cpu"] = list(run.step_wall), list(run.step_cpu)
    run.meter = PeakMemoryMeter(next(run.module.policy.parameters()).device, settle=True)
    run.step_peak_mb = []
    try:
        for _ in range(steps):
            run.train_step()
    finally:
        run.meter = None
        for name, value in saved.items():
            setattr(run, name, value)
    peaks = sorted(run.step_peak_mb)
    return peaks[len(peaks) // 2] if peaks else None


def cell_task(task: StudyTask, family: str, max_rows: int | None, warm_start_steps: int | None,
              lr: float | None = None, batch_size: int | None = None) -> StudyTask:
    """``task`` for one model family, cut to ``max_rows`` rows and given ``warm_start_steps``, its learning rate ``lr``
    and vanilla's ``batch_size`` where set."""
    from lit_prunedpo_lab.study.tasks import with_family

    task = with_family(task, family)
    changes: dict[str, Any] = {}
    if max_rows is not None:
        changes["max_rows"] = max_rows
    if warm_start_steps is not None:
        changes["warm_start_steps"] = warm_start_steps
    if lr is not None:
        changes["lr"] = lr
    if batch_size is not None:
        changes["batch_size"] = batch_size
    return dataclasses.replace(task, **changes) if changes else task  # type: ignore[type-var]
