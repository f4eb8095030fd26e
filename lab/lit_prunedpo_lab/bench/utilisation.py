"""How much of the machine a step uses: its FLOPs, the FLOP/s it achieves and their share of a measured peak.

A configuration's FLOPs are the cost model's (:func:`lit_prunedpo_lab.bench.cost.step_flops`) on the forwards its step
actually ran, pruned work excluded; a TRL peer's (:func:`peer_step_flops`) are an unpruned step over the rows its
forwards really received (:class:`~lit_prunedpo_lab.bench.peer_trl.PeerForward`: ``input_ids`` padding included, the
LM head on the positions TRL projects), its backward 2x the gradient forward plus the head's forward again (TRL's
chunked log-prob kernel recomputes each head tile in backward), the body and attention once more where activation
checkpointing is on (``trl-online-checkpointing``), and the online reference's no-grad forward.

Achieved FLOP/s = mean FLOPs per step / median step time. The peak (:func:`measure_peak`) is measured in the same run,
right before the rounds and again right after them, the higher reading kept (:func:`higher_peak`): the median time of a
matmul of the model's own MLP shape, ``[tokens x hidden] @ [hidden x intermediate]`` with ``tokens`` of a typical
batch's padded forward, in the dtype the steps' matmuls run in (``--precision``'s autocast dtype under ``bf16-mixed`` /
``16-mixed``, else the parameters'), on the bench's device with its thread count. ``utilisation`` = achieved / peak: a
step's share of what one of its own large matmuls reaches, not of the vendor's datasheet figure (the cost model leaves
out norms, softmaxes and the optimizer; small ops run far below a large matmul's rate).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.peer_trl import PeerForward


def peer_step_flops(dims: cost.ModelDims, forwards: Iterable[PeerForward]) -> cost.StepFlops:
    """FLOPs of one TRL step from the forwards it ran: every forward is an unpruned one over its padded rows; a
    checkpointed one runs its body and attention again in backward."""
    forward = backward = recompute = reference = body_recompute = 0
    for f in forwards:
        flops = cost.forward_flops(dims, f.rows, f.width, f.positions)
        if f.reference:
            reference += flops.total
            continue
        forward += flops.total
        if f.grad:
            backward += 2 * flops.total
            recompute += flops.head
            body_recompute += flops.body + flops.attention if f.checkpointed else 0
    return cost.StepFlops(forward, backward, recompute, reference, body_recompute)


def typical_tokens(batches: Sequence[PreferenceBatch]) -> int:
    """Tokens of a typical batch's padded forward: the median over ``batches`` of ``2B x (prompt + response - 1)``."""
    return int(statistics.median(2 * b.num_pairs * (b.prompt_width + b.response_width - 1) for b in batches))


def intermediate_size(model: nn.Module, hidden: int) -> int:
    """The MLP's inner width of a ``transformers`` model (``intermediate_size``, GPT-2's ``n_inner``), else 4x."""
    config = getattr(model, "config", None)
    return int(getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden)


def measure_peak(tokens: int, hidden: int, intermediate: int, dtype: torch.dtype, device: torch.device,
                 repeats: int = 5) -> dict[str, Any]:
    """The median rate of ``repeats`` timed ``[tokens x hidden] @ [hidden x intermediate]`` matmuls (after one
    untimed), in ``dtype`` on ``device`` with torch's current thread count.

    Returns:
        ``flops_per_s`` and how it was measured: ``shape`` ``[tokens, hidden, intermediate]``, ``dtype``,
        ``device``, ``threads``, ``times_s``.

    Raises:
        ValueError: on a size or ``repeats`` below 1.
    """
    for name, value in (("tokens", tokens), ("hidden", hidden), ("intermediate", intermediate), ("repeats", repeats)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    b = torch.randn(hidden, intermediate, generator=g, device=device).to(dtype)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    a @ b  # the first call pays for kernel selection and allocation, which the steps have paid long before
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        a @ b
        sync()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    # a matmul faster than the clock's resolution would read as infinitely fast
    rate = 2 * tokens * hidden * intermediate / median if median > 0 else math.nan
    return {"flops_per_s": rate, "shape": [tokens, hidden, intermediate], "dtype": str(dtype).removeprefix("torch."),
            "device": str(device), "threads": torch.get_num_threads(), "times_s": times}


def higher_peak(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Of two :func:`measure_peak` readings of the same matmul (before and after the rounds), the higher: a peak is
    what the machine can do, and load lowers it (a neighbour during one reading read the bfloat16 peak at 169
    GFLOP/s against 409 on a quiet day). Both rates are kept (``readings_flops_per_s``, before first)."""
    best = before if before["flops_per_s"] >= after["flops_per_s"] else after
    return {**best, "readings_flops_per_s": [before["flops_per_s"], after["flops_per_s"]]}


def rate_fields(steps: Iterable[cost.StepFlops], step_time_s: float, peak_flops_per_s: float | None) -> dict[str, Any]:
    """A record's ``flops`` (mean per step), ``achieved_flops_per_s`` (over the median step time) and
    ``utilisation`` (over the peak; ``None`` without one)."""
    flops = statistics.fmean(s.total for s in steps)
    achieved = flops / step_time_s
    usable = peak_flops_per_s is not None and math.isfinite(peak_flops_per_s) and peak_flops_per_s > 0
    return {"flops": flops, "achieved_flops_per_s": achieved,
            "utilisation": achieved / peak_flops_per_s if usable else None}
