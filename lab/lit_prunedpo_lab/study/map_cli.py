"""``lit-prunedpo-study-map``: the regime map (docs/time-to-quality.md), the study's protocol on every cell of a grid.

Examples::

    lit-prunedpo-study-map --plan-only                         # the default map's plan: cells, budget, total
    lit-prunedpo-study-map --out study_results/map             # the default map (13 cells), fitted to 90 min on 2 cores
    lit-prunedpo-study-map --spec hh-rlhf --limit-minutes 60 --out study_results/map-hh
    lit-prunedpo-study-map --quick --out study_results/map-quick
    lit-prunedpo-study-map --spec my-map.yaml --budget 20 --limit-minutes 240 --out study_results/my-map
    lit-prunedpo-study-map reproduce docs/records/study/map --seeds 30,31,32,33,34 --tune-seeds 200 --out map-again
    lit-prunedpo-study-map compare docs/records/study/map map-again    # one line per verdict: do the intervals overlap

The grid (:mod:`lit_prunedpo_lab.study.map_spec`): response length, the LM head's share of a step, batch size and
pair similarity on generated tasks with a known best accuracy (:mod:`lit_prunedpo_lab.study.map_tasks`), and
HH-RLHF with longer responses. Before anything trains, every cell is probed and the map's total is planned
(:mod:`lit_prunedpo_lab.study.map_plan`); without ``--budget`` the training budget per run is the largest that
keeps the plan within ``--limit-minutes`` (90; ``--quick``: 5), and a ``--budget`` whose plan exceeds the
limit is refused. Then, per cell:

1. the **noise model** (:mod:`lit_prunedpo_lab.study.noise`) at the cell's initial weights (seed = the first
   verdict seed; for HH-RLHF its warm start): between-pair variance and each mode's extra within-pair
   variance, through the module's own step; and the LM head's share of a vanilla step (cost model);
2. the **study** (``lit-prunedpo-study``'s protocol: calibration with the cost-matched vanilla control,
   learning-rate sweep, seeds, bootstrap intervals, verdicts) with its report under ``--out/cells/<cell>/``;
3. **auto** (:mod:`lit_prunedpo_lab.study.map_auto`): what the ``AutoPruning`` callback's calibration picks in the
   cell, and its time to the loss target against same-batch vanilla, calibration included.

``map.json`` and ``map.md`` (:mod:`lit_prunedpo_lab.study.map_report`) are rewritten after every cell and
``progress.jsonl`` appended (the plan, each cell's noise, each finished or failed cell), so a killed map keeps
its finished cells; ``--resume`` reuses them (a cell with both ``study.json`` and ``noise.json``; a reused cell
without ``auto.json`` is calibrated for it; an unfinished one is run again, replacing its partial records) and
appends to the journal.

**Resuming with other settings** is refused (:mod:`.map_resume`): a finished cell's settings are read
back from its records (the ``lit-prunedpo-study`` command in ``study.json``, parsed as the study parses it, and the
seed, pairs and draws in ``noise.json``) and compared with the ones this run would give it; any that differ
(``--steps``, ``--evals``, seeds, modes, learning-rate factors, bootstrap resamples, threads, the cell's memory budget,
noise pairs or draws...) stop the map before anything runs, naming each ``old -> new``, since reused cells would be
reported under settings they did not run with. Options that change no result (``--jobs``, ``--quiet``,
``--work-dir``, ``--limit-minutes``) do not. Without ``--budget`` a resumed map keeps the first run's budget (its
plan in ``progress.jsonl``), not a new fit to freshly timed probes. A record that is not valid JSON is refused
naming the file (delete that cell's folder to run it again).

**The output folder** (:mod:`lit_prunedpo_lab.study.outputs`) is locked for the whole run (``--out/.lock``): a second
map into it while the first runs is refused, naming the first's process. A folder holding an earlier map
(``progress.jsonl``, ``map.json``, ``cells/``...) is refused without ``--resume``. Every record and report is
written whole (a temporary file renamed into place); a cut-off last line of ``progress.jsonl`` (a kill while
appending) is dropped on resume; a file that cannot be written (a full disk) stops the map with one line naming
it. These errors print ``error: ...``; the exit status is 2 when nothing ran, 1 when the map stopped or a cell
failed.

A memory budget over every arm's measured peak binds nothing: the cell's row and ``map.md`` say so (the memory
axis decides nothing there). A batch of 1 pair is refused by the spec (:mod:`lit_prunedpo_lab.study.map_spec`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from lit_prunedpo_lab.study import map_reproduce
from lit_prunedpo_lab.study.arguments import UsageError, count, factor_list, mode_list, real, seed_list
from lit_prunedpo_lab.study.map_cells import run_cell, study_argv
from lit_prunedpo_lab.study.map_resume import cell_settings, resume_conflicts
from lit_prunedpo_lab.study.outputs import OutputError, Refused, claim_folder

MAP_DEFAULTS: dict[str, Any] = {"steps": 10, "evals": 5, "max_eval_pairs": 32, "seeds": [0, 1, 2, 3, 4],
                                "tune_seeds": [100], "calibration_steps": 3, "noise_pairs": 16, "noise_draws": 24,
                                "limit_minutes": 90.0}
MAP_QUICK: dict[str, Any] = {"steps": 10, "evals": 3, "max_eval_pairs": 32, "seeds": [0, 1, 2], "tune_seeds": [100],
                             "calibration_steps": 2, "noise_pairs": 8, "noise_draws": 8, "limit_minutes": 5.0,
                             "budget": 1.0}
#: What a map writes under ``--out``; any of them there means an earlier map (refused without ``--resume``).
MAP_FILES = ("progress.jsonl", "map.json", "map.md", "map.png", "cells")

Log = Callable[[str], None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lit-prunedpo-study-map",
        description="Run the time-to-quality protocol of lit-prunedpo-study on every cell of a regime map (response "
                    "length, LM head share, batch size, pair similarity), with the noise model's prediction beside "
                    "each verdict.",
    )
    a = parser.add_argument
    a("--spec", default=None, help="a built-in map (default, quick, hh-rlhf) or a YAML or JSON spec file (modes and "
                                   "blocks; see lit_prunedpo_lab/study/map_spec.py); default: 'default' "
                                   "(--quick: 'quick')")
    a("--modes", type=mode_list, default=None, help="pruned modes, comma-separated (replaces the spec's)")
    a("--quick", action="store_true", help="a map of minutes: the quick spec and " + ", ".join(f"{k} {v}" for k,
                                                                                               v in MAP_QUICK.items()))
    a("--budget", type=real(0.0), default=None,
      help="training CPU-s per run; default: the largest that fits --limit-minutes")
    a("--limit-minutes", type=real(0.0), default=None,
      help="the planned total may not exceed this (default 90; --quick 5)")
    a("--steps", type=count(1), default=None, help=f"the same-steps budget per run (default {MAP_DEFAULTS['steps']})")
    a("--evals", type=count(1), default=None, help=f"exact evaluations per budget (default {MAP_DEFAULTS['evals']})")
    a("--seeds", type=seed_list, default=None, help="verdict seeds (default 0,1,2,3,4)")
    a("--tune-seeds", type=seed_list, default=None, help="the learning-rate sweep's seeds (default 100)")
    a("--lr-factors", type=factor_list, default=[0.5, 1.0, 2.0], help="the sweep's multiples of each task's rate")
    a("--no-sweep", dest="sweep", action="store_false", help="every arm at the task's rate")
    a("--max-eval-pairs", type=count(1), default=None,
      help=f"held-out pairs per evaluation (default {MAP_DEFAULTS['max_eval_pairs']})")
    a("--calibration-steps", type=count(1), default=None, help="timed calibration steps per arm (default 3)")
    a("--bootstrap", type=count(100), default=2000, help="bootstrap resamples per interval (default 2000)")
    a("--noise-pairs", type=count(2), default=None, help="pairs of the noise model's batch (default 16)")
    a("--noise-draws", type=count(1), default=None, help="pruned steps per mode in the noise model (default 24)")
    a("--threads", type=count(1), default=1, help="torch threads per cell (default 1)")
    a("--jobs", type=count(1), default=2, help="cells run at once, one process each (default 2: the 2 cores the map is "
                                              "planned for); the plan's wall time is the longest queue's")
    a("--work-dir", default=None, help="warm-start cache (default: --out/work)")
    a("--out", default=None,
      help="folder for map.json, map.md, progress.jsonl and cells/<cell>/ (required unless --plan-only)")
    a("--plan-only", action="store_true", help="probe the cells, print the plan and stop")
    a("--resume", action="store_true", help="reuse cells already finished under --out (refused if they ran with other "
                                            "settings; without --budget, the first run's budget)")
    a("--quiet", action="store_true", help="no progress lines")
    return parser


def claim_map_folder(out: Path, resume: bool, held: contextlib.ExitStack) -> None:
    """Lock ``out`` for this map (held by ``held``); without ``resume`` refuse a folder holding an earlier map.

    Raises:
        Refused: another map runs there (its process named), or an earlier map's outputs are there.
    """
    earlier = claim_folder(out, "map", MAP_FILES, held)
    if earlier and not resume:
        raise Refused(f"--out {out} holds an earlier map ({', '.join(earlier)}): pass --resume to go on with it (with "
                      "its settings), or choose another --out")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the map described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status. An output folder
    refused, a resume with other settings or a file that cannot be written is one ``error:`` line (status 2 when
    nothing ran, 1 when the map stopped). ``reproduce`` and ``compare`` first: :mod:`.map_reproduce`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["reproduce"], ["compare"]):
        return map_reproduce.main(argv, main)
    try:
        with contextlib.ExitStack() as held:  # --out's lock, released however the map ends
            return _map(argv, held)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except OutputError as exc:
        print(f"error: {exc}; the map stopped: the finished cells are kept, rerun the same command with --resume once "
              "the file can be written", file=sys.stderr)
        return exc.status


def _map(argv: Sequence[str] | None, held: contextlib.ExitStack) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run_map(args, "lit-prunedpo-study-map " + " ".join(argv), held)
    except UsageError as exc:
        parser.error(str(exc))


@dataclass(frozen=True)
class MapSetup:
    """A parsed command line resolved: its options (given, else ``--quick``'s or the map's defaults), the spec and
    the pruned modes it runs, and ``--out``."""

    opt: dict[str, Any]
    """``steps``, ``evals``, ``seeds``, ``budget``... (:data:`MAP_DEFAULTS`, :data:`MAP_QUICK`)."""
    spec: Any
    modes: list[str]
    out: Path | None


def resolve(args: argparse.Namespace) -> MapSetup:
    """The map a parsed command line describes.

    Raises:
        UsageError: tuning seeds that are verdict seeds, no ``--out`` (and no ``--plan-only``), a spec that cannot
            be read, or ``vanilla`` among ``--modes``.
    """
    defaults = {**MAP_DEFAULTS, **(MAP_QUICK if args.quick else {})}
    opt = {k: getattr(args, k, None) if getattr(args, k, None) is not None else v for k,
           v in {**defaults, "budget": defaults.get("budget")}.items()}
    if args.sweep and set(opt["tune_seeds"]) & set(opt["seeds"]):
        raise UsageError(f"--tune-seeds {opt['tune_seeds']} and --seeds {opt['seeds']} overlap: the sweep must run on "
                         "seeds the verdict does not use")
    if args.out is None and not args.plan_only:
        raise UsageError("--out is required (the map writes map.json, map.md and every cell's study there); or "
                         "--plan-only")
    from lit_prunedpo_lab.study.map_spec import load_spec

    try:
        spec = load_spec(args.spec or ("quick" if args.quick else "default"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    modes = args.modes or spec.modes
    if "vanilla" in modes:
        raise UsageError("--modes: vanilla and its cost-matched control always run; name pruned modes only")
    return MapSetup(opt, spec, modes, Path(args.out) if args.out else None)


def _run_map(args: argparse.Namespace, command: str, held: contextlib.ExitStack) -> int:
    """The map of a parsed command line: resolved, ``--out`` claimed, planned (printed with ``--plan-only``), a resume
    checked against the finished cells, then every cell run.

    Raises:
        UsageError: the options, a cell's data or the plan's budget cannot run.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    setup = resolve(args)
    out = setup.out
    if out is not None:
        from lit_prunedpo_lab.study.report import check_writable

        try:
            check_writable(out)
        except OSError as exc:
            raise UsageError(f"--out: {exc}") from None
        if not args.plan_only:  # a plan writes nothing there; the spec file is kept beside the records
            claim_map_folder(out, args.resume, held)
            map_reproduce.keep_spec(args.spec, out)

    import torch

    from lit_prunedpo_lab.study.map_plan import plan_map

    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    torch.set_num_threads(args.threads)
    budget, plan = plan_map(setup.spec.cells, setup.modes, setup.opt, args, out, log)
    if args.plan_only:
        print(json.dumps(plan, indent=1))
        return 0
    assert out is not None
    work_dir = Path(args.work_dir) if args.work_dir else out / "work"
    if args.resume:  # before anything is written: a refused resume leaves the folder as it was
        _check_resume(setup, budget, args, work_dir)
    return _run_cells(setup, budget, plan, args, work_dir, command, log)


def _check_resume(setup: MapSetup, budget: float, args: argparse.Namespace, work_dir: Path) -> None:
    """Refuse a resume whose finished cells ran with other settings than this run gives them.

    Raises:
        Refused: naming each setting that differs (:func:`~lit_prunedpo_lab.study.map_resume.resume_conflicts`).
    """
    opt, out = setup.opt, setup.out
    assert out is not None
    noise_settings = {"seed": opt["seeds"][0], "pairs": opt["noise_pairs"], "draws": opt["noise_draws"]}
    wanted = {c.name: cell_settings(study_argv(out / "cells" / c.name, setup.modes, opt, budget, args, work_dir,
                                               c.memory_budget_mb), noise_settings) for c in setup.spec.cells}
    conflict = resume_conflicts(setup.spec.cells, out, wanted)
    if conflict:
        raise Refused(conflict)


def _run_cells(setup: MapSetup, budget: float, plan: dict[str, Any], args: argparse.Namespace, work_dir: Path,
               command: str, log: Log) -> int:
    """Run every cell (``--jobs`` at once, longest planned first), journaling and reporting each as it finishes;
    print ``map.md``; returns the exit status (1 if a cell failed)."""
    from lit_prunedpo_lab.study.report import Journal

    out, spec = setup.out, setup.spec
    assert out is not None
    journal = Journal(out, command, keep=args.resume)  # a resumed map's journal goes on after the first run's
    if journal.dropped:
        log(f"resume: dropped the cut-off last line of {journal.path} ({journal.dropped} bytes: a write the previous "
            "run did not finish)")
    journal.append("plan", **plan)
    progress = MapProgress(setup, plan, journal, command, log,
                           " ".join(study_argv(Path("cells/<cell>"), setup.modes, setup.opt, budget, args, work_dir)))
    jobs = [(cell, setup.modes, setup.opt, budget, args, out / "cells" / cell.name, work_dir) for cell in spec.cells]
    if args.jobs == 1:
        for i, job in enumerate(jobs, 1):
            log(f"cell {i}/{len(jobs)} {job[0].name}")
            progress.finished(job[0], run_cell(*job))
    else:  # one process per cell at a time, each on one core (its own torch threads)
        planned = plan["cells"]
        # longest planned first, as the plan's makespan assumes
        longest_first = sorted(jobs, key=lambda job: -planned[job[0].name]["planned_s"])
        _run_in_pool(longest_first, args.jobs, progress)
    for name in ("map.json", "map.md"):
        log(f"wrote {out / name}")
    print((out / "map.md").read_text())
    if progress.unfinished:
        print(f"error: {len(progress.unfinished)} of {len(spec.cells)} cells failed "
              f"({', '.join(progress.unfinished)}): see {out / 'progress.jsonl'}", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _ctrl_c_ignored() -> Any:
    """Ctrl-C ignored for the block, in which the cells' processes start and inherit that: Ctrl-C at a terminal
    signals every process of the map, and the map decides alone (:func:`_run_in_pool`) rather than each cell dying
    with a traceback of its own, from its first import on."""
    import signal

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _run_in_pool(jobs: list[tuple[Any, ...]], processes: int, progress: MapProgress) -> None:
    """Run ``jobs`` (:func:`.map_cells.run_cell`'s arguments) in that order, ``processes`` at once,
    each in a process of its own, recording each cell as it finishes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        with _ctrl_c_ignored():  # the processes start at the first submits
            futures = {pool.submit(run_cell, *job): job[0] for job in jobs}
        try:
            for future in as_completed(futures):
                progress.finished(futures[future], future.result())
        except Exception:  # a stopped map starts no more cells (the running ones finish)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        except BaseException:  # Ctrl-C or SIGTERM: stop now; the running cells are rerun by --resume (unfinished)
            pool.shutdown(wait=False, cancel_futures=True)
            for child in multiprocessing.active_children():
                child.terminate()
                child.join()
            raise


class MapProgress:
    """The map's cells as they finish, in the parent process: each journaled and logged, and ``map.json`` /
    ``map.md`` rewritten with every cell so far (a killed map keeps its finished cells)."""

    def __init__(self, setup: MapSetup, plan: dict[str, Any], journal: Any, command: str, log: Log,
                 study_args: str) -> None:
        self.setup, self.plan, self.journal, self.command, self.log = setup, plan, journal, command, log
        self.study_args = study_args
        self.wall0 = time.perf_counter()
        self.results: dict[str, dict[str, Any]] = {}
        self.unfinished: list[str] = []

    def finished(self, cell: Any, result: dict[str, Any]) -> None:
        """Record one cell (:func:`~lit_prunedpo_lab.study.map_cells.run_cell`'s result) and rewrite the map's report;
        a cell that found the disk full stops the map (every cell after it would fail the same way).

        Raises:
            OutputError: the cell could not write a file, the disk being full.
        """
        if result.get("error"):
            self.unfinished.append(cell.name)
            self.journal.append("cell_failed", cell=cell.name, error=result["error"])
            self.log(f"cell {cell.name}: FAILED: {result['error']}")
            if result.get("disk_full"):
                raise OutputError(errno.ENOSPC, result["error"])
        else:
            self._record(cell, result)
        self._write()

    def _record(self, cell: Any, result: dict[str, Any]) -> None:
        planned = self.plan["cells"][cell.name]["planned_s"]
        if not result["reused"]:
            self.journal.append("noise", cell=cell.name, **result["noise"])
        self.journal.append("cell", cell=cell.name, cpu_s=result["cpu_s"], planned_s=planned, rows=result["rows"])
        self.results[cell.name] = result
        self.log(f"cell {cell.name}: {result['cpu_s']:.0f} CPU-s (planned {planned:.0f}); "
                 + "; ".join(f"{r['mode']} {r['loss_verdict']} {r['loss_text']}, predicted {r['prediction']} "
                             f"({r['agreement']})"
                             for r in result["rows"])
                 + "".join(f"; auto: {r['choice']}, {r['loss_text']} of vanilla's time" for r in result["auto_rows"]))
        if any(r.get("memory_binds") is False for r in result["rows"]):
            self.log(f"warning: cell {cell.name}: its memory budget binds nothing (every arm's peak is under it): "
                     "the memory axis decides nothing in this cell")

    def _write(self) -> None:
        from lit_prunedpo_lab.study.map_plan import minutes
        from lit_prunedpo_lab.study.map_report import write_map

        cells, results, plan = self.setup.spec.cells, self.results, self.plan
        done = [c for c in cells if c.name in results]
        cpu = sum(results[c.name]["cpu_s"] for c in done)
        if cpu > plan["cpu_s"]:
            self.log(f"warning: the finished cells took {minutes(cpu)} of CPU, more than the whole map's plan "
                     f"({minutes(plan['cpu_s'])})")
        write_map({"command": self.command, "modes": self.setup.modes, "plan": plan,
                   "rows": [r for c in done for r in results[c.name]["rows"]],
                   "auto_rows": [r for c in done for r in results[c.name]["auto_rows"]],
                   "unfinished": self.unfinished, "cells_done": len(done), "cells": len(cells), "elapsed_min": cpu / 60,
                   "elapsed_wall_min": (time.perf_counter() - self.wall0) / 60, "study_args": self.study_args},
                  self.setup.out)


if __name__ == "__main__":
    raise SystemExit(main())
