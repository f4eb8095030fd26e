"""The benchmark's ``--precision``, with Lightning's meaning, applied alike to every configuration and TRL peer.

=============== ============ ============================================================================
precision       parameters   each timed step
=============== ============ ============================================================================
``32-true``     float32      float32 throughout
``bf16-mixed``  float32      forward (the module's step: forwards, scoring, loss) under
                             ``torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=False)``
``16-mixed``    float32      the same with float16, the loss scaled by a ``torch.amp.GradScaler``
``bf16-true``   bfloat16     bfloat16 throughout (``--dtype bfloat16``)
``16-true``     float16      float16 throughout (``--dtype float16``)
=============== ============ ============================================================================

As Lightning's ``MixedPrecision`` plugin wraps ``training_step`` (``Strategy.training_step`` under
``precision_plugin.train_step_context()``): backward and the optimizer step run outside the autocast; ``16-mixed``
scales the loss before backward and steps through the scaler (which skips a step with non-finite gradients), as the
plugin's ``pre_backward`` and ``optimizer_step`` do. Unlike Lightning, which turns ``16-mixed`` on the CPU into
``bf16-mixed``, the bench runs float16 autocast on the CPU where torch supports it and refuses it otherwise.

``--dtype`` is the older spelling of the parameters' dtype: alone it names the ``*-true`` precision of that dtype;
with ``--precision`` it must agree with the precision's parameters (:func:`resolve_precision`).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import ContextManager

import torch

#: ``--precision`` -> (the parameters' dtype, the autocast dtype of the step's forward or ``None``).
PRECISIONS: dict[str, tuple[str, str | None]] = {
    "32-true": ("float32", None),
    "bf16-mixed": ("float32", "bfloat16"),
    "16-mixed": ("float32", "float16"),
    "bf16-true": ("bfloat16", None),
    "16-true": ("float16", None),
}

#: ``--dtype`` alone -> its precision.
TRUE_PRECISION = {weights: name for name, (weights, autocast) in PRECISIONS.items() if autocast is None}


@dataclass(frozen=True)
class Precision:
    """One ``--precision``: its name, the parameters' dtype and the autocast dtype of each step's forward."""

    name: str
    weights: str
    autocast: str | None

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the step's matmuls run in: the autocast's, else the parameters'."""
        return getattr(torch, self.autocast or self.weights)

    def stepper(self, device: torch.device) -> "Stepper":
        """One trainer's step at this precision on ``device`` (its own loss scaler under ``16-mixed``).

        Raises:
            ValueError: torch does not run this autocast on ``device``.
        """
        return Stepper(self, device)


def resolve_precision(precision: str | None, dtype: str | None) -> Precision:
    """The precision of ``--precision`` and ``--dtype``: ``--dtype`` alone is its ``*-true`` precision, neither is
    ``32-true``.

    Raises:
        ValueError: an unknown name, or a ``dtype`` other than ``precision``'s parameters (one line naming both).
    """
    if dtype is not None and dtype not in TRUE_PRECISION:
        raise ValueError(f"dtype: unknown {dtype!r}; choose from {list(TRUE_PRECISION)}")
    if precision is None:
        precision = TRUE_PRECISION[dtype or "float32"]
    if precision not in PRECISIONS:
        raise ValueError(f"precision: unknown {precision!r}; choose from {list(PRECISIONS)}")
    weights, autocast = PRECISIONS[precision]
    if dtype is not None and dtype != weights:
        raise ValueError(f"--dtype {dtype} conflicts with --precision {precision}, whose parameters are {weights}: "
                         f"give --precision alone (--dtype {dtype} alone is --precision {TRUE_PRECISION[dtype]})")
    return Precision(precision, weights, autocast)


class Stepper:
    """How one trainer's step runs at a precision: :meth:`forward` around the forward (the whole training step up
    to its loss), then :meth:`backward` and :meth:`step` outside it, as Lightning's precision plugin does."""

    def __init__(self, precision: Precision, device: torch.device) -> None:
        self.precision = precision
        self.device_type = device.type
        self.scaler = None
        if precision.autocast is not None:
            _check_autocast(self.device_type, precision.compute_dtype, precision.name)
        if precision.autocast == "float16":
            self.scaler = torch.amp.GradScaler(self.device_type)

    def forward(self) -> ContextManager:
        """The context each step's forward runs in: Lightning's autocast under ``*-mixed``, else nothing."""
        if self.precision.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.precision.compute_dtype, cache_enabled=False)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, the loss scaled first under ``16-mixed``."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's step (through the scaler under ``16-mixed``), then its gradients set to ``None``."""
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _check_autocast(device_type: str, dtype: torch.dtype, name: str) -> None:
    """Raises ValueError, naming the precision, where torch does not run a matmul in ``dtype`` under autocast on
    ``device_type`` (torch then warns and turns the autocast off, which would measure float32 under its name)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device_type, dtype=dtype, cache_enabled=False):
                ones = torch.ones(1, 1, device=device_type)
                out = ones @ ones
    except (RuntimeError, AssertionError) as err:
        raise ValueError(f"--precision {name}: torch {torch.__version__} has no {dtype} autocast on "
                         f"{device_type} ({err})") from err
    if out.dtype != dtype:
        raise ValueError(f"--precision {name}: torch {torch.__version__} does not run {dtype} autocast on "
                         f"{device_type} (a matmul came out in {out.dtype}); choose another --precision")
