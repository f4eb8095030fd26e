"""How every console command ends: one line, not a traceback, for what a user's input or situation causes.

:func:`run_command` runs a command's ``main``; every entry point of ``[project.scripts]`` goes through it
(``lit-prunedpo``: :func:`lit_prunedpo.cli.command`; the others: :mod:`lit_prunedpo.cli.console`):

- an error of the package's own checks (:func:`raised_here`: raised by a frame of this package, or of the folders a
  command names as its own (the lab's commands: the lab's package), of an ordinary kind,
  ``ValueError``, ``OSError``, ...), whose message says what is wrong and what to do: ``error: <message>``, exit 1
  (printed under a 30-line traceback of Lightning's and jsonargparse's frames it would be the last line of a screen);
- a full disk (``ENOSPC``, ``EFBIG``: :mod:`lit_prunedpo.full_disk`), wherever it was raised: ``error: cannot write
  <file>: disk full (...)``, exit 1 (the writers that must not leave half a file write atomically themselves);
- Ctrl-C: ``interrupted (Ctrl-C)``, then what the command kept and how to continue (its ``kept`` text), exit 130
  (128 + SIGINT); a fit stopped by a second Ctrl-C, which Lightning ends with status 1, too;
- SIGTERM: the same, ``interrupted (SIGTERM)``, exit 143 (128 + SIGTERM). The signal is raised as :class:`Terminated`
  where the program was, so its ``finally`` blocks run (an output folder's lock is released, a partial file
  removed). During a fit, Lightning's own handler (and ``PreemptionCheckpoint``'s) takes SIGTERM over: the fit saves
  its step and stops itself, as before;
- anything else (a bug, an error of torch or transformers) keeps its traceback, exit 1, and
  ``LIT_PRUNEDPO_TRACEBACK=1`` shows every traceback, interrupts included.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Callable, Iterator, Optional, Sequence, Union

from lit_prunedpo.full_disk import describe_full, disk_full_errno

__all__ = ["Kept", "Terminated", "raised_here", "run_command"]

#: Kinds of error the package raises for a user's input or situation (a bad value, a file, a diverged run).
USER_ERROR_TYPES = (ValueError, OSError, FloatingPointError, LookupError, TypeError, RuntimeError)

#: What an interrupted command kept and how to continue it: a text, or a function that says it when asked.
Kept = Union[str, Callable[[], Optional[str]], None]


class Terminated(BaseException):
    """SIGTERM, raised by :func:`run_command`'s handler where the program was; a ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` takes it for an error to recover from."""


def _package_folders() -> tuple[Path, ...]:
    import lit_prunedpo
    import lit_prunedpo.callbacks

    # the callbacks ship inside the package but live in the repository's top-level callbacks/ folder
    return tuple({Path(lit_prunedpo.__file__).parent.resolve(), Path(lit_prunedpo.callbacks.__file__).parent.resolve()})


def _innermost(tb: TracebackType | None) -> str | None:
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return None if tb is None else tb.tb_frame.f_code.co_filename


def raised_here(err: BaseException, own: Sequence[Path] = ()) -> bool:
    """Whether ``err`` is of a :data:`USER_ERROR_TYPES` kind and was raised by a frame of this package (or of a
    folder in ``own``: a client's package whose checks speak to the user the same way)."""
    if not isinstance(err, USER_ERROR_TYPES):
        return False
    where = _innermost(err.__traceback__)
    if where is None:
        return False
    path = Path(where).resolve()
    return any(path.is_relative_to(Path(folder).resolve()) for folder in (*_package_folders(), *own))


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    if signal.getsignal(signal.SIGTERM) is not _raise_terminated:
        # called by a handler that wraps this one: Lightning's, during a fit, which stops the fit itself (saved)
        return
    raise Terminated


def _ignore(signum: int, frame: FrameType | None) -> None:
    """More of a signal while an interrupted command ends (a burst, a user's second Ctrl-C): nothing to do."""


@contextlib.contextmanager
def _signals_handled() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` for the block (unless the process already handles or ignores it). After
    it, a handler the runner set is put back as it was (a command run inside a test leaves the handlers alone); one
    set by the command is kept: a fit stopped by SIGTERM ignores the rest of a scheduler's burst while it exits."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    if before[1] == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        for signum, handler in zip((signal.SIGINT, signal.SIGTERM), before):
            if handler is not None and signal.getsignal(signum) in (_raise_terminated, _ignore):
                signal.signal(signum, handler)


def _interrupt_behind(stop: SystemExit) -> BaseException | None:
    """The interrupt a fit ended on with ``sys.exit(1)`` (Lightning's way after a Ctrl-C it handled), else None."""
    cause = stop.__context__
    return cause if stop.code == 1 and isinstance(cause, (KeyboardInterrupt, Terminated)) else None


def _ignore_signals_at_exit() -> None:
    """Ignore SIGINT and SIGTERM while the interpreter ends (an ``atexit`` function): Python puts their default
    action back as it finishes, so a second Ctrl-C during torch's teardown killed the process (status -2, not 130)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def _interrupted(err: BaseException, kept: Kept) -> None:
    """Say that ``err`` (Ctrl-C or SIGTERM) interrupted the command and what it kept; exit 130 or 143."""
    if threading.current_thread() is threading.main_thread():
        # more of the same signal while the line is written (a burst, a user's second Ctrl-C): no traceback of it,
        # and none kills the process while it exits (the handlers of the command's caller are put back meanwhile)
        signal.signal(signal.SIGINT, _ignore)
        signal.signal(signal.SIGTERM, _ignore)
        atexit.unregister(_ignore_signals_at_exit)
        atexit.register(_ignore_signals_at_exit)
    said = kept() if callable(kept) else kept
    what, status = ("SIGTERM", 128 + signal.SIGTERM) if isinstance(err, Terminated) else ("Ctrl-C", 128 + signal.SIGINT)
    print(f"interrupted ({what})" + (f": {said}" if said else ""), file=sys.stderr, flush=True)
    sys.exit(status)


def _full_disk_line(err: BaseException, code: int) -> str:
    """The one line of a full disk: the file (``err.filename``, or the writer's own message that names it)."""
    filename = getattr(err, "filename", None)
    if filename is not None:
        return f"cannot write {os.fsdecode(filename)}: {describe_full(code)}"
    text = str(err)
    if describe_full(code) in text:  # DiskFull and the study's OutputError: their message names the file
        return text
    return f"{describe_full(code)}: {text}"


def user_error_line(err: Exception, own: Sequence[Path] = ()) -> str | None:
    """The one line ``err`` is said in (after ``error: ``), or None when it keeps its traceback (``own``: as in
    :func:`raised_here`)."""
    code = disk_full_errno(err)
    if code is not None:
        return _full_disk_line(err, code)
    return str(err) if raised_here(err, own) else None


def run_command(main: Callable[[], object], kept: Kept = None, own: Sequence[Path] = ()) -> object:
    """Run a command's ``main`` and return what it returns (an exit status, or None), ending it as the module says:
    ``error: ...`` lines for the package's own errors (and those of the folders in ``own``, a client's package such
    as the lab's) and a full disk, the interrupted line (with ``kept``) for Ctrl-C and SIGTERM; other errors
    propagate with their traceback (exit status 1)."""
    tracebacks = os.environ.get("LIT_PRUNEDPO_TRACEBACK") == "1"
    with _signals_handled():
        try:
            return main()
        except (KeyboardInterrupt, Terminated) as err:  # no traceback of where the program happened to be
            if tracebacks:
                raise
            _interrupted(err, kept)
        except SystemExit as stop:
            interrupt = _interrupt_behind(stop)
            if stop.code in (128 + signal.SIGINT, 128 + signal.SIGTERM):  # a fit stopped by Ctrl-C, saved
                atexit.unregister(_ignore_signals_at_exit)
                atexit.register(_ignore_signals_at_exit)
            if interrupt is None or tracebacks:
                raise
            _interrupted(interrupt, kept)
        except Exception as err:  # noqa: BLE001 - sorted below; anything else is re-raised as it came
            line = None if tracebacks else user_error_line(err, own)
            if line is None:
                raise
            print(f"error: {line}", file=sys.stderr)
            sys.exit(1)
    return None
