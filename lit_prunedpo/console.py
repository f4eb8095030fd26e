"""The console commands of ``[project.scripts]``, each run through :func:`lit_prunedpo.user_errors.run_command`.

One runner for all of them, so that no command forgets a case: Ctrl-C and SIGTERM end with one line saying that the
command was interrupted, what it kept and how to continue (exit 130 / 143), a full disk with one line naming the file
(exit 1), the package's own errors with ``error: ...`` (exit 1), and only bugs with a traceback (exit 1).

Each function imports its command's module when it runs, inside the runner: a Ctrl-C during those imports (torch's
take seconds) is said in one line too, and this module, a library module, imports nothing of the laboratory
(``lit_prunedpo.study``, ``lit_prunedpo.bench``) when it is imported.
"""

from __future__ import annotations

import sys
from typing import Sequence

from lit_prunedpo.user_errors import run_command

__all__ = ["bench", "bench_scaling", "cache", "lit_prunedpo", "paper", "study", "study_map"]


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


def lit_prunedpo() -> object:
    """``lit-prunedpo``: :func:`lit_prunedpo.cli.main`, as :func:`lit_prunedpo.cli.command` runs it (``python -m
    lit_prunedpo``), its module imported inside the runner."""
    def main() -> object:
        from lit_prunedpo.cli import main

        return main()

    def kept() -> str | None:
        from lit_prunedpo.cli import kept_when_interrupted

        return kept_when_interrupted()

    return run_command(main, kept=kept)


def cache() -> object:
    """``lit-prunedpo-cache``: :func:`lit_prunedpo.cache_cli.main`."""
    def main() -> object:
        from lit_prunedpo.cache_cli import main

        return main()

    return run_command(main, kept="nothing half-written is left under the cache's name (it is written beside it and "
                                  "renamed once complete); the same command builds it")


def bench() -> object:
    """``lit-prunedpo-bench``: :func:`lit_prunedpo.bench.cli.main`."""
    def main() -> object:
        from lit_prunedpo.bench.cli import main

        return main()

    return run_command(main, kept="nothing was written (the report is written once every configuration is "
                                  "measured); run the command again")


def bench_scaling() -> object:
    """``lit-prunedpo-bench-scaling``: :func:`lit_prunedpo.bench.scaling_cli.main`."""
    def main() -> object:
        from lit_prunedpo.bench.scaling_cli import main

        return main()

    return run_command(main, kept="nothing was written (the report is written once every point is measured); run "
                                  "the command again")


def study() -> object:
    """``lit-prunedpo-study``: :func:`lit_prunedpo.study.cli.main`."""
    def main() -> object:
        from lit_prunedpo.study.cli import main

        return main()

    return run_command(main, kept=lambda: (
        f"{_in_out('progress.jsonl')} keeps what was measured so far (a study does not resume: run it again with "
        "--overwrite to replace it)" if _option("--out") else "nothing was written (no --out)"))


def study_map() -> object:
    """``lit-prunedpo-study-map``: :func:`lit_prunedpo.study.map_cli.main`."""
    def main() -> object:
        from lit_prunedpo.study.map_cli import main

        return main()

    return run_command(main, kept=lambda: (
        f"{_in_out('cells/')} keeps the finished cells; rerun the same command with --resume to continue"
        if _option("--out") and "--plan-only" not in sys.argv else "nothing was written"))


def paper() -> object:
    """``lit-prunedpo-paper``: :func:`lit_prunedpo.study.paper_cli.main`."""
    def main() -> object:
        from lit_prunedpo.study.paper_cli import main

        return main()

    def kept() -> str:
        if "report" in sys.argv[1:2]:
            return "the reports are written whole (each file or none of it); run the command again"
        return f"{_in_out('records.jsonl')} keeps finished designs; rerun with --resume to continue"

    return run_command(main, kept=kept)
