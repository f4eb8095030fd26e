"""``lit-prunedpo-study``: time to quality of every pruning mode against the honest alternatives, on one task.

Examples::

    lit-prunedpo-study --task quickstart --quick --out study_results/quickstart-quick
    lit-prunedpo-study --task edited --modes vanilla,branch,sequence --budget 30 --steps 300 --out docs/study/edited
    python -m lit_prunedpo.study.cli --task hh-rlhf --modes vanilla,position-coupled --no-matched --budget 90 --steps 40

The protocol (docs/time-to-quality.md), the command's default:

1. **Calibration** (:mod:`lit_prunedpo.study.calibrate`): a few timed steps of every arm; vanilla at a few
   batch sizes, a line fitted through their costs. For every pruned mode the **cost-matched vanilla** arm
   (vanilla with its batch shrunk until a step costs what the pruned step costs, measured; the FLOP model's
   batch recorded beside it) is added: a mandatory control. Each arm's schedule length comes from its
   measured cost per step.
2. **Learning-rate sweep** (:mod:`lit_prunedpo.study.sweep`): every arm at 0.5, 1 and 2 times ``--lr`` on
   tuning seeds (100, 101) that the verdict never uses; each keeps its best rate. ``--no-sweep`` skips it.
3. **The study** (:mod:`lit_prunedpo.study.runner`): every arm from each verdict seed's initial weights on
   the same data (5 seeds, 0-4), warm-up then cosine decay over the steps the arm will run, exact held-out
   evaluations at fixed points of the training clock and of the step count.
4. **Verdict** (:mod:`lit_prunedpo.study.curves`): target = 0.8 (``--target-share``) of same-batch vanilla's
   best improvement over the initial loss (and accuracy); per arm the time to target against the better of
   same-batch and cost-matched vanilla, with a 95 % percentile-bootstrap interval over seeds (2000 resamples,
   seeded); WIN only when the interval's upper end is below 1.0, LOSS when its lower end is above, TIE
   otherwise; plus the best quality each arm reaches within the budget, with its interval.

**Memory budget** (``--memory-budget-mb``, :mod:`lit_prunedpo.study.memory`): the calibration measures every
arm's peak step memory (above the step's start); an arm over the budget is fitted its fastest exact way (chunked
scorer, activation checkpointing, gradient accumulation, or a combination, chosen by measurement). Vanilla at the
task's batch so fitted is the **memory-fitted vanilla** control; a pruned arm over the budget is replaced by its
fitted variant; the verdict's reference is the better of the vanillas that fit (same-batch, cost-matched,
memory-fitted). Compute-matched arms (larger batches) are not run under a budget, and ``--prune-early`` is refused.

Every numeric option is checked while parsing (``argument --max-eval-pairs: must be >= 1, got 0``), and
``--out`` is created and test-written before any training; the calibration, every evaluation and every
finished run are appended to ``--out``/``progress.jsonl`` as they happen. ``--quick`` is a version of a few
minutes: 2 s budgets, 40 steps, 4 evaluations, 64 held-out pairs, **3 seeds** (0-2), 1 tuning seed (100),
2 calibration steps, unless given.

**The output folder** (:mod:`lit_prunedpo.study.outputs`): locked for the study's whole run (``--out/.lock``), so a
second study into it while the first runs is refused, naming the first's process; a folder holding an earlier
study's records (``progress.jsonl``, ``study.json``...) is refused unless ``--overwrite`` is given, which removes
them first (a replacement killed early then never sits beside the old report). Reports are written whole; a file
that cannot be written (a full disk) ends the study with one line naming it. These errors print ``error: ...``;
the exit status is 2 when nothing ran (folder in use, earlier study), 1 when the study stopped.

At **batch 1** no vanilla batch is smaller, so there is no cost-matched control: the log and ``study.md`` say
what the verdicts then cannot conclude (:data:`lit_prunedpo.study.report_markdown.ONE_PAIR_NOTE`). A memory budget over
every arm's peak binds nothing, and the report says so (:func:`lit_prunedpo.study.memory.budget_binds`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from lit_prunedpo.study.arguments import StudyOptions, UsageError, build_parser, resolve_options
from lit_prunedpo.study.outputs import OutputError, Refused, claim_folder
from lit_prunedpo.study.tasks import TASKS, StudyTask

if TYPE_CHECKING:  # for annotations only: the command imports them once its arguments are checked
    from lit_prunedpo.data import PreferenceDataModule
    from lit_prunedpo.study.arms import Arm
    from lit_prunedpo.study.report import Journal
    from lit_prunedpo.study.runner import Run

#: What a study writes under ``--out``; any of them there means an earlier study (refused without ``--overwrite``).
STUDY_FILES = ("progress.jsonl", "study.json", "study.md", "study.png")


def main(argv: Sequence[str] | None = None, task: StudyTask | None = None) -> int:
    """Run the study described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status. ``task``
    replaces ``--task``'s (the regime map, :mod:`lit_prunedpo.study.map_cli`, passes each cell's own task).
    An output folder refused or a file that cannot be written is one ``error:`` line (status 2 / 1)."""
    try:
        return run(argv, task)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except OutputError as exc:
        print(f"error: {exc}; the study stopped", file=sys.stderr)
        return exc.status


def run(argv: Sequence[str] | None = None, task: StudyTask | None = None) -> int:
    """:func:`main`, raising :class:`~lit_prunedpo.study.outputs.Refused` or ``OutputError`` instead of printing
    them (the map tells a full disk from a failed cell by them); ``--out`` is locked until it returns."""
    parser = build_parser()
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as held:
        try:
            return _study(args, "lit-prunedpo-study " + " ".join(sys.argv[1:] if argv is None else argv), task, held)
        except UsageError as exc:
            parser.error(str(exc))


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


def _study(args: argparse.Namespace, command: str, task: StudyTask | None, held: contextlib.ExitStack) -> int:
    """The study of a parsed command line: options checked, ``--out`` claimed, the task and its data read, the arms
    calibrated, the sweep and the study run, the report written (and printed).

    Raises:
        UsageError: a combination of options, the task's data or a memory budget that cannot run.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    options = resolve_options(args)
    out = Path(args.out) if args.out else None
    replaced = _prepare_out(out, args.overwrite, held) if out is not None else False

    import torch

    from lit_prunedpo.study.arm_plan import plan_arms
    from lit_prunedpo.study.report import Journal, payload_of, to_markdown, warm_start_summary, write_report

    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    journal = Journal(out, command) if out is not None else None
    if journal is not None:
        log(f"writing {journal.path} as the study goes"
            + (" (the earlier study's records removed: --overwrite)" if replaced else ""))
    torch.set_num_threads(args.threads)
    task = task_of(args, TASKS[args.task] if task is None else task)
    dm, eval_pairs = _load_data(task, options.max_eval_pairs)
    plan = plan_arms(task, dm, options, log)
    if journal is not None:
        journal.append("calibration", **plan.record)
        if plan.memory is not None:
            journal.append("memory", **plan.memory)
    arms = plan.scheduled_arms(options.budget, options.steps, options.prune_early)
    log(f"arms: {', '.join(f'{a.name} ({a.schedule_steps} scheduled steps)' for a in arms)}; seeds {options.seeds}; "
        f"budget {options.budget:g} {options.clock}-s and {options.steps} steps")
    study = dict(task=task, budget_s=options.budget, steps=options.steps, clock=options.clock, dm=dm,
                 max_eval_pairs=options.max_eval_pairs, log=log, work_dir=args.work_dir)
    runs, swept = _sweep_and_run(arms, options, study, journal, log)
    payload = payload_of(
        runs, task.describe(), options.clock, options.budget, options.steps, options.evals, options.seeds, eval_pairs,
        command,
        extra={"torch_threads": args.threads, "ideal_speedups": plan.speedups, "torch": torch.__version__,
               "warm_start": warm_start_summary(runs), "calibration": plan.record, "sweep": swept,
               "memory": plan.memory},
        protocol={"share": options.target_share, "resamples": options.bootstrap, "confidence": options.confidence,
                  "seed": options.bootstrap_seed, "controls": plan.controls,
                  "same_batch_reference": plan.same_batch_reference},
    )
    if out is not None:
        for path in write_report(payload, out):
            log(f"wrote {path}")
    print(to_markdown(payload))
    return 0


def _prepare_out(out: Path, overwrite: bool, held: contextlib.ExitStack) -> bool:
    """``--out`` created and test-written (:func:`~lit_prunedpo.study.report.check_writable`), then claimed
    (:func:`claim_out`); returns whether an earlier study's records were removed.

    Raises:
        UsageError: the folder cannot be created or written.
    """
    from lit_prunedpo.study.report import check_writable

    try:
        check_writable(out)
    except OSError as exc:
        raise UsageError(f"--out: {exc}") from None
    return claim_out(out, overwrite, held)


def task_of(args: argparse.Namespace, task: StudyTask) -> StudyTask:
    """``task`` with the settings the command line replaces (batch, rows, learning rate, warm start, data path,
    tokenizer).

    Raises:
        UsageError: ``--data-path`` or ``--tokenizer`` for a task that reads no data file.
    """
    for name in ("batch_size", "max_rows", "lr", "warm_start_steps"):  # checked by their argument types
        if getattr(args, name) is not None:
            task = dataclasses.replace(task, **{name: getattr(args, name)})
    for option, name in (("--data-path", "path"), ("--tokenizer", "tokenizer")):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None:
            if name not in {f.name for f in dataclasses.fields(task)}:
                raise UsageError(f"{option}: task {task.name} reads no data file (it generates its pairs)")
            task = dataclasses.replace(task, **{name: value})
    return task


def _load_data(task: StudyTask, max_eval_pairs: int | None) -> tuple[PreferenceDataModule, int]:
    """The task's set-up data module and the number of held-out pairs every evaluation scores.

    Raises:
        UsageError: a data file or tokenizer not where the task was told to look, or no held-out pair.
    """
    from lit_prunedpo.study.runner import eval_batches

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
    record. ``study`` holds :func:`~lit_prunedpo.study.runner.run_study`'s shared arguments."""
    from lit_prunedpo.study.runner import run_study
    from lit_prunedpo.study.sweep import sweep, window_of

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
    runs = run_study(arms=arms, seeds=options.seeds, evals=options.evals, **study, **journaled("study"))
    return runs, swept


if __name__ == "__main__":
    raise SystemExit(main())
