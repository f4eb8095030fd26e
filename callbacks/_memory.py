"""Low-level readers of the process's memory, used by :class:`~lit_prunedpo.callbacks.PeakMemoryMonitor`.

CPU (Linux only): the kernel keeps a high-water mark of the resident set size, ``VmHWM`` in
``/proc/self/status``. Writing ``"5"`` to ``/proc/self/clear_refs`` (Linux >= 4.0) resets that mark
to the current RSS, so "reset, run a step, read ``VmHWM``" measures the real peak RSS of the step.
See ``man 5 proc``.

CUDA: the caching allocator's own counters (``torch.cuda.reset_peak_memory_stats`` /
``max_memory_allocated`` / ``max_memory_reserved``).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

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
