"""``lit-prunedpo-study``'s command line: argument types that check every number while parsing, the parser, and
:class:`StudyOptions`, what a parsed command resolves to (each option given, else ``--quick``'s or the full
study's default).

The argument types are shared with the regime map's command (:mod:`lit_prunedpo_lab.study.map_cli`). A choice that
only the combination of options makes wrong (tuning seeds that are verdict seeds, ``--prune-early`` under a
memory budget) is refused by :func:`resolve_options` as a :class:`UsageError`, which the command prints the way
argparse prints its own errors.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable, Literal

from lit_prunedpo_lab.study.arms import MODES
from lit_prunedpo_lab.study.devices import check_clock_on, study_device
from lit_prunedpo_lab.study.tasks import TASKS

QUICK = {"budget": 2.0, "steps": 40, "evals": 4, "max_eval_pairs": 64, "seeds": [0, 1, 2], "tune_seeds": [100],
         "calibration_steps": 2}
DEFAULTS = {"budget": 30.0, "steps": 300, "evals": 10, "max_eval_pairs": None, "seeds": [0, 1, 2, 3, 4],
            "tune_seeds": [100, 101], "calibration_steps": 5}


class UsageError(Exception):
    """A command line that parses but cannot run; the command reports it as argparse reports a bad argument
    (usage, ``error: <message>``, exit status 2)."""


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


DESCRIPTION = ("Train every pruning mode, vanilla and the cost-matched vanilla control from the same weights on the "
               "same data, each at its own swept learning rate, for the same training time and steps, over several "
               "seeds; report time to a share of vanilla's best improvement, with bootstrap intervals and verdicts.")


def _add_budget_options(a: Callable[..., object]) -> None:
    """The options of how each run trains: its budgets, evaluations, clock, precision and batch."""
    a("--budget", type=real(0.0), default=None, help="training seconds per run on --clock (default 30)")
    a("--steps", type=count(1), default=None, help="the same-steps budget (default 300)")
    a("--evals", type=count(1), default=None, help="exact evaluations per budget (default 10)")
    a("--clock", choices=("cpu", "wall"), default="cpu",
      help="the clock budgets and ratios use: process CPU seconds (default; steady on a shared machine) or wall")
    a("--precision", default="32-true", choices=("32-true", "bf16-mixed"),
      help="every run's, the calibration's and every evaluation's forward: 32-true (default) or bf16-mixed (float32 "
           "weights, the forward under bfloat16 autocast, as Lightning's)")
    a("--batch-size", type=count(1), default=None, help="the same-batch arm's pairs per step (default: the task's)")
    a("--seeds-at-once", type=count(1), default=None, metavar="K",
      help="train the seeds K at a time, one group after another (the sweep's tuning seeds too): the memory of K "
           "seeds' runs instead of all of them, for a large model; a seed's arms still alternate step by step "
           "(default: every seed at once)")
    a("--device", default="cpu",
      help="where every run trains and evaluates: cpu (default) or cuda[:N]; on a GPU pass --clock wall (its CPU "
           "clock times the host's launches, not the work)")


def _add_data_options(a: Callable[..., object]) -> None:
    """The options of what a task reads: its data file, tokenizer or pretrained model, and lengths."""
    a("--data-path", default=None, metavar="FILE",
      help="the task's data file (tasks that read one: hh-rlhf, smollm2-hh; default: "
           "shared/data/hh-rlhf/harmless-base-test.jsonl.gz beside the repository)")
    a("--tokenizer", default=None, help="the task's tokenizer, a folder or hub name (hh-rlhf; default: "
                                        "shared/tokenizers/gpt2 beside the repository)")
    a("--model", default=None, metavar="NAME_OR_PATH",
      help="the pretrained model, tokenizer included: a folder, a hub name or a .gguf file (smollm2-hh; default: "
           "shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf beside the repository)")
    a("--max-length", type=count(2), default=None, metavar="TOKENS",
      help="tokens per sequence, prompt and response (tasks that read a data file; default: the task's)")
    a("--max-prompt-length", type=count(1), default=None, metavar="TOKENS",
      help="the prompt's last tokens kept, below --max-length (tasks that read a data file; default: the task's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lit-prunedpo-study", description=DESCRIPTION)
    a = parser.add_argument
    a("--task", default="quickstart", choices=sorted(TASKS), help="data and model (default: quickstart)")
    a("--modes", type=mode_list, default=list(MODES),
      help=f"comma-separated, from {','.join(MODES)}; vanilla is always run")
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
    _add_budget_options(a)
    a("--max-rows", type=count(2), default=None,
      help="use only the first N rows of the task's data (held-out share included)")
    a("--max-eval-pairs", type=count(1), default=None,
      help="evaluate on the first N held-out pairs only (default: all)")
    a("--lr", type=real(0.0), default=None, help="the base DPO learning rate (AdamW) the sweep multiplies "
                                                 "(default: the task's; the warm start keeps its own)")
    a("--warm-start-steps", type=count(0), default=None, metavar="N",
      help="supervised steps on the training split's chosen responses before DPO, cached per seed under "
           "--work-dir; every arm of a seed starts from them (default: the task's; 0: none)")
    _add_data_options(a)
    a("--work-dir", default="study_results/work", help="where warm starts are cached (default: study_results/work)")
    a("--quick", action="store_true", help="a minutes-long study with fewer seeds: "
      + ", ".join(f"{k} {v}" for k, v in QUICK.items()) + " unless given")
    a("--memory-budget-mb", type=real(0.0), default=None, metavar="MB",
      help="cap on each arm's measured peak step memory (MiB above the step's start: peak live tensor storage, "
           "CUDA's max_memory_allocated); arms over it are fitted their fastest exact way (chunked scorer, "
           "checkpointing, gradient accumulation) and vanilla so fitted joins the controls (default: no budget; peaks "
           "are still measured and reported)")
    a("--threads", type=count(1), default=1, help="torch threads (default 1: CPU seconds then measure work)")
    a("--out", default=None, help="folder for progress.jsonl (written as the study goes), study.json, study.md, "
                                  "study.png; created and test-written before any training (default: print the table)")
    a("--overwrite", action="store_true", help="replace an earlier study's records in --out (progress.jsonl, "
                                                  "study.json, study.md, study.png; removed before this study starts); "
                                                  "without it such a folder is refused")
    a("--quiet", action="store_true", help="no progress lines")
    return parser


@dataclass(frozen=True)
class StudyOptions:
    """What the study runs, resolved from a parsed command line (each option given, else the defaults of
    ``--quick`` or of the full study). The task's own settings (``--batch-size``, ``--lr``...) are not here:
    they replace the task's fields (:func:`lit_prunedpo_lab.study.cli.task_of`)."""

    modes: list[str]
    """``vanilla`` first, then the pruned modes asked for."""
    matched: bool
    prune_early: float | None
    memory_budget_mb: float | None
    seeds: list[int]
    tune_seeds: list[int]
    sweep: bool
    lr_factors: list[float]
    budget: float
    steps: int
    evals: int
    clock: Literal["cpu", "wall"]
    calibration_steps: int
    max_eval_pairs: int | None
    target_share: float
    bootstrap: int
    confidence: float
    bootstrap_seed: int
    precision: str = "32-true"
    """Every run's, the calibration's and every evaluation's (a key of ``lit_prunedpo_lab.study.runner.PRECISIONS``)."""
    device: str = "cpu"
    """Where every run, the calibration and every evaluation run: ``cpu`` or ``cuda[:N]``."""
    seeds_at_once: int | None = None
    """How many seeds train together (None: all of them); the study's and the sweep's."""

    @property
    def pruned(self) -> list[str]:
        return self.modes[1:]


def resolve_options(args: argparse.Namespace) -> StudyOptions:
    """The options of a parsed command line, the defaults filled in.

    Raises:
        UsageError: if the tuning seeds share a verdict seed (with the sweep on), ``--prune-early`` comes with
            ``--memory-budget-mb``, the device is not here, or the CPU clock is asked for on a GPU.
    """
    defaults = QUICK if args.quick else DEFAULTS
    opt = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in {**DEFAULTS, **defaults}.items()}
    seeds = opt["seeds"]
    if args.sweep and set(opt["tune_seeds"]) & set(seeds):
        raise UsageError(f"--tune-seeds {opt['tune_seeds']} and --seeds {seeds} share "
                         f"{sorted(set(opt['tune_seeds']) & set(seeds))}: the sweep must run on seeds the verdict does "
                         "not use")
    try:
        check_clock_on(study_device(args.device), args.clock)
    except ValueError as err:
        raise UsageError(f"--device {args.device}: {err}") from None
    if args.memory_budget_mb is not None and args.prune_early is not None:
        raise UsageError("--prune-early cannot be combined with --memory-budget-mb: a prune-early arm's peak changes "
                         "when it turns exact, so it cannot be fitted to one budget")
    return StudyOptions(
        modes=["vanilla"] + [m for m in args.modes if m != "vanilla"], matched=args.matched,
        prune_early=args.prune_early,
        memory_budget_mb=args.memory_budget_mb, seeds=seeds, tune_seeds=opt["tune_seeds"], sweep=args.sweep,
        lr_factors=args.lr_factors, budget=opt["budget"], steps=opt["steps"], evals=opt["evals"], clock=args.clock,
        calibration_steps=opt["calibration_steps"], max_eval_pairs=opt["max_eval_pairs"],
        target_share=args.target_share,
        bootstrap=args.bootstrap, confidence=args.confidence, bootstrap_seed=args.bootstrap_seed,
        precision=args.precision, device=args.device, seeds_at_once=args.seeds_at_once,
    )
