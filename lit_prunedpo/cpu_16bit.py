"""Warn when a 16-bit precision would run on a CPU whose 16-bit matmuls are slower than its float32 ones.

torch runs bfloat16 and float16 matmuls fast on a CPU only where the CPU has instructions for them (AVX512-BF16,
AMX, AVX512-FP16); without them it falls back to a plain loop. On a 2-core AMD EPYC with AVX2 only (torch 2.13,
2 threads), a 2048x2048 product ran at 0.3 GFLOP/s in bfloat16 against 136 GFLOP/s in float32, and a step of
SmolLM2-135M that takes seconds in float32 did not finish in 13 minutes under ``bf16-mixed``. Nothing fails and
nothing says why: the run is just hundreds of times slower. On CPUs with the instructions (avx512_bf16), the same
``bf16-mixed`` step ran 1.6x faster than in float32.

So at set-up, when the trainer runs on a CPU in a 16-bit precision, :func:`warn_if_slow_16bit` times one small
product in float32 and in the 16-bit dtype (a few tens of milliseconds where the dtype is slow, far less where it
is not) and warns, with both rates, when the 16-bit one is more than :data:`SLOWER` times slower. A warning, not a
refusal: the run is still exact, and someone may want to check 16-bit numerics on a CPU. ``lit-prunedpo-bench``
prints the same warning for its ``--precision`` on a CPU.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

__all__ = ["SLOWER", "matmul_rate", "slow_16bit_here", "slow_16bit_message", "warn_if_slow_16bit"]

#: How many times slower than float32 a 16-bit matmul may run before set-up warns. Where the CPU has the
#: instructions, a small bfloat16 product runs within about 2x of float32 (conversions dominate it); without them,
#: 30-400x slower.
SLOWER = 4.0

_SIZE = 256  # a product small enough to time in ~25 ms where the 16-bit path is a plain loop


def matmul_rate(dtype: torch.dtype, size: int = _SIZE, repeats: int = 3) -> float:
    """FLOP/s of a ``size x size`` product in ``dtype`` on the CPU with the current torch threads: the best of
    ``repeats`` timings after one warm-up."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / max(best, 1e-9)


def _dtype(precision: str) -> torch.dtype | None:
    """The matmul dtype of a Lightning precision (``bf16-mixed``, ``bf16-true``, ``16-mixed``, ``16-true``), or
    None for a float32 or float64 one."""
    kind = str(precision).split("-")[0]
    return {"bf16": torch.bfloat16, "16": torch.float16}.get(kind)


def slow_16bit_message(precision: str, wide: float, narrow: float) -> str | None:
    """The warning for ``precision`` given the float32 (``wide``) and 16-bit (``narrow``) matmul rates, or None when
    the 16-bit one is within :data:`SLOWER` times the float32 one."""
    dtype = _dtype(precision)
    if dtype is None or narrow * SLOWER >= wide:
        return None
    name = str(dtype).removeprefix("torch.")
    return (f"precision {precision} on this CPU (torch capability {torch.backends.cpu.get_cpu_capability()}): a "
            f"{name} matmul ran {wide / narrow:.0f}x slower than a float32 one here ({narrow / 1e9:.2f} against "
            f"{wide / 1e9:.1f} GFLOP/s, a {_SIZE}x{_SIZE} product): this CPU lacks {name} matmul instructions, so "
            f"every step will run many times slower than in float32. Train in float32 (--trainer.precision 32-true) "
            "or on a GPU.")


def slow_16bit_here(precision: str) -> str | None:
    """The warning for ``precision`` on this CPU, from its matmul rates timed now (:func:`matmul_rate`), or None
    (float32 is never timed)."""
    dtype = _dtype(precision)
    if dtype is None:
        return None
    return slow_16bit_message(precision, matmul_rate(torch.float32), matmul_rate(dtype))


def warn_if_slow_16bit(trainer: Any) -> str | None:
    """Warn (once per set-up, rank 0) when ``trainer`` runs on a CPU in a 16-bit precision whose matmuls are slower
    there than float32's (:func:`slow_16bit_here`); returns the warning, or None."""
    strategy = getattr(trainer, "strategy", None)
    if getattr(strategy, "root_device", torch.device("cpu")).type != "cpu":
        return None
    message = slow_16bit_here(str(getattr(trainer, "precision", "32-true")))
    if message is not None:
        rank_zero_warn(message)
    return message
