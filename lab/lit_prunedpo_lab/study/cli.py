"""``lit-prunedpo-study``: time to quality of every pruning mode against the honest alternatives, on one task.

Examples::

    lit-prunedpo-study --task quickstart --quick --out study_results/quickstart-quick
    lit-prunedpo-study --task edited --modes vanilla,branch,sequence --budget 30 --steps 300 \
        --out docs/records/study/edited
    python -m lit_prunedpo_lab.study.cli --task hh-rlhf --modes vanilla,position-coupled --no-matched --budget 90 \
        --steps 40

The protocol, the memory budget and the output folder: :mod:`lit_prunedpo_lab.study.protocol`
(:func:`~lit_prunedpo_lab.study.protocol.run_study`, which this command calls).

Every numeric option is checked while parsing (``argument --max-eval-pairs: must be >= 1, got 0``), and
``--out`` is created and test-written before any training; the calibration, every evaluation and every
finished run are appended to ``--out``/``progress.jsonl`` as they happen. ``--quick`` is a version of a few
minutes: 2 s budgets, 40 steps, 4 evaluations, 64 held-out pairs, **3 seeds** (0-2), 1 tuning seed (100),
2 calibration steps, unless given. An output folder refused or a file that cannot be written prints ``error: ...``;
the exit status is 2 when nothing ran (folder in use, earlier study), 1 when the study stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Sequence

from lit_prunedpo_lab.study.arguments import UsageError, build_parser, resolve_options
from lit_prunedpo_lab.study.outputs import OutputError, Refused
from lit_prunedpo_lab.study.protocol import run_study
from lit_prunedpo_lab.study.tasks import TASKS, StudyTask


def main(argv: Sequence[str] | None = None, task: StudyTask | None = None) -> int:
    """Run the study described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status. ``task``
    replaces ``--task``'s. An output folder refused or a file that cannot be written is one ``error:`` line
    (status 2 / 1)."""
    try:
        return run(argv, task)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except OutputError as exc:
        print(f"error: {exc}; the study stopped", file=sys.stderr)
        return exc.status


def run(argv: Sequence[str] | None = None, task: StudyTask | None = None) -> int:
    """:func:`main`, raising :class:`~lit_prunedpo_lab.study.outputs.Refused` or ``OutputError`` instead of printing
    them; the report's table printed on stdout."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = "lit-prunedpo-study " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        result = run_study(task_of(args, TASKS[args.task] if task is None else task), resolve_options(args),
                           out=Path(args.out) if args.out else None, overwrite=args.overwrite, threads=args.threads,
                           work_dir=args.work_dir, command=command,
                           log=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)))
    except UsageError as exc:
        parser.error(str(exc))
    print(result.markdown)
    return 0


def task_of(args: argparse.Namespace, task: StudyTask) -> StudyTask:
    """``task`` with the settings the command line replaces (batch, rows, learning rate, warm start, data path,
    tokenizer, pretrained model, lengths).

    Raises:
        UsageError: a setting the task does not have (``--data-path`` for a task that generates its pairs,
            ``--model`` for one built from a config), or a prompt length not below the sequence length.
    """
    for name in ("batch_size", "max_rows", "lr", "warm_start_steps"):  # checked by their argument types
        if getattr(args, name) is not None:
            task = dataclasses.replace(task, **{name: getattr(args, name)})
    for option, name in (("--data-path", "path"), ("--tokenizer", "tokenizer"), ("--model", "model_path"),
                         ("--max-length", "max_length"), ("--max-prompt-length", "max_prompt_length")):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None:
            if name not in {f.name for f in dataclasses.fields(task)}:
                raise UsageError(f"{option}: task {task.name} has no such setting ({what_it_reads(task)})")
            task = dataclasses.replace(task, **{name: value})
    if getattr(task, "max_prompt_length", 0) >= getattr(task, "max_length", 1):
        raise UsageError(f"--max-prompt-length {task.max_prompt_length} must be below --max-length "
                         f"{task.max_length} (task {task.name}): a response needs room")
    return task


def what_it_reads(task: StudyTask) -> str:
    """What a task takes from outside, for an error naming a setting it does not have."""
    fields = {f.name for f in dataclasses.fields(task)}
    if "path" not in fields:
        return "it generates its pairs"
    return "it reads a data file with " + ("a pretrained model's tokenizer" if "model_path" in fields
                                          else "a tokenizer and a model built from a config")


if __name__ == "__main__":
    raise SystemExit(main())
