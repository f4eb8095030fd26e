"""The time-to-quality study as a function: :func:`run_study` takes a task and its options and returns the report
(:class:`StudyResult`); the command (:mod:`lit_prunedpo_lab.study.cli`) and the regime map
(:mod:`lit_prunedpo_lab.study.map_cells`) call it.

The protocol (docs/time-to-quality.md), the default:

1. **Calibration** (:mod:`lit_prunedpo_lab.study.calibrate`): a few timed steps of every arm; vanilla at a few
   batch sizes, a line fitted through their costs. For every pruned mode the **cost-matched vanilla** arm
   (vanilla with its batch shrunk until a step costs what the pruned step costs, measured; the FLOP model's
   batch recorded beside it) is added: a mandatory control. Each arm's schedule length comes from its
   measured cost per step.
2. **Learning-rate sweep** (:mod:`lit_prunedpo_lab.study.sweep`): every arm at 0.5, 1 and 2 times ``--lr`` on
   tuning seeds (100, 101) that the verdict never uses; each keeps its best rate. ``--no-sweep`` skips it.
3. **The study** (:mod:`lit_prunedpo_lab.study.runner`): every arm from each verdict seed's initial weights on
   the same data (5 seeds, 0-4), warm-up then cosine decay over the steps the arm will run, exact held-out
   evaluations at fixed points of the training clock and of the step count.
4. **Verdict** (:mod:`lit_prunedpo_lab.study.curves`): target = 0.8 (``--target-share``) of same-batch vanilla's
   best improvement over the initial loss (and accuracy); per arm the time to target against the better of
   same-batch and cost-matched vanilla, with a 95 % percentile-bootstrap interval over seeds (2000 resamples,
   seeded); WIN only when the interval's upper end is below 1.0, LOSS when its lower end is above, TIE
   otherwise; plus the best quality each arm reaches within the budget, with its interval.

**Memory budget** (``--memory-budget-mb``, :mod:`lit_prunedpo_lab.study.memory`): the calibration measures every
arm's peak step memory (above the step's start); an arm over the budget is fitted its fastest exact way (chunked
scorer, activation checkpointing, gradient accumulation, or a combination, chosen by measurement). Vanilla at the
task's batch so fitted is the **memory-fitted vanilla** control; a pruned arm over the budget is replaced by its
fitted variant; the verdict's reference is the better of the vanillas that fit (same-batch, cost-matched,
memory-fitted). Compute-matched arms (larger batches) are not run under a budget, and ``--prune-early`` is refused.

**The output folder** (:mod:`lit_prunedpo_lab.study.outputs`): locked for the study's whole run (``--out/.lock``), so a
second study into it while the first runs is refused, naming the first's process; a folder holding an earlier
study's records (``progress.jsonl``, ``study.json``...) is refused unless ``--overwrite`` is given, which removes
them first (a replacement killed early then never sits beside the old report). Reports are written whole; a file
that cannot be written (a full disk) ends the study with one line naming it. These raise
:class:`~lit_prunedpo_lab.study.outputs.Refused` (nothing ran) or ``OutputError`` (the study stopped).

At **batch 1** no vanilla batch is smaller, so there is no cost-matched control: the log and ``study.md`` say
what the verdicts then cannot conclude (:data:`.report_markdown.ONE_PAIR_NOTE`). A memory budget over
every arm's peak binds nothing, and the report says so (:func:`lit_prunedpo_lab.study.memory.budget_binds`).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lit_prunedpo_lab.study.arguments import StudyOptions, UsageError
from lit_prunedpo_lab.study.outputs import OutputError, Refused, claim_folder
from lit_prunedpo_lab.study.tasks import StudyTask

if TYPE_CHECKING:  # for annotations only: the study imports them once its arguments are checked
    from lit_prunedpo.data import PreferenceDataModule
    from lit_prunedpo_lab.study.arm_plan import ArmPlan
    from lit_prunedpo_lab.study.arms import Arm
    from lit_prunedpo_lab.study.report import Journal
    from lit_prunedpo_lab.study.runner import Run

#: What a study writes under its folder; any of them there means an earlier study (refused without ``overwrite``).
STUDY_FILES = ("progress.jsonl", "study.json", "study.md", "study.png")


@dataclass(frozen=True)
class StudyResult:
    """What a study produced."""

    payload: dict[str, Any]
    """The report: what ``study.json`` holds (runs, per-arm summaries and verdicts, the settings)."""
    files: list[Path] = field(default_factory=list)
    """The files it wrote (none without ``out``)."""

    @property
    def markdown(self) -> str:
        """The report as ``study.md`` holds it."""
        from lit_prunedpo_lab.study.report import to_markdown

        return to_markdown(self.payload)


def run_study(task: StudyTask, options: StudyOptions, *, out: Path | None = None, overwrite: bool = False,
              threads: int = 1, work_dir: Path | str = "study_results/work", log: Callable[[str], None] | None = None,
              command: str = "") -> StudyResult:
    """The study of ``task`` with ``options`` (module docstring): ``out`` created, test-written and claimed, the
    task's data read, the arms calibrated, the sweep and the study run, the report written under ``out``.

    Args:
        out: the folder for ``progress.jsonl`` (written as the study goes) and the report; ``None``: nothing
            written. Locked until the study returns.
        overwrite: replace an earlier study's records in ``out`` (else refused).
        threads: torch threads.
        work_dir: where warm starts are cached.
        log: where progress lines go (``None``: nowhere).
        command: the command line recorded in the report (how to run it again).

    Raises:
        UsageError: a folder that cannot be written, or a combination of options, the task's data or a memory budget
            that cannot run.
        Refused: ``out`` is in use or holds an earlier study (without ``overwrite``).
        OutputError: a file could not be written (a full disk).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    log = log or (lambda line: None)
    with contextlib.ExitStack() as held:
        replaced = _prepare_out(out, overwrite, held) if out is not None else False
        import torch

        from lit_prunedpo_lab.study.arm_plan import plan_arms
        from lit_prunedpo_lab.study.report import Journal, write_report

        journal = Journal(out, command) if out is not None else None
        if journal is not None:
            log(f"writing {journal.path} as the study goes"
                + (" (the earlier study's records removed: --overwrite)" if replaced else ""))
        torch.set_num_threads(threads)
        dm, eval_pairs = _load_data(task, options.max_eval_pairs)
        plan = plan_arms(task, dm, options, log)
        if journal is not None:
            journal.append("calibration", **plan.record)
            if plan.memory is not None:
                journal.append("memory", **plan.memory)
        arms = plan.scheduled_arms(options.budget, options.steps, options.prune_early)
        log(f"arms: {', '.join(f'{a.name} ({a.schedule_steps} scheduled steps)' for a in arms)}; seeds "
            f"{options.seeds}; budget {options.budget:g} {options.clock}-s and {options.steps} steps; "
            f"precision {options.precision}; device {options.device}")
        study = dict(task=task, budget_s=options.budget, steps=options.steps, clock=options.clock, dm=dm,
                     max_eval_pairs=options.max_eval_pairs, log=log, work_dir=work_dir, precision=options.precision,
                     device=options.device, seeds_at_once=options.seeds_at_once)
        runs, swept = _sweep_and_run(arms, options, study, journal, log)
        payload = _payload(runs, swept, plan, task, options, eval_pairs, command, threads)
        files = write_report(payload, out) if out is not None else []
        for path in files:
            log(f"wrote {path}")
        return StudyResult(payload, list(files))


def _payload(runs: list[Run], swept: dict[str, Any] | None, plan: ArmPlan, task: StudyTask, options: StudyOptions,
             eval_pairs: int, command: str, threads: int) -> dict[str, Any]:
    """The report of a finished study (what ``study.json`` holds)."""
    import torch

    from lit_prunedpo_lab.study.report import payload_of, warm_start_summary

    return payload_of(
        runs, task.describe(), options.clock, options.budget, options.steps, options.evals, options.seeds,
        eval_pairs, command,
        extra={"torch_threads": threads, "precision": options.precision, "device": options.device,
               "seeds_at_once": options.seeds_at_once,
               "ideal_speedups": plan.speedups,
               "torch": torch.__version__,
               "warm_start": warm_start_summary(runs), "calibration": plan.record, "sweep": swept,
               "memory": plan.memory},
        protocol={"share": options.target_share, "resamples": options.bootstrap, "confidence": options.confidence,
                  "seed": options.bootstrap_seed, "controls": plan.controls,
                  "same_batch_reference": plan.same_batch_reference},
    )


def claim_out(out: Path, overwrite: bool, held: contextlib.ExitStack) -> bool:
    """Lock ``out`` for this study (held by ``held``) and refuse an earlier study's records there unless
    ``overwrite``, which removes them; returns whether any were removed.

    Raises:
        Refused: another study runs there (its process named), or an earlier one's records are there.
    """
    earlier = claim_folder(out, "study", STUDY_FILES, held)
    if earlier and not overwrite:
        raise Refused(f"--out {out} holds an earlier study ({', '.join(earlier)}): choose another --out, or pass "
                      "--overwrite to replace it")
    for name in earlier:  # removed up front: a replacement stopped early must not sit beside the old report
        try:
            (out / name).unlink()
        except OSError as exc:
            raise OutputError.of(out / name, exc) from exc
    return bool(earlier)


def _prepare_out(out: Path, overwrite: bool, held: contextlib.ExitStack) -> bool:
    """``--out`` created and test-written (:func:`~lit_prunedpo_lab.study.report.check_writable`), then claimed
    (:func:`claim_out`); returns whether an earlier study's records were removed.

    Raises:
        UsageError: the folder cannot be created or written.
    """
    from lit_prunedpo_lab.study.report import check_writable

    try:
        check_writable(out)
    except OSError as exc:
        raise UsageError(f"--out: {exc}") from None
    return claim_out(out, overwrite, held)


def _load_data(task: StudyTask, max_eval_pairs: int | None) -> tuple[PreferenceDataModule, int]:
    """The task's set-up data module and the number of held-out pairs every evaluation scores.

    Raises:
        UsageError: a data file or tokenizer not where the task was told to look, or no held-out pair.
    """
    from lit_prunedpo_lab.study.runner import eval_batches

    with tempfile.TemporaryDirectory(prefix="lit-prunedpo-study-") as work_dir:  # generated files, read once by setup
        try:
            dm = task.datamodule(Path(work_dir))
        except FileNotFoundError as exc:  # a data file or tokenizer not where the task was told to look
            raise UsageError(str(exc)) from None
    try:
        eval_pairs = sum(b.num_pairs for b in eval_batches(dm, max_eval_pairs))
    except ValueError as exc:
        raise UsageError(f"task {task.name}: {exc}") from None
    return dm, eval_pairs


def _sweep_and_run(arms: list[Arm], options: StudyOptions, study: dict[str, Any], journal: Journal | None,
                   log: Callable[[str], None]) -> tuple[list[Run], dict[str, Any] | None]:
    """The learning-rate sweep on the tuning seeds (unless ``--no-sweep``: ``None`` for its record), then the study on
    the verdict seeds, each evaluation and finished run journaled as it happens; returns the runs and the sweep's
    record. ``study`` holds :func:`~lit_prunedpo_lab.study.runner.train_arms`'s shared arguments."""
    from lit_prunedpo_lab.study.runner import train_arms
    from lit_prunedpo_lab.study.sweep import sweep, window_of

    def journaled(phase: str) -> dict:
        if journal is None:
            return {}
        return {"on_point": lambda r, p: journal.point(phase, r, p), "on_done": lambda r: journal.run(phase, r)}

    swept = None
    if options.sweep:
        lr = study["task"].lr
        log(f"learning-rate sweep: {options.lr_factors} x {lr:g} on tuning seeds {options.tune_seeds}")
        arms, rows = sweep(arms, lr, options.lr_factors, options.tune_seeds, options.evals, **study,
                           **journaled("sweep"))
        swept = {"factors": options.lr_factors, "seeds": options.tune_seeds, "window": window_of(options.evals),
                 "rows": rows}
        if journal is not None:
            journal.append("sweep", **swept)
        log("chosen learning rates: " + ", ".join(f"{a.name} {a.lr:.3g}" for a in arms))
    runs = train_arms(arms=arms, seeds=options.seeds, evals=options.evals, **study, **journaled("study"))
    return runs, swept
