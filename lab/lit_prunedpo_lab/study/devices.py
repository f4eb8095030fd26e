"""Where and in what arithmetic a study trains, and how its steps are timed there: the CPU or one CUDA device, float32
or bfloat16 autocast.

On the CPU a step's cost can be read on the process's CPU clock (the work it did, steady when neighbours share the
cores) or the wall clock. On a GPU only the wall clock means the step's work: the CPU clock counts the host's kernel
launches and waits. CUDA runs asynchronously, so a timed step starts and ends with :func:`synchronize`: the kernels it
queued are inside its time and none of the next step's are.
"""

from __future__ import annotations

import contextlib

import torch

from lit_prunedpo_lab.study.turns import Clock

#: The precisions a run trains and evaluates in, with Lightning's meaning: float32 parameters, and each step's forward
#: (the module's ``step``: forwards, scoring, loss) under autocast to this dtype (None: float32 throughout). The
#: backward and the optimizer run outside it, as Lightning's ``MixedPrecision`` plugin runs them. ``bf16-true`` is not
#: offered: AdamW on bfloat16 weights rounds away the short runs' small updates (lr 1e-5 of a weight near 1).
PRECISIONS: dict[str, torch.dtype | None] = {"32-true": None, "bf16-mixed": torch.bfloat16}


def forward_precision(module: torch.nn.Module, precision: str) -> contextlib.AbstractContextManager:
    """The context a step's forward runs in at ``precision`` on ``module``'s device (:data:`PRECISIONS`)."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    device = next(module.parameters()).device
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


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


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new runs on ``device``: CUDA's free memory, or the CPU's ``MemAvailable`` (Linux); None where
    it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def training_state_bytes(module: torch.nn.Module) -> int:
    """What one run holds before any activation: its trainable weights with their gradients and AdamW's two moments
    (4 copies each), and every frozen weight once (an online reference's copy included), each in its own dtype."""
    return sum(p.numel() * p.element_size() * (4 if p.requires_grad else 1) for p in module.parameters())


class RunsDoNotFit(ValueError):
    """A study's runs need more memory together than is free: its settings (seeds at once, arms) must change. A
    ``ValueError``, so that the command says it in one ``error:`` line."""


def check_runs_fit(runs: int, run_bytes: int, device: torch.device, available: int | None = None) -> None:
    """Refuse to build ``runs`` runs that together need more than the memory free on ``device``: the process would
    be killed part way (on a CPU by the kernel, with no message) instead of stopping here with one.

    Raises:
        RunsDoNotFit: naming the runs, their memory and what is free, and the option that trains fewer at once.
    """
    free = available_bytes(device) if available is None else available
    if free is not None and runs * run_bytes > free:
        raise RunsDoNotFit(
            f"{runs} runs training at once need at least {runs * run_bytes / 2**30:.1f} GiB on {device} (weights, "
            f"gradients and AdamW state: {run_bytes / 2**30:.2f} GiB each, before activations), and "
            f"{free / 2**30:.1f} GiB is free, room for at most {int(free // run_bytes)}: train fewer seeds at once "
            "(--seeds-at-once K; train_arms(seeds_at_once=K)) or fewer arms")
