"""``lit-prunedpo-study``: time to quality of every pruning mode against the honest alternatives, on one task.

Examples::

    lit-prunedpo-study --task quickstart --quick --out study_results/quickstart-quick
    lit-prunedpo-study --task edited --modes vanilla,branch,sequence --budget 30 --steps 300 --out docs/study/edited
    python -m lit_prunedpo.study.cli --task hh-rlhf --modes vanilla,position-coupled --no-matched --budget 90 --steps 40

The protocol (issue 17), the command's default:

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
what the verdicts then cannot conclude (:data:`lit_prunedpo.study.report.ONE_PAIR_NOTE`). A memory budget over
every arm's peak binds nothing, and the report says so (:func:`lit_prunedpo.study.memory.budget_binds`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from lit_prunedpo.study.arms import MODES
from lit_prunedpo.study.outputs import OutputError, Refused, claim_folder
from lit_prunedpo.study.tasks import TASKS, StudyTask

QUICK = {"budget": 2.0, "steps": 40, "evals": 4, "max_eval_pairs": 64, "seeds": [0, 1, 2], "tune_seeds": [100],
         "calibration_steps": 2}
DEFAULTS = {"budget": 30.0, "steps": 300, "evals": 10, "max_eval_pairs": None, "seeds": [0, 1, 2, 3, 4],
            "tune_seeds": [100, 101], "calibration_steps": 5}
#: What a study writes under ``--out``; any of them there means an earlier study (refused without ``--overwrite``).
STUDY_FILES = ("progress.jsonl", "study.json", "study.md", "study.png")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


# Argument types: argparse calls them while parsing and reports an ArgumentTypeError as
# "argument --option: <message>", so every bad number is refused before any data is read or any step trained.
def count(minimum: int) -> Callable[[str], int]:
    """An integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def real(low: float, high: float = math.inf, low_open: bool = True, high_open: bool = False) -> Callable[[str], float]:
    """A finite number in the interval from ``low`` to ``high`` (each end open or closed)."""
    if high == math.inf:
        bounds = f"{'>' if low_open else '>='} {low:g}"
    else:
        bounds = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bounds}, got {text!r}") from None
        inside = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
        if not math.isfinite(value) or not inside:
            raise argparse.ArgumentTypeError(f"must be a finite number {bounds}, got {text}")
        return value
    return parse


def seed_list(text: str) -> list[int]:
    """Distinct comma-separated integers, at least one."""
    try:
        seeds = [int(s) for s in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"need distinct seeds, got {text!r}")
    return seeds


def mode_list(text: str) -> list[str]:
    """Known modes, comma-separated, at least one."""
    modes = _csv(text)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"unknown or empty {bad or modes}; choose from {','.join(MODES)}")
    return modes


def factor_list(text: str) -> list[float]:
    """Distinct positive finite numbers, comma-separated, at least one."""
    try:
        factors = [float(f) for f in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not factors or len(set(factors)) != len(factors) or not all(math.isfinite(f) and f > 0 for f in factors):
        raise argparse.ArgumentTypeError(f"need distinct positive numbers, got {text!r}")
    return factors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lit-prunedpo-study",
        description="Train every pruning mode, vanilla and the cost-matched vanilla control from the same weights on the "
                    "same data, each at its own swept learning rate, for the same training time and steps, over several "
                    "seeds; report time to a share of vanilla's best improvement, with bootstrap intervals and verdicts.",
    )
    a = parser.add_argument
    a("--task", default="quickstart", choices=sorted(TASKS), help="data and model (default: quickstart)")
    a("--modes", type=mode_list, default=list(MODES), help=f"comma-separated, from {','.join(MODES)}; vanilla is always run")
    a("--no-matched", dest="matched", action="store_false",
      help="skip the compute-matched arm (pruned modes with the batch enlarged to a vanilla step's cost); the "
           "cost-matched vanilla control (vanilla's batch shrunk to a pruned step's cost) is always run")
    a("--prune-early", type=real(0.0, 1.0, low_open=False), default=None, metavar="FRACTION",
      help="also run each pruned mode pruning only for this share of the budget, then exact (PruneEarly)")
    a("--seeds", type=seed_list, default=None, help="comma-separated verdict seeds (default 0,1,2,3,4; --quick 0,1,2)")
    a("--tune-seeds", type=seed_list, default=None,
      help="seeds of the learning-rate sweep, none of them a verdict seed (default 100,101; --quick 100)")
    a("--lr-factors", type=factor_list, default=[0.5, 1.0, 2.0], help="the sweep's multiples of --lr (default 0.5,1,2)")
    a("--no-sweep", dest="sweep", action="store_false", help="every arm at --lr, no sweep (quick runs)")
    a("--target-share", type=real(0.0, 1.0), default=0.8,
      help="the target: this share of vanilla's best improvement over the initial loss / accuracy (default 0.8)")
    a("--bootstrap", type=count(100), default=2000, help="bootstrap resamples over seeds per interval (default 2000)")
    a("--confidence", type=real(0.0, 1.0, high_open=True), default=0.95, help="interval coverage (default 0.95)")
    a("--bootstrap-seed", type=int, default=0, help="seed of the bootstrap's resampling (default 0)")
    a("--calibration-steps", type=count(1), default=None,
      help="timed steps per arm in the calibration, after one untimed (default 5; --quick 2)")
    a("--budget", type=real(0.0), default=None, help="training seconds per run on --clock (default 30)")
    a("--steps", type=count(1), default=None, help="the same-steps budget (default 300)")
    a("--evals", type=count(1), default=None, help="exact evaluations per budget (default 10)")
    a("--clock", choices=("cpu", "wall"), default="cpu",
      help="the clock budgets and ratios use: process CPU seconds (default; steady on a shared machine) or wall")
    a("--batch-size", type=count(1), default=None, help="the same-batch arm's pairs per step (default: the task's)")
    a("--max-rows", type=count(2), default=None, help="use only the first N rows of the task's data (held-out share included)")
    a("--max-eval-pairs", type=count(1), default=None, help="evaluate on the first N held-out pairs only (default: all)")
    a("--lr", type=real(0.0), default=None,
      help="the base DPO learning rate (AdamW) the sweep multiplies (default: the task's; the warm start keeps its own)")
    a("--warm-start-steps", type=count(0), default=None, metavar="N",
      help="supervised steps on the training split's chosen responses before DPO, cached per seed under "
           "--work-dir; every arm of a seed starts from them (default: the task's; 0: none)")
    a("--data-path", default=None, metavar="FILE",
      help="the task's data file (tasks that read one: hh-rlhf; default: shared/data/hh-rlhf/harmless-base-test.jsonl.gz "
           "beside the repository)")
    a("--tokenizer", default=None, help="the task's tokenizer, a folder or hub name (tasks that read a data file: "
                                        "hh-rlhf; default: shared/tokenizers/gpt2 beside the repository)")
    a("--work-dir", default="study_results/work", help="where warm starts are cached (default: study_results/work)")
    a("--quick", action="store_true", help="a minutes-long study with fewer seeds: "
      + ", ".join(f"{k} {v}" for k, v in QUICK.items()) + " unless given")
    a("--memory-budget-mb", type=real(0.0), default=None, metavar="MB",
      help="cap on each arm's measured peak step memory (MiB above the step's start: CPU peak RSS, CUDA allocator "
           "peak); arms over it are fitted their fastest exact way (chunked scorer, checkpointing, gradient accumulation) "
           "and vanilla so fitted joins the controls (default: no budget; peaks are still measured and reported)")
    a("--threads", type=count(1), default=1, help="torch threads (default 1: CPU seconds then measure work)")
    a("--out", default=None, help="folder for progress.jsonl (written as the study goes), study.json, study.md, "
                                  "study.png; created and test-written before any training (default: print the table)")
    a("--overwrite", action="store_true", help="replace an earlier study's records in --out (progress.jsonl, study.json, "
                                                  "study.md, study.png; removed before this study starts); without it such "
                                                  "a folder is refused")
    a("--quiet", action="store_true", help="no progress lines")
    return parser


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
    with contextlib.ExitStack() as held:
        return _study(argv, task, held)


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


def _study(argv: Sequence[str] | None, task: StudyTask | None, held: contextlib.ExitStack) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    defaults = QUICK if args.quick else DEFAULTS
    opt = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in {**DEFAULTS, **defaults}.items()}
    budget, steps, evals, seeds = opt["budget"], opt["steps"], opt["evals"], opt["seeds"]
    if args.sweep and set(opt["tune_seeds"]) & set(seeds):
        parser.error(f"--tune-seeds {opt['tune_seeds']} and --seeds {seeds} share {sorted(set(opt['tune_seeds']) & set(seeds))}: "
                     "the sweep must run on seeds the verdict does not use")
    if args.memory_budget_mb is not None and args.prune_early is not None:
        parser.error("--prune-early cannot be combined with --memory-budget-mb: a prune-early arm's peak changes when it "
                     "turns exact, so it cannot be fitted to one budget")
    command = "lit-prunedpo-study " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out) if args.out else None
    replaced = False
    if out is not None:
        from lit_prunedpo.study.report import check_writable

        try:
            check_writable(out)
        except OSError as exc:
            parser.error(f"--out: {exc}")
        replaced = claim_out(out, args.overwrite, held)

    import torch

    from lit_prunedpo.bench.cost import ModelDims
    from lit_prunedpo.study.arms import Arm, ideal_speedup, matched_batch_size
    from lit_prunedpo.study.calibrate import (
        cost_matched_batch, fit_line, flop_matched_batch, measure_step_costs, schedule_steps, vanilla_probe_sizes,
    )
    from lit_prunedpo.study.report import ONE_PAIR_NOTE, Journal, payload_of, to_markdown, warm_start_summary, write_report
    from lit_prunedpo.study.runner import eval_batches, run_study
    from lit_prunedpo.study.sweep import sweep, window_of

    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    journal = Journal(out, command) if out is not None else None
    if journal is not None:
        log(f"writing {journal.path} as the study goes"
            + (" (the earlier study's records removed: --overwrite)" if replaced else ""))
    torch.set_num_threads(args.threads)
    task = TASKS[args.task] if task is None else task
    for name in ("batch_size", "max_rows", "lr", "warm_start_steps"):  # checked by their argument types
        if getattr(args, name) is not None:
            task = dataclasses.replace(task, **{name: getattr(args, name)})
    for option, name in (("--data-path", "path"), ("--tokenizer", "tokenizer")):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None:
            if name not in {f.name for f in dataclasses.fields(task)}:
                parser.error(f"{option}: task {task.name} reads no data file (it generates its pairs)")
            task = dataclasses.replace(task, **{name: value})
    B = task.batch_size
    with tempfile.TemporaryDirectory(prefix="lit-prunedpo-study-") as work_dir:  # generated files, read once by setup
        try:
            dm = task.datamodule(Path(work_dir))
        except FileNotFoundError as exc:  # a data file or tokenizer not where the task was told to look
            parser.error(str(exc))
    try:
        eval_pairs = sum(b.num_pairs for b in eval_batches(dm, opt["max_eval_pairs"]))
    except ValueError as exc:
        parser.error(f"task {task.name}: {exc}")

    # arms: vanilla, each pruned mode at the task's batch, prune-early and compute-matched variants
    modes = ["vanilla"] + [m for m in args.modes if m != "vanilla"]
    pruned = modes[1:]
    dims = ModelDims.from_model(task.policy(0).build())
    sample = [b for _, b in zip(range(8), dm.train_dataloader())]
    speedups = {m: ideal_speedup(m, sample, dims) for m in pruned}
    base = [Arm(m, B) for m in modes]
    enlarged = [Arm(m, matched_batch_size(B, speedups[m]), matched=True) for m in pruned if args.matched]
    enlarged = [a for a in enlarged if a.batch_size > B and args.memory_budget_mb is None]

    # calibration: measured step costs, the cost-matched vanilla batch per mode, each arm's schedule length
    probes = [Arm("vanilla", b) for b in vanilla_probe_sizes(B)]
    log(f"calibration: {opt['calibration_steps']} timed steps of {len(probes) + len(pruned) + len(enlarged)} arms")
    def measure(arms: list[Arm]) -> dict:  # step costs and peak step memory, from the first verdict seed's weights
        return measure_step_costs(task, arms, dm, opt["calibration_steps"], warmup=1, seed=seeds[0], memory=True)

    costs = measure(probes + base[1:] + enlarged)
    line = fit_line({a.batch_size: costs[a].on(args.clock) for a in probes})
    vanilla_cost = lambda b: max(line[0] + line[1] * b, 1e-9)  # noqa: E731 - the fitted line; never 0 (it divides)
    fitted = {b: vanilla_cost(b) for b in range(1, B + 1)}
    controls, cost_matched, matched_info = {}, {}, {}
    for m in pruned:
        target = costs[Arm(m, B)].on(args.clock)
        b = cost_matched_batch(fitted, target)
        matched_info[m] = {"pruned_cost_s": target, "batch": b, "vanilla_cost_at_batch_s": fitted[b],
                           "flop_speedup": speedups[m], "flop_batch": flop_matched_batch(B, speedups[m]),
                           "measured_speedup": vanilla_cost(B) / target}
        if b < B:  # else the pruned step is no cheaper: same-batch vanilla is its own cost-matched control
            cost_matched.setdefault(Arm("vanilla", b, cost_matched=True), vanilla_cost(b))
        controls[m] = Arm("vanilla", b, cost_matched=b < B).name
    memory, same_batch_reference = None, True
    if args.memory_budget_mb is not None:
        from lit_prunedpo.callbacks import PeakMemoryMeter
        from lit_prunedpo.study.memory import budget_binds, fit_to_budget, not_binding_text

        log(f"memory budget {args.memory_budget_mb:g} MB: measuring peaks, and the exact variants of every arm over it")
        try:
            fit = fit_to_budget(args.memory_budget_mb, Arm("vanilla", B), base[1:], list(cost_matched), costs, measure,
                                args.clock, PeakMemoryMeter(torch.device("cpu"), settle=True).measure)
        except ValueError as exc:
            parser.error(f"--memory-budget-mb: {exc}")
        memory, same_batch_reference = fit.record, fit.same_batch_fits
        # same-batch vanilla runs as is even over the budget: it sets the targets (the fitted one computes the same steps)
        base = base[:1] + [fit.fitted.get(a, a) for a in base[1:]]
        if fit.vanilla is not None:
            cost_matched[fit.vanilla] = costs[fit.fitted[Arm("vanilla", B)]].on(args.clock)
        for m in pruned:
            controls[m] = [c.name for c in fit.controls_fitting if c.batch_size == matched_info[m]["batch"]]
            controls[m] += [fit.vanilla.name] if fit.vanilla is not None else []
            if not controls[m] and not fit.same_batch_fits:
                parser.error(f"--memory-budget-mb {args.memory_budget_mb:g}: mode {m} has no vanilla reference "
                             "within the budget")
        for name, f in memory["fits"].items():
            log(f"memory budget: {name} ({memory['peaks'][name]:.1f} MB) fitted as {f}")
        log("memory budget: references " + ", ".join(memory["references"])
            + ("; " + memory["gpu_note"] if memory["gpu_needed"] else ""))
        if not budget_binds(memory):
            log(f"warning: {not_binding_text(memory)}")
    calibration = {"clock": args.clock, "steps": opt["calibration_steps"], "warmup": 1, "seed": seeds[0],
                   "vanilla_measured": {a.batch_size: costs[a].on(args.clock) for a in probes}, "vanilla_line": list(line),
                   "arms": {a.name: dataclasses.asdict(c) for a, c in costs.items()}, "cost_matched": matched_info}
    for m, info in matched_info.items():
        log(f"calibration: {m}@{B} {info['pruned_cost_s']:.4f} {args.clock}-s/step -> cost-matched vanilla batch "
            f"{info['batch']} (FLOP model: {info['flop_batch']})")
    if B == 1 and pruned:
        log(f"warning: {ONE_PAIR_NOTE}")
    if journal is not None:
        journal.append("calibration", **calibration)
        if memory is not None:
            journal.append("memory", **memory)

    def priced(arm: Arm) -> Arm:
        own = cost_matched.get(arm) or (costs[arm].on(args.clock) if arm in costs else costs[Arm(arm.mode, B)].on(args.clock))
        return dataclasses.replace(arm, schedule_steps=schedule_steps(arm, own, vanilla_cost(arm.batch_size), budget, steps))

    early = [Arm(m, B, prune_fraction=args.prune_early) for m in pruned] if args.prune_early is not None else []
    arms = [priced(a) for a in base + [a for a in cost_matched if a not in base] + early + enlarged]
    log(f"arms: {', '.join(f'{a.name} ({a.schedule_steps} scheduled steps)' for a in arms)}; seeds {seeds}; "
        f"budget {budget:g} {args.clock}-s and {steps} steps")
    study = dict(task=task, budget_s=budget, steps=steps, clock=args.clock, dm=dm, max_eval_pairs=opt["max_eval_pairs"],
                 log=log, work_dir=args.work_dir)

    def journaled(phase: str) -> dict:
        if journal is None:
            return {}
        return {"on_point": lambda r, p: journal.point(phase, r, p), "on_done": lambda r: journal.run(phase, r)}

    swept = None
    if args.sweep:
        log(f"learning-rate sweep: {args.lr_factors} x {task.lr:g} on tuning seeds {opt['tune_seeds']}")
        arms, rows = sweep(arms, task.lr, args.lr_factors, opt["tune_seeds"], evals, **study, **journaled("sweep"))
        swept = {"factors": args.lr_factors, "seeds": opt["tune_seeds"], "window": window_of(evals), "rows": rows}
        if journal is not None:
            journal.append("sweep", **swept)
        log("chosen learning rates: " + ", ".join(f"{a.name} {a.lr:.3g}" for a in arms))
    runs = run_study(arms=arms, seeds=seeds, evals=evals, **study, **journaled("study"))
    payload = payload_of(
        runs, task.describe(), args.clock, budget, steps, evals, seeds, eval_pairs, command,
        extra={"torch_threads": args.threads, "ideal_speedups": speedups, "torch": torch.__version__,
               "warm_start": warm_start_summary(runs), "calibration": calibration, "sweep": swept, "memory": memory},
        protocol={"share": args.target_share, "resamples": args.bootstrap, "confidence": args.confidence,
                  "seed": args.bootstrap_seed, "controls": controls, "same_batch_reference": same_batch_reference},
    )
    if out is not None:
        for path in write_report(payload, out):
            log(f"wrote {path}")
    print(to_markdown(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
