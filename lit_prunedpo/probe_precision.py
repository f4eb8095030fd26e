"""The arithmetic a step runs in, as the set-up conformance probe sees it, and the tolerance that follows from it.

A 16-bit step (``bf16-mixed`` / ``16-mixed``: float32 weights under autocast; ``bf16-true``: 16-bit weights) rounds
every matmul, and a real model's log-probs move by a tenth of a nat or more between two equally valid summation
orders: SmolLM2-135M's plain forward in ``bf16-mixed`` is 0.26 nats from its float32 forward at worst on the probe,
and a mixture of experts may route a token to another expert. No fixed tolerance separates that from a bug, so
:mod:`lit_prunedpo.conformance` checks a layout in two stages:

1. **exactness, in float32**: autocast off, 16-bit weights widened to float32 for the probe (bfloat16 and float16
   values are exact in float32, so narrowing them back restores the very same weights), default dtype float32.
   A layout must match the plain forward to the float32 tolerance here: what differs in float32 is a different
   computation (a dropped logit scale, an ignored sliding window, padding read by a recurrent layer), whatever the
   step's precision.
2. **at the step's own precision**: the layout's log-probs must be finite and within :data:`ROUNDING_FACTOR` times
   the plain forward's own rounding at that precision (its largest distance from the float32 forward on the same
   probe), so that what only breaks in 16 bits (an overflowing mask, a NaN) is caught too.

:class:`WorkingPrecision` reads what the step runs in from the model and the active autocast state.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn

__all__ = ["FLOAT32_TOLERANCE", "ROUNDING_FACTOR", "WorkingPrecision", "in_float32", "rounding_tolerance"]

#: Largest per-token log-prob difference taken as rounding in float32 (nats).
FLOAT32_TOLERANCE = 1e-3

#: How far a layout at 16-bit precision may be from the float32 forward, in units of the plain forward's own
#: distance from it on the probe. A layout sums in another order than the plain forward and so rounds
#: differently. Over the 115 architectures of the zoo that run the packed layout (343 architecture-precision cells:
#: bfloat16 autocast, float16 autocast, bfloat16 weights), the worst ratio of the packed layout was 12.4, on a mixture
#: of experts (Ernie 4.5 MoE, whose router sends a token to another expert when its scores round differently: a
#: discrete change, not a bug); the next were 4.9, 4.1 and 3.7, mixtures of experts too, and every dense model's was
#: under 3. ``lab/scripts/probe-rounding.py`` measures it.
ROUNDING_FACTOR = 16.0

_WIDE = (torch.float32, torch.float64)


@dataclass(frozen=True)
class WorkingPrecision:
    """What a step's forward computes in: an autocast dtype (``None``: no autocast) and the weights' dtype."""

    autocast: torch.dtype | None
    weights: torch.dtype

    @classmethod
    def of(cls, model: nn.Module) -> "WorkingPrecision":
        """The precision ``model`` runs in here and now: its first floating parameter's dtype, and the autocast
        dtype active for its device (Lightning's ``*-mixed`` precisions run the step inside autocast)."""
        param = next((p for p in model.parameters() if p.is_floating_point()), None)
        weights = param.dtype if param is not None else torch.float32
        device = param.device.type if param is not None else "cpu"
        autocast = None
        if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
            autocast = torch.get_autocast_dtype(device)
        return cls(autocast, weights)

    @property
    def reduced(self) -> bool:
        """Whether matmuls round to fewer than float32's bits (16-bit autocast or 16-bit weights)."""
        return (self.autocast is not None and self.autocast not in _WIDE) or self.weights not in _WIDE

    def describe(self) -> str:
        """e.g. ``bfloat16 autocast``, ``bfloat16 weights``, ``float32``."""
        if self.autocast is not None and self.autocast not in _WIDE:
            return f"{_short(self.autocast)} autocast"
        return f"{_short(self.weights)} weights" if self.weights not in _WIDE else _short(self.weights)


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def rounding_tolerance(plain_rounding: float) -> float:
    """The tolerance of a layout at a 16-bit precision whose plain forward is ``plain_rounding`` nats (at most) from
    its float32 forward on the probe."""
    return max(FLOAT32_TOLERANCE, ROUNDING_FACTOR * plain_rounding)


@contextlib.contextmanager
def in_float32(models: Sequence[nn.Module]) -> Iterator[None]:
    """Run ``models`` in float32 inside the block: autocast off, default dtype float32, 16-bit floating parameters
    and buffers widened to float32 and narrowed back afterwards (exactly: a 16-bit value is a float32 value).

    The widening holds a float32 copy of 16-bit weights for the probe's few forwards (twice their memory, once,
    at set-up); weights already in float32 (the ``*-mixed`` precisions) are not copied.
    """
    narrow = [t for model in models for t in (*model.parameters(), *model.buffers())
              if t.is_floating_point() and t.dtype not in _WIDE]
    saved = [(t, t.data) for t in narrow]
    default = torch.get_default_dtype()
    devices = {t.device.type for model in models for t in model.parameters()} & {"cpu", "cuda"}
    with contextlib.ExitStack() as stack:
        for device in sorted(devices or {"cpu"}):
            stack.enter_context(torch.autocast(device_type=device, enabled=False))
        try:
            torch.set_default_dtype(torch.float32)
            for tensor, data in saved:
                tensor.data = data.float()
            yield
        finally:
            for tensor, data in saved:
                tensor.data = data
            torch.set_default_dtype(default)
