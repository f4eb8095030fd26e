"""``lit-prunedpo-study``: time to quality of every pruning mode against vanilla, on one task.

Examples::

    lit-prunedpo-study --task quickstart --quick --out study_results/quickstart-quick
    lit-prunedpo-study --task edited --modes vanilla,branch,sequence --seeds 0,1,2 --budget 30 --steps 300 \\
        --out docs/study/edited
    python -m lit_prunedpo.study.cli --task hh-rlhf --modes vanilla,branch --no-matched --budget 120 --steps 40

Every arm (mode x batch) trains from each seed's initial weights on the same data; see
:mod:`lit_prunedpo.study.runner` for the clocks and the interleaving, :mod:`lit_prunedpo.study.curves` for
the target and the ratios. ``--quick`` is a version of a few minutes (2 s budgets, 40 steps, 64 held-out pairs).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from lit_prunedpo.study.arms import MODES
from lit_prunedpo.study.tasks import TASKS

QUICK = {"budget": 2.0, "steps": 40, "evals": 4, "max_eval_pairs": 64}


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lit-prunedpo-study",
        description="Train every pruning mode from the same weights on the same data, for the same time and the same "
                    "steps, over several seeds; report time to vanilla's final held-out quality.",
    )
    parser.add_argument("--task", default="quickstart", choices=sorted(TASKS), help="data and model (default: quickstart)")
    parser.add_argument("--modes", type=_csv, default=list(MODES), help=f"comma-separated, from {','.join(MODES)}; vanilla is always run")
    parser.add_argument("--no-matched", dest="matched", action="store_false",
                        help="skip the compute-matched arm (pruned modes with the batch enlarged to a vanilla step's cost)")
    parser.add_argument("--prune-early", type=float, default=None, metavar="FRACTION",
                        help="also run each pruned mode pruning only for this share of the budget, then exact (PruneEarly)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (>= 3 for a spread; default 0,1,2)")
    parser.add_argument("--budget", type=float, default=None, help="training seconds per run on --clock (default 30)")
    parser.add_argument("--steps", type=int, default=None, help="the same-steps budget (default 300)")
    parser.add_argument("--evals", type=int, default=None, help="exact evaluations per budget (default 10)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="the clock budgets and ratios use: process CPU seconds (default; steady on a shared machine) or wall")
    parser.add_argument("--batch-size", type=int, default=None, help="the same-batch arm's pairs per step (default: the task's)")
    parser.add_argument("--max-rows", type=int, default=None, help="use only the first N rows of the task's data (held-out share included)")
    parser.add_argument("--max-eval-pairs", type=int, default=None, help="evaluate on the first N held-out pairs only")
    parser.add_argument("--lr", type=float, default=None,
                        help="every arm's DPO learning rate (AdamW; default: the task's; the warm start keeps its own)")
    parser.add_argument("--warm-start-steps", type=int, default=None, metavar="N",
                        help="supervised steps on the training split's chosen responses before DPO, cached per seed under "
                             "--work-dir; every arm of a seed starts from them (default: the task's; 0: none)")
    parser.add_argument("--work-dir", default="study_results/work",
                        help="where warm starts are cached (default: study_results/work)")
    parser.add_argument("--quick", action="store_true", help=f"a minutes-long study: {QUICK} unless given")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU seconds then measure work)")
    parser.add_argument("--out", default=None, help="directory for study.json, study.md, study.png (default: print the table)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    defaults = QUICK if args.quick else {"budget": 30.0, "steps": 300, "evals": 10, "max_eval_pairs": None}
    budget = args.budget if args.budget is not None else defaults["budget"]
    steps = args.steps if args.steps is not None else defaults["steps"]
    evals = args.evals if args.evals is not None else defaults["evals"]
    max_eval_pairs = args.max_eval_pairs if args.max_eval_pairs is not None else defaults["max_eval_pairs"]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        parser.error(f"--modes: unknown or empty {bad or args.modes}; choose from {','.join(MODES)}")
    try:
        seeds = [int(s) for s in _csv(args.seeds)]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds: need distinct seeds, got {args.seeds!r}")
    for name, value in (("--budget", budget), ("--steps", steps), ("--evals", evals), ("--threads", args.threads)):
        if not value > 0:
            parser.error(f"{name} must be > 0, got {value!r}")

    import dataclasses

    import torch

    from lit_prunedpo.bench.cost import ModelDims
    from lit_prunedpo.study.arms import Arm, ideal_speedup, matched_batch_size
    from lit_prunedpo.study.report import payload_of, to_markdown, warm_start_summary, write_report
    from lit_prunedpo.study.runner import eval_batches, run_study

    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    torch.set_num_threads(args.threads)
    task = TASKS[args.task]
    # task overrides: (field, option, valid, bound named in the error)
    for name, option, valid, bound in (
        ("batch_size", "--batch-size", lambda v: v >= 1, ">= 1"),
        ("max_rows", "--max-rows", lambda v: v >= 2, ">= 2"),
        ("lr", "--lr", lambda v: v > 0, "> 0"),
        ("warm_start_steps", "--warm-start-steps", lambda v: v >= 0, ">= 0"),
    ):
        value = getattr(args, name)
        if value is None:
            continue
        if not valid(value):
            parser.error(f"{option} must be {bound}, got {value!r}")
        task = dataclasses.replace(task, **{name: value})
    out = Path(args.out) if args.out else Path("study_results") / task.name
    with tempfile.TemporaryDirectory(prefix="lit-prunedpo-study-") as work_dir:  # generated files, read once by setup
        dm = task.datamodule(Path(work_dir))
    modes = ["vanilla"] + [m for m in args.modes if m != "vanilla"]
    arms = [Arm(m, task.batch_size) for m in modes]
    if args.prune_early is not None:
        if not 0.0 <= args.prune_early <= 1.0:
            parser.error(f"--prune-early must be in [0, 1], got {args.prune_early!r}")
        arms += [Arm(m, task.batch_size, prune_fraction=args.prune_early) for m in modes[1:]]
    speedups: dict[str, float] = {}
    if args.matched:
        dims = ModelDims.from_model(task.policy(0).build())
        sample = [b for _, b in zip(range(8), dm.train_dataloader())]
        for m in modes[1:]:
            speedups[m] = ideal_speedup(m, sample, dims)
            size = matched_batch_size(task.batch_size, speedups[m])
            if size > task.batch_size:
                arms.append(Arm(m, size, matched=True))
    log(f"arms: {', '.join(a.name for a in arms)}; seeds {seeds}; budget {budget:g} {args.clock}-s and {steps} steps")
    runs = run_study(task, arms, seeds, budget, steps, evals, clock=args.clock, dm=dm, max_eval_pairs=max_eval_pairs, log=log,
                     work_dir=args.work_dir)
    eval_pairs = sum(b.num_pairs for b in eval_batches(dm, max_eval_pairs))
    payload = payload_of(
        runs, task.describe(), args.clock, budget, steps, evals, seeds, eval_pairs, "lit-prunedpo-study " + " ".join(sys.argv[1:] if argv is None else argv),
        extra={"torch_threads": args.threads, "ideal_speedups": speedups, "torch": torch.__version__,
               "warm_start": warm_start_summary(runs)},
    )
    if args.out:
        for path in write_report(payload, out):
            log(f"wrote {path}")
    print(to_markdown(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
