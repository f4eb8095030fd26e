"""Peak memory of a stretch of work: the readers of the process's memory and :class:`PeakMemoryMeter`, the one
measuring unit of :class:`~lit_prunedpo.callbacks.PeakMemoryMonitor` and of the benchmark (``lit_prunedpo_lab.bench``).

CPU (Linux only): the kernel keeps a high-water mark of the resident set size, ``VmHWM`` in
``/proc/self/status``. Writing ``"5"`` to ``/proc/self/clear_refs`` (Linux >= 4.0) resets that mark
to the current RSS, so "reset, run a step, read ``VmHWM``" measures the real peak RSS of the step.
See ``man 5 proc``.

CPU tensors (``"cpu_tensors"``, what a meter that settles picks on the CPU: the benchmark's and the study's): the
peak bytes of tensor storage the work allocated and held, read from the CPU allocator's own events
(:mod:`._tensor_peak`): the same quantity as CUDA's ``max_memory_allocated`` above the start, and blind to what RSS
also holds (freed pages the C allocator keeps, libraries, other threads). It slows the measured work (the profiler
records every operator): time steps without it.

CUDA: the caching allocator's own counters (``torch.cuda.reset_peak_memory_stats`` /
``max_memory_allocated`` / ``max_memory_reserved``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from dataclasses import dataclass
from typing import Callable, Literal, Optional, Union

import torch

from ._tensor_peak import TensorPeakTracker

MB = float(2**20)  # "MB" in the logged keys means MiB: 2**20 bytes.

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _read_status_kb(field: str) -> Optional[int]:
    """Return ``field`` (e.g. ``"VmHWM"``) of ``/proc/self/status`` in kB, or None if unreadable."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_peak_rss_bytes() -> Optional[int]:
    """Peak resident set size of this process (``VmHWM``) in bytes, or None where there is no ``/proc``."""
    kb = _read_status_kb("VmHWM")
    return None if kb is None else kb * 1024


def read_rss_bytes() -> Optional[int]:
    """Current resident set size of this process (``VmRSS``) in bytes, or None where there is no ``/proc``."""
    kb = _read_status_kb("VmRSS")
    return None if kb is None else kb * 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS. Returns False if ``clear_refs`` is not writable."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def cpu_peak_rss_status() -> str:
    """Probe what this machine allows.

    Returns:
        ``"resettable"`` (``VmHWM`` readable and ``clear_refs`` writable), ``"lifetime"`` (``VmHWM``
        readable, but the mark cannot be reset: it is the peak of the whole process lifetime), or
        ``"unavailable"`` (no ``/proc/self/status``, e.g. not Linux).
    """
    if read_peak_rss_bytes() is None:
        return "unavailable"
    return "resettable" if reset_peak_rss() else "lifetime"


def reset_cuda_peak(device: Union[torch.device, int, None]) -> None:
    """Reset the CUDA caching allocator's peak counters of ``device``."""
    torch.cuda.reset_peak_memory_stats(device)


def read_cuda_peak_bytes(device: Union[torch.device, int, None]) -> tuple[int, int]:
    """``(max_memory_allocated, max_memory_reserved)`` of ``device`` since the last reset, in bytes."""
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def malloc_trim() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)`` (hands freed heap pages back to the OS), or a no-op elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


Mode = Literal["cuda", "cpu", "cpu_tensors", "cpu_lifetime", "off"]

MEASURES: dict[str, str] = {  # what each mode measures, in words (the reports and records print it)
    "cuda": "cuda max_memory_allocated",
    "cpu": "peak RSS (VmHWM reset by clear_refs)",
    "cpu_tensors": "peak CPU tensor storage allocated and held (the CPU allocator's events, as cuda "
                   "max_memory_allocated)",
    "cpu_lifetime": "lifetime peak RSS (clear_refs not writable: not per step)",
    "off": "unavailable",
}


@dataclass(frozen=True)
class PeakReading:
    """What :meth:`PeakMemoryMeter.stop` read, in bytes."""

    peak: int
    """CUDA ``max_memory_allocated``, the peak RSS (``VmHWM``), or (``"cpu_tensors"``) the peak of the tensor storage
    allocated since the start."""
    start: int
    """CUDA ``memory_allocated``, or the RSS, when the meter started (0 where unreadable, and for ``"cpu_tensors"``,
    whose peak is above the start already)."""
    reserved: Optional[int] = None
    """CUDA ``max_memory_reserved``; ``None`` on the CPU."""
    absolute: bool = True
    """Whether :attr:`peak` is the process's (CUDA, RSS) or only above the start (``"cpu_tensors"``: the storage
    live at the start is not known)."""

    @property
    def above_start(self) -> int:
        return max(0, self.peak - self.start)


class PeakMemoryMeter:
    """Peak memory between :meth:`start` and :meth:`stop` on one device.

    Modes: ``"cuda"`` (the caching allocator's counters, reset at start), ``"cpu"`` (``VmHWM`` reset through
    ``clear_refs`` at start), ``"cpu_tensors"`` (the CPU allocator's events between start and stop, replayed by
    :class:`._tensor_peak.TensorPeakTracker`: the peak of live tensor storage above the start; :attr:`intrusive`),
    ``"cpu_lifetime"`` (``VmHWM`` that cannot be reset: the process's peak so far, not
    the stretch's) and ``"off"`` (nothing readable: :meth:`stop` returns ``None``).

    Args:
        device: where the measured work runs.
        mode: ``None`` picks ``"cuda"`` on CUDA; on the CPU ``"cpu_tensors"`` with ``settle``, else what this
            machine allows of the RSS (:func:`cpu_peak_rss_status`); a caller whose ranks must agree (the callback)
            passes the mode they agreed on.
        settle: before each reset, collect garbage and give freed memory back (``gc.collect()``, then CUDA
            ``synchronize`` or glibc's ``malloc_trim(0)``), so that memory an earlier stretch freed is not counted
            again: for comparing steps of different configurations in one process (the benchmark, the study),
            which on the CPU also picks the measure that compares them, ``"cpu_tensors"``. It costs a
            garbage-collector pass per start, so a training run's callback leaves it off.
    """

    def __init__(self, device: torch.device, mode: Optional[Mode] = None, settle: bool = False) -> None:
        if mode is None:
            if device.type == "cuda":
                mode = "cuda"
            elif settle:
                mode = "cpu_tensors"
            else:
                mode = {"resettable": "cpu", "lifetime": "cpu_lifetime", "unavailable": "off"}[cpu_peak_rss_status()]
        if mode not in MEASURES:
            raise ValueError(f"mode must be one of {list(MEASURES)}, got {mode!r}")
        self.device = device
        self.mode: Mode = mode
        self.settle = bool(settle)
        self._trim = malloc_trim() if self.settle and mode in ("cpu", "cpu_lifetime") else (lambda: None)
        self._tracker = TensorPeakTracker() if mode == "cpu_tensors" else None
        self._start = 0

    @property
    def measure(self) -> str:
        """What this meter measures, in words."""
        return MEASURES[self.mode]

    @property
    def intrusive(self) -> bool:
        """Whether measuring slows the measured work (``"cpu_tensors"``: every operator is recorded), so that a
        step must be timed without the meter and measured in a step of its own."""
        return self.mode == "cpu_tensors"

    def start(self) -> None:
        if self.settle:
            gc.collect()
        if self.mode == "cuda":
            if self.settle:
                torch.cuda.synchronize(self.device)
            reset_cuda_peak(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            return
        if self._tracker is not None:
            self._start = 0
            self._tracker.start()
            return
        self._trim()
        if self.mode == "cpu":
            reset_peak_rss()
        self._start = read_rss_bytes() or 0

    def stop(self) -> Optional[PeakReading]:
        """The peak since :meth:`start`, or ``None`` where nothing can be read."""
        if self.mode == "cuda":
            allocated, reserved = read_cuda_peak_bytes(self.device)
            return PeakReading(allocated, self._start, reserved)
        if self.mode == "off":
            return None
        if self._tracker is not None:
            return PeakReading(self._tracker.stop().peak, 0, absolute=False)
        peak = read_peak_rss_bytes()
        return None if peak is None else PeakReading(peak, self._start)
