"""One line, not a traceback, for the errors a user's input or situation causes.

The package's own checks raise errors whose message says what is wrong and what to do (a file, a row, an argument,
a checkpoint): printed under a 30-line traceback of Lightning's and jsonargparse's frames, that line is the last
one of a screenful. :func:`run_command` runs a command's ``main`` and prints such an error alone, as
``error: <message>``, with exit status 1. What counts: an error raised by a frame of this package (its own check),
of an ordinary kind (``ValueError``, ``OSError``, ...). Anything raised elsewhere (torch, transformers, a bug in a
library) keeps its traceback, and ``LIT_PRUNEDPO_TRACEBACK=1`` shows every traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import TracebackType
from typing import Callable

__all__ = ["raised_here", "run_command"]

#: Kinds of error the package raises for a user's input or situation (a bad value, a file, a diverged run).
USER_ERROR_TYPES = (ValueError, OSError, FloatingPointError, LookupError, TypeError, RuntimeError)


def _package_folders() -> tuple[Path, ...]:
    import lit_prunedpo
    import lit_prunedpo.callbacks

    # the callbacks ship inside the package but live in the repository's top-level callbacks/ folder
    return tuple({Path(lit_prunedpo.__file__).parent.resolve(), Path(lit_prunedpo.callbacks.__file__).parent.resolve()})


def _innermost(tb: TracebackType | None) -> str | None:
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return None if tb is None else tb.tb_frame.f_code.co_filename


def raised_here(err: BaseException) -> bool:
    """Whether ``err`` is of a :data:`USER_ERROR_TYPES` kind and was raised by a frame of this package."""
    if not isinstance(err, USER_ERROR_TYPES):
        return False
    where = _innermost(err.__traceback__)
    if where is None:
        return False
    path = Path(where).resolve()
    return any(path.is_relative_to(folder) for folder in _package_folders())


def run_command(main: Callable[[], object]) -> None:
    """Run a command's ``main``: an error :func:`raised_here` is printed as one line (exit status 1), every other
    error, and every error under ``LIT_PRUNEDPO_TRACEBACK=1``, propagates with its traceback. Ctrl-C outside a fit
ends with ``interrupted (Ctrl-C)`` and exit status 130 (128 + SIGINT)."""
    tracebacks = os.environ.get("LIT_PRUNEDPO_TRACEBACK") == "1"
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C outside a fit (which says itself what it kept): no traceback of where it was
        if tracebacks:
            raise
        print("interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
    except Exception as err:  # noqa: BLE001 - sorted below; anything else is re-raised as it came
        if tracebacks or not raised_here(err):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
