"""The laboratory's console commands, each through the library's runner
(:func:`lit_prunedpo.cli.user_errors.run_command`).

``lit-prunedpo-lab {bench,scaling,study,map,paper}`` is the lab's one door (:func:`lab`); each subcommand is the
command of the same job, which stays installed under its own name (``lit-prunedpo-bench``, ...) because the
published records store and reproduce with those names. The runner says Ctrl-C, SIGTERM, a full disk and the
package's own errors in one line, with what the command kept; each function imports its command's module inside it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from lit_prunedpo.cli.user_errors import run_command

__all__ = ["LAB", "bench", "bench_scaling", "lab", "paper", "study", "study_map"]

#: the lab's package: its own checks' errors (a missing data file, a refused folder) end in one line, like the
#: library's, not in a traceback
OWN = (Path(__file__).resolve().parent,)


def _option(name: str, argv: Sequence[str] | None = None) -> str | None:
    """The value of option ``name`` (``--out X`` or ``--out=X``) in the command line, or None."""
    argv = sys.argv[1:] if argv is None else argv
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _in_out(file: str) -> str:
    """``file`` under the command's ``--out`` (or bare when it has none), for the kept texts."""
    out = _option("--out")
    return f"{out.rstrip('/')}/{file}" if out else file


def bench() -> object:
    """``lit-prunedpo-bench``: :func:`lit_prunedpo_lab.bench.cli.main`."""
    def main() -> object:
        from lit_prunedpo_lab.bench.cli import main

        return main()

    return run_command(main, own=OWN, kept="nothing was written (the report is written once every configuration "
                                            "is measured); run the command again")


def bench_scaling() -> object:
    """``lit-prunedpo-bench-scaling``: :func:`lit_prunedpo_lab.bench.scaling_cli.main`."""
    def main() -> object:
        from lit_prunedpo_lab.bench.scaling_cli import main

        return main()

    return run_command(main, own=OWN, kept="nothing was written (the report is written once every point is "
                                            "measured); run the command again")


def study() -> object:
    """``lit-prunedpo-study``: :func:`lit_prunedpo_lab.study.cli.main`."""
    def main() -> object:
        from lit_prunedpo_lab.study.cli import main

        return main()

    return run_command(main, own=OWN, kept=lambda: (
        f"{_in_out('progress.jsonl')} keeps what was measured so far (a study does not resume: run it again with "
        "--overwrite to replace it)" if _option("--out") else "nothing was written (no --out)"))


def study_map() -> object:
    """``lit-prunedpo-study-map``: :func:`lit_prunedpo_lab.study.map_cli.main`."""
    def main() -> object:
        from lit_prunedpo_lab.study.map_cli import main

        return main()

    return run_command(main, own=OWN, kept=lambda: (
        f"{_in_out('cells/')} keeps the finished cells; rerun the same command with --resume to continue"
        if _option("--out") and "--plan-only" not in sys.argv else "nothing was written"))


def paper() -> object:
    """``lit-prunedpo-paper``: :func:`lit_prunedpo_lab.study.paper_cli.main`."""
    def main() -> object:
        from lit_prunedpo_lab.study.paper_cli import main

        return main()

    def kept() -> str:
        if "report" in sys.argv[1:2]:
            return "the reports are written whole (each file or none of it); run the command again"
        return f"{_in_out('records.jsonl')} keeps finished designs; rerun with --resume to continue"

    return run_command(main, own=OWN, kept=kept)


#: ``lit-prunedpo-lab``'s subcommands: subcommand -> (the command of the same job, its entry point, what it does)
LAB = {
    "bench": ("lit-prunedpo-bench", bench,
              "time pruning modes (and TRL) side by side on the same weights and batches"),
    "scaling": ("lit-prunedpo-bench-scaling", bench_scaling,
                "the cost model's predictions against measured steps, over sizes"),
    "study": ("lit-prunedpo-study", study,
              "time to quality of pruning modes against the honest controls, on one task"),
    "map": ("lit-prunedpo-study-map", study_map,
            "the regime map: the study over a grid of cells, and AutoPruning in each"),
    "paper": ("lit-prunedpo-paper", paper, "the paper's epoch-matched cells: run, report, reproduce, compare"),
}


def lab() -> object:
    """``lit-prunedpo-lab``: the laboratory's one command, ``lit-prunedpo-lab {bench,scaling,study,map,paper} ...``.

    Each subcommand is the command of the same job, with the same arguments (``lit-prunedpo-lab bench --help``);
    those five commands stay installed under their own names, which the published records store and reproduce
    with, and a record written through the lab names them too."""
    argv = sys.argv[1:]
    usage = "usage: lit-prunedpo-lab {" + ",".join(LAB) + "} [arguments]"
    if argv[:1] in (["-h"], ["--help"]):
        print("\n".join([usage, "", "The laboratory's measurements; each subcommand takes --help.", ""]
                        + [f"  {name:<8} {job}" for name, (_, _, job) in LAB.items()]))
        return None
    if not argv or argv[0] not in LAB:
        said = f"unknown subcommand {argv[0]!r}" if argv else "a subcommand is required"
        print(f"{usage}\nlit-prunedpo-lab: error: {said} (choose from {', '.join(LAB)})", file=sys.stderr)
        raise SystemExit(2)
    command, entry, _ = LAB[argv[0]]
    sys.argv = [command, *argv[1:]]
    return entry()
