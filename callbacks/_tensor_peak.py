"""The CPU's peak of live tensor storage during a stretch of work: the analogue of CUDA's
``torch.cuda.max_memory_allocated() - memory_allocated()`` taken at the stretch's start.

PyTorch's CPU allocator keeps no peak counter, but it reports every allocation and every free to the profiler when
memory profiling is on (``c10::ProfiledCPUMemoryReporter``: the block's address and signed size). So
:class:`TensorPeakTracker` runs the stretch under ``torch.autograd.profiler.profile(profile_memory=True)`` and
replays the CPU allocator's events in time order (:func:`replay`): the bytes allocated in the stretch and not yet
freed, and their maximum. That is every tensor storage the CPU allocator hands out on the thread that runs the work
and on autograd's: activations, what autograd saves for backward, the gradients, the optimizer's state and its
temporaries, and scratch tensors a kernel allocates inside itself (which a dispatch-level tracker never sees).

What it does not count: memory that does not come from PyTorch's CPU allocator (BLAS and oneDNN internal buffers,
Python objects, the interpreter), and the freeing of storage allocated before the stretch started (the allocator
cannot say how large such a block was): the peak is that of what the stretch itself allocated. It therefore equals
CUDA's ``max_memory_allocated`` above the start when the stretch frees nothing older than itself (a training step
whose gradients are set to ``None`` at its end), and is never below it otherwise.

The profiler records every operator too, so the work runs slower under it (each op pays a record): time a step
without the tracker and measure its memory in a separate step, as the benchmark and the study do.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch


@dataclass(frozen=True)
class TensorPeak:
    """What :meth:`TensorPeakTracker.stop` read, in bytes."""

    peak: int
    """The largest sum of bytes allocated in the stretch and still live, at any moment of it."""
    held: int
    """The bytes allocated in the stretch and still live at its end."""
    events: int
    """CPU allocator events replayed (allocations and frees)."""


def replay(events: Iterable[tuple[int, int, int]]) -> tuple[int, int]:
    """``(peak, held)`` of allocator events ``(time_ns, address, signed bytes)``, replayed in time order (stable:
    events of one time keep their order). A free counts only if its block was allocated in the replay."""
    live: dict[int, int] = {}
    current = peak = 0
    for _, address, size in sorted(events, key=lambda e: e[0]):
        if size > 0:
            current += size - live.get(address, 0)  # a block reported twice replaces itself
            live[address] = size
            peak = max(peak, current)
        elif size < 0 and address in live:
            current -= live.pop(address)
    return peak, current


def _allocator_events(result: object, device_type: str) -> list[tuple[int, int, int]]:
    """``(time_ns, address, signed bytes)`` of every allocator event of ``device_type`` in a profiler result."""
    found: list[tuple[int, int, int]] = []
    stack = list(result.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        fields = event.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation" and fields.device.type == device_type:
            found.append((event.start_time_ns, fields.ptr, fields.alloc_size))
    return found


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to ``/dev/null`` for the block: Kineto prints a ``profiler_start`` / ``profiler_stop`` line
    to it at every enable and disable, which no setting turns off (two lines for every metered step otherwise)."""
    sys.stderr.flush()
    try:
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no file descriptor 2 to redirect
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


#: The trackers started and not yet stopped (held until then): a process that exits with one running stops it first.
_RUNNING: "set[TensorPeakTracker]" = set()


@atexit.register
def _stop_running_trackers() -> None:
    """Stop the profiler of a stretch the process exits in (Ctrl-C in a metered step: ``sys.exit(130)``): torch
    crashes with SIGSEGV (exit status 139, not 130) when the interpreter ends with memory profiling on."""
    for tracker in list(_RUNNING):
        with contextlib.suppress(Exception):
            tracker.stop()


class TensorPeakTracker:
    """The peak bytes of CPU tensor storage allocated and held between :meth:`start` and :meth:`stop`.

    Not re-entrant, and not while another profiler runs (:meth:`start` raises ``RuntimeError``). A tracker still
    running when the process exits is stopped then (torch would crash at exit with the profiler on).
    """

    def __init__(self) -> None:
        self._profile: Optional[torch.autograd.profiler.profile] = None

    def start(self) -> None:
        if self._profile is not None or torch.autograd._profiler_enabled():
            raise RuntimeError("TensorPeakTracker: a profiler is already running; memory cannot be traced under it")
        self._profile = torch.autograd.profiler.profile(profile_memory=True, record_shapes=False, with_stack=False)
        with _quiet_stderr():
            self._profile.__enter__()
        _RUNNING.add(self)

    def stop(self) -> TensorPeak:
        if self._profile is None:
            raise RuntimeError("TensorPeakTracker.stop() without start()")
        profile, self._profile = self._profile, None
        _RUNNING.discard(self)
        with _quiet_stderr():
            profile.__exit__(None, None, None)
        events = _allocator_events(profile.kineto_results, "cpu")
        peak, held = replay(events)
        return TensorPeak(peak, held, len(events))
