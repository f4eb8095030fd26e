"""The console commands of ``[project.scripts]``, each run through :func:`lit_prunedpo.cli.user_errors.run_command`.

One runner for all of them, so that no command forgets a case: Ctrl-C and SIGTERM end with one line saying that the
command was interrupted, what it kept and how to continue (exit 130 / 143), a full disk with one line naming the file
(exit 1), the package's own errors with ``error: ...`` (exit 1), and only bugs with a traceback (exit 1).

Each function imports its command's module when it runs, inside the runner: a Ctrl-C during those imports (torch's
take seconds) is said in one line too. The laboratory's commands (``lit-prunedpo-lab``, ``lit-prunedpo-bench``, ...)
are the lab's own distribution's (``lab/``, :mod:`lit_prunedpo_lab.console`), run through the same runner.
"""

from __future__ import annotations

from lit_prunedpo.cli.user_errors import run_command

__all__ = ["cache", "lit_prunedpo"]


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
    """``lit-prunedpo-cache``: :func:`lit_prunedpo.cli.cache.main`."""
    def main() -> object:
        from lit_prunedpo.cli.cache import main

        return main()

    return run_command(main, kept="nothing half-written is left under the cache's name (it is written beside it and "
                                  "renamed once complete); the same command builds it")
