"""Every optimizer step's gradient, checked between the backward and the update (``lit_prunedpo.run.nonfinite``).

``PrunedDPO.optimizer_step`` hands the optimizer :meth:`GradientCheck.closure`: Lightning's closure (the step and
its backward) followed by :meth:`GradientCheck.check`, so that the gradient is checked before the optimizer applies
it: a non-finite gradient never reaches the weights. Under ``raise`` it stops the run; under ``skip`` the gradients
are dropped, so the optimizer's update changes nothing, and the step is counted and logged. Under a ``GradScaler``
(16-bit mixed precision) the scaler skips infinite (scaled) gradients itself, so nothing is checked here.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from lit_prunedpo.metrics import gradient_norm
from lit_prunedpo.run.nonfinite import NonFiniteGuard


class GradientCheck:
    """Checks each optimizer step's gradient by the run's failure policy and keeps the norm it measured until the
    step's log takes it (:meth:`take_norm`).

    Args:
        guard: the failure policy and its counts.
        on_skip: called when a step's gradient is dropped (``PrunedDPO`` logs its count of skipped steps).
    """

    def __init__(self, guard: NonFiniteGuard, on_skip: Callable[[], None]) -> None:
        self.guard = guard
        self.on_skip = on_skip
        self.norm: Tensor | None = None  # this optimizer step's, checked before the update, until taken

    def check(self, optimizer: torch.optim.Optimizer, scaled: bool, step: int, batch_idx: int,
              has_loss: bool) -> Tensor | None:
        """Check the gradient of ``optimizer``'s parameters, dropping it under ``skip`` when it is not finite.

        Args:
            scaled: the gradients are a ``GradScaler``'s (still scaled): not checked.
            step, batch_idx: where, for the error or the warning.
            has_loss: the step had a finite loss (a skipped one returns none).

        Returns:
            The gradient's total norm, measured once and logged as the step's ``train/grad_norm``; ``None`` when
            ``scaled`` or without any gradient.
        """
        if scaled:
            if has_loss:
                self.guard.finite_step()
            return None
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = gradient_norm(params)
        if not self.guard.gradient_ok(norm, step, batch_idx):
            for p in params:
                p.grad = None
            self.on_skip()
        elif has_loss:
            self.guard.finite_step()
        return norm

    def closure(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any], scaled: bool, step: int,
                batch_idx: int) -> Callable[[], Any]:
        """Lightning's optimizer ``closure`` (the step and its backward), then :meth:`check`, whose norm is kept
        for :meth:`take_norm`."""
        def checked() -> Any:
            loss = closure()
            self.norm = self.check(optimizer, scaled, step, batch_idx, loss is not None)
            return loss

        return checked

    def take_norm(self) -> Tensor | None:
        """The norm the last check measured, this step's only: ``None`` afterwards."""
        norm, self.norm = self.norm, None
        return norm
