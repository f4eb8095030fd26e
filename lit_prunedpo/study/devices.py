"""Where a study trains, and how its steps are timed there: the CPU, or one CUDA device.

On the CPU a step's cost can be read on the process's CPU clock (the work it did, steady when neighbours share the
cores) or the wall clock. On a GPU only the wall clock means the step's work: the CPU clock counts the host's kernel
launches and waits. CUDA runs asynchronously, so a timed step starts and ends with :func:`synchronize`: the kernels it
queued are inside its time and none of the next step's are.
"""

from __future__ import annotations

import torch

from lit_prunedpo.study.turns import Clock


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CUDA device; nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def study_device(device: str | torch.device) -> torch.device:
    """The device a study trains on, checked: ``cpu`` or an available ``cuda[:N]``.

    Raises:
        ValueError: naming the device, when it is not a CPU or CUDA device, or no such CUDA device is visible.
    """
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device: {device!r} is not a device torch knows ({err})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: a study trains on 'cpu' or 'cuda[:N]', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device here "
                         f"(torch {torch.__version__}); use 'cpu'")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device: {device!r} asked for, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return dev


def check_clock_on(device: torch.device, clock: Clock) -> None:
    """Refuse the CPU clock on a GPU: it would time the host's kernel launches, not the steps' work.

    Raises:
        ValueError: naming the device and the clock to use.
    """
    if device.type != "cpu" and clock == "cpu":
        raise ValueError(f"clock 'cpu' on device {device}: the process's CPU seconds time the host's launches and "
                         "waits, not the GPU's work; use the wall clock (--clock wall)")
