"""``lit-prunedpo-paper``: the method's published claim in its own form (epoch-matched) and its Pareto frontier.

Examples::

    lit-prunedpo-paper cell --task edited --family llama --seeds 0,1,2,3,4 --out paper_results/edited-llama
    lit-prunedpo-paper cell --task hh-rlhf --family gpt2 --max-rows 1024 --warm-start-steps 100 --pareto \\
        --out paper_results/hh-rlhf-gpt2
    lit-prunedpo-paper report paper_results/edited-llama paper_results/hh-rlhf-gpt2 --out docs/paper
    lit-prunedpo-paper reproduce docs/records/paper-results/cells/hh-rlhf-llama --seeds 30,31,32,33,34 \
        --designs branch \
        --out paper_results/hh-rlhf-llama-again

``cell`` trains every design of one (task, model family) for the same number of epochs from each seed
(:mod:`lit_prunedpo_lab.study.epochs`) and writes ``records.jsonl`` (one line per finished design and seed, as they
finish: a stopped cell keeps them, ``--resume`` reruns only the seeds missing some, and is refused, naming each,
when the records ran with other settings: :func:`resume_refusal`) and ``cell.json``. ``report`` reads cells and
writes ``paper.json``, ``paper.md`` and ``paper.png`` (:mod:`lit_prunedpo_lab.study.paper_report`), naming the seeds
a stopped cell lacks. ``reproduce`` re-runs a cell's stored command on other seeds and ``compare`` says, one line per
figure, whether the new interval overlaps the published one (:mod:`lit_prunedpo_lab.study.paper_reproduce`).
Exit status: 0 done, 1 an error while running (or, for ``reproduce`` and ``compare``, a figure that did not
reproduce), 2 bad arguments or a folder it will not use as asked.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from lit_prunedpo_lab.study.arguments import count
from lit_prunedpo_lab.study.epochs import PARETO_DESIGNS, TABLE_DESIGNS

CELL_FILES = ("records.jsonl", "cell.json")
#: ``cell`` options that decide no record's result: where it writes, what it says, and which designs and seeds run
#: (a record is one design and one seed, named in it): ``--resume`` compares every other one.
NOT_RESULTS = frozenset({"command", "out", "resume", "overwrite", "quiet", "seeds", "designs", "pareto"})


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds needs at least 2 different seeds (intervals), got {text!r}")
    return seeds


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    from lit_prunedpo_lab.study.tasks import FAMILIES, TASKS

    parser = argparse.ArgumentParser(prog="lit-prunedpo-paper", description=__doc__.split("\n")[0].split(": ", 1)[1])
    commands = parser.add_subparsers(dest="command", required=True)
    cell = commands.add_parser("cell", help="train every design of one task and model family for the same epochs")
    cell.add_argument("--task", required=True, choices=sorted(TASKS), help="a study task (lit-prunedpo-study --help)")
    cell.add_argument("--family", default="llama", choices=FAMILIES, help="the model family, at the task's sizes")
    cell.add_argument("--seeds", type=_seeds, default=[0, 1, 2, 3, 4], help="comma-separated (default 0,1,2,3,4)")
    cell.add_argument("--epochs", type=_positive(float), default=1.0, help="epochs every design trains (default 1)")
    cell.add_argument("--designs", default=";".join(TABLE_DESIGNS[1:]),
                      help="semicolon-separated designs MODE[:arg=value,...][@BATCH|@x2|@/2][/EPOCHS] beside vanilla "
                           f"(default: the table's, {';'.join(TABLE_DESIGNS[1:])}); commas separate a design's "
                           "arguments")
    cell.add_argument("--pareto", action="store_true", help="add the sampling-ratio grid and vanilla's frontier: "
                      + "; ".join(PARETO_DESIGNS))
    cell.add_argument("--max-rows", type=_positive(int), default=None, help="only the data's first rows (default all)")
    cell.add_argument("--warm-start-steps", type=count(0), default=None,
                      help="the task's warm start, in steps (default: the task's)")
    cell.add_argument("--lr", type=_positive(float), default=None,
                      help="the learning rate of every design (default: the task's)")
    cell.add_argument("--batch-size", type=_positive(int), default=None,
                      help="vanilla's pairs per step, and every design's without @BATCH (default: the task's)")
    cell.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"],
                      help="Lightning's meaning: float32 weights, bf16-mixed runs each step's forward and every "
                           "evaluation under bfloat16 autocast (default 32-true)")
    cell.add_argument("--evals", type=_positive(int), default=2,
                      help="exact evaluations per run besides step 0 (default 2)")
    cell.add_argument("--probe-steps", type=count(0), default=5,
                      help="metered steps per design after training (0: none)")
    cell.add_argument("--threads", type=_positive(int), default=1,
                      help="torch CPU threads (default 1: CPU seconds are then the work a step did)")
    cell.add_argument("--out", required=True, help="the cell's folder")
    cell.add_argument("--resume", action="store_true",
                      help="keep the folder's records, run only the seeds missing some (refused if they ran with "
                           "other settings than these; --seeds and --designs may differ)")
    cell.add_argument("--overwrite", action="store_true", help="replace an earlier cell in --out")
    cell.add_argument("--quiet", action="store_true", help="no progress lines")
    report = commands.add_parser("report", help="the table, the frontier and the plot from cells")
    report.add_argument("cells", nargs="+", help="cell folders (each with cell.json and records.jsonl)")
    report.add_argument("--out", required=True, help="folder for paper.json, paper.md, paper.png")
    again = commands.add_parser("reproduce", help="re-run a cell's stored command on other seeds and compare")
    again.add_argument("cell", help="the published cell's folder (its cell.json holds the command)")
    again.add_argument("--seeds", type=_seeds, required=True, help="comma-separated seeds, e.g. 30,31,32,33,34")
    again.add_argument("--designs", default=None, help="only these designs beside vanilla (as cell's --designs; "
                       "default: the stored command's)")
    again.add_argument("--out", required=True, help="the new cell's folder (continued if it holds a stopped run)")
    compare = commands.add_parser("compare", help="say which figures of a cell another cell reproduces")
    compare.add_argument("published", help="the published cell's folder")
    compare.add_argument("new", help="the new cell's folder")
    return parser


def provenance(argv: Sequence[str], seeds: Sequence[int]) -> dict[str, Any]:
    """Command, commit (``+dirty`` with uncommitted changes), date and machine of this run."""
    import torch

    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True,
                                timeout=10).stdout.strip() or "unknown (not a git checkout)"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        commit = "unknown (git not found)"
    machine = f"{platform.machine()} {os.cpu_count()} CPUs, {platform.system()}, torch {torch.__version__}, " \
              f"{torch.get_num_threads()} torch thread(s)"
    return {"command": shlex.join(["lit-prunedpo-paper", *argv]), "commit": commit, "machine": machine,
            "seeds": list(seeds),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def cell_settings(argv: Sequence[str]) -> dict[str, Any]:
    """What decides a cell's records: its ``cell`` arguments as this command parses them, without
    :data:`NOT_RESULTS`.

    Raises:
        ValueError: if the arguments cannot be parsed.
    """
    from lit_prunedpo_lab.study.map_resume import parse_recorded

    parsed = parse_recorded(build_parser(), argv, "its command")
    return {k: v for k, v in vars(parsed).items() if k not in NOT_RESULTS}


def resume_refusal(out: Path, argv: Sequence[str]) -> tuple[str | None, list[int]]:
    """Why ``out``'s cell cannot be resumed with the arguments ``argv`` (``None``: it can: no ``cell.json`` yet, or
    the same settings, :func:`~lit_prunedpo_lab.study.map_resume.setting_changes`), and the seeds it asked for. A
    ``cell.json`` that is corrupt, or records no command this command can parse, is refused too.
    """
    from lit_prunedpo_lab.study.map_resume import setting_changes
    from lit_prunedpo_lab.study.outputs import Refused, read_json

    path, remedy = out / "cell.json", "rerun the cell with --overwrite, or choose another --out"
    if not path.exists():
        return None, []
    try:
        cell = read_json(path, remedy)
        command = cell.get("provenance", {}).get("command", "") if isinstance(cell, dict) else ""
        had = cell_settings(shlex.split(command)[1:])
    except Refused as exc:
        return str(exc), []
    except ValueError as exc:
        return f"{path}: {exc}; {remedy}", []
    changes = setting_changes(had, cell_settings(argv))
    seeds = [int(s) for s in cell["provenance"].get("seeds", [])]
    if not changes:
        return None, seeds
    return (f"--resume: the records in {out} ran with other settings than this run's: {'; '.join(changes)}; reusing "
            "them would report their results under settings they did not run with. Resume with the first run's "
            "settings, or --overwrite the cell (or choose another --out) to run it afresh with these"), seeds


def run_cell_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import torch

    from lit_prunedpo_lab.study import epochs
    from lit_prunedpo_lab.study.outputs import append_line, claim_folder, read_journal, write_atomic
    from lit_prunedpo_lab.study.tasks import TASKS

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as held:
        earlier = claim_folder(out, "paper cell", CELL_FILES, held)
        if earlier and not (args.resume or args.overwrite):
            print(f"error: --out {out} holds an earlier cell ({', '.join(earlier)}): --resume it or --overwrite it",
                  file=sys.stderr)
            return 2
        if args.overwrite:
            for name in earlier:
                (out / name).unlink()
        refusal, asked = resume_refusal(out, argv) if args.resume else (None, [])
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
            return 2
        task = epochs.cell_task(TASKS[args.task], args.family, args.max_rows, args.warm_start_steps, lr=args.lr,
                                batch_size=args.batch_size)
        dm = task.datamodule(out)
        texts = [t for t in args.designs.split(";") if t.strip()] + (list(PARETO_DESIGNS) if args.pareto else [])
        try:
            designs = epochs.make_designs(texts, task, len(dm.train_dataset), args.epochs)
        except ValueError as error:
            print(f"error: --designs: {error}", file=sys.stderr)
            return 2
        done_records, _ = read_journal(out / "records.jsonl") if args.resume else ([], 0)
        done = {(r["design"], int(r["seed"])) for r in done_records}
        cell = {"name": task.name, "task": task.describe(), "family": args.family, "epochs": args.epochs,
                "precision": args.precision,
                "vanilla": designs[0].label, "designs": [d.label for d in designs],
                "steps": {d.label: d.arm.schedule_steps for d in designs}, "train_pairs": len(dm.train_dataset),
                "provenance": provenance(argv, sorted(set(asked) | set(args.seeds)))}
        write_atomic(out / "cell.json", json.dumps(cell, indent=1))
        log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        if log:
            log(f"{task.name}: {len(designs)} designs x {len(args.seeds)} seeds, {args.epochs:g} epoch(s) of "
                f"{len(dm.train_dataset)} pairs: " + ", ".join(f"{d.label} ({d.arm.schedule_steps} "
                                                               "steps)" for d in designs))
        epochs.run_cell(task, dm, designs, args.seeds, out, evals=args.evals, probe_steps=args.probe_steps, log=log,
                        on_record=lambda r: append_line(out / "records.jsonl", json.dumps(r)), done=done,
                        precision=args.precision)
    print(f"wrote {out / 'cell.json'}, {out / 'records.jsonl'}", file=sys.stderr)
    return 0


def run_report_command(args: argparse.Namespace) -> int:
    from lit_prunedpo_lab.study import paper_report
    from lit_prunedpo_lab.study.outputs import Refused, write_atomic

    folders = [Path(c) for c in args.cells]
    missing = [str(f) for f in folders if not (f / "cell.json").is_file()]
    if missing:
        print(f"error: not a cell folder (no cell.json): {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        cells = [paper_report.summarise_cell(paper_report.load_cell(f)) for f in folders]
    except (Refused, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    summary = {"cells": cells, "table_modes": list(TABLE_DESIGNS)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "paper.json", json.dumps(summary, indent=1))
    write_atomic(out / "paper.md", paper_report.to_markdown(summary))
    written = ["paper.json", "paper.md"]
    try:
        fig = paper_report.figure(summary)
    except ImportError:
        print("paper.png skipped: matplotlib is not installed (pip install 'matplotlib>=3.7')", file=sys.stderr)
    else:
        fig.savefig(out / "paper.png", dpi=110)
        written.append("paper.png")
    print(f"wrote {', '.join(str(out / name) for name in written)}", file=sys.stderr)
    return 0


def run_reproduce_command(args: argparse.Namespace) -> int:
    from lit_prunedpo_lab.study import paper_reproduce
    from lit_prunedpo_lab.study.outputs import Refused

    out = Path(args.out)
    try:
        stored = paper_reproduce.stored_argv(Path(args.cell))
    except (Refused, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if Path(out).resolve() == Path(args.cell).resolve():
        print(f"error: --out {out} is the published cell itself: choose another folder", file=sys.stderr)
        return 2
    argv = paper_reproduce.reproduction_argv(stored, args.seeds, out, args.designs, (out / "cell.json").exists())
    print(f"running: {shlex.join(['lit-prunedpo-paper', *argv])}", file=sys.stderr)
    code = main(argv)
    return code or paper_reproduce.compare_cells(Path(args.cell), out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "cell":
        return run_cell_command(args, argv)
    if args.command == "reproduce":
        return run_reproduce_command(args)
    if args.command == "compare":
        from lit_prunedpo_lab.study.paper_reproduce import compare_cells

        return compare_cells(Path(args.published), Path(args.new))
    return run_report_command(args)


if __name__ == "__main__":
    sys.exit(main())
