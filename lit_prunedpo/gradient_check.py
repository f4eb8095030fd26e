"""Every optimizer step's gradient, checked between the backward and the update (``lit_prunedpo.nonfinite``).

``PrunedDPO.optimizer_step`` hands the optimizer :func:`checked_closure`, Lightning's closure (the step and its
backward) followed by :func:`check_gradient`, so that the gradient is checked before the optimizer applies it: a
non-finite gradient never reaches the weights. Under ``raise`` it stops the run; under ``skip`` the gradients are
dropped, so the optimizer's update changes nothing, and the step is counted and logged. Under a ``GradScaler``
(16-bit mixed precision) the scaler skips infinite (scaled) gradients itself, so nothing is checked here.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from lit_prunedpo.metrics import gradient_norm
from lit_prunedpo.training_logs import log_skipped


def check_gradient(module: Any, optimizer: torch.optim.Optimizer, batch_idx: int, has_loss: bool) -> Tensor | None:
    """Check the gradient of ``module`` (a ``PrunedDPO``) by its failure policy (``module.nonfinite``), dropping it
    under ``skip`` when it is not finite; ``has_loss``: the step had a finite loss (a skipped one returns none).

    Returns:
        The gradient's total norm, measured once and logged as the step's ``train/grad_norm``; ``None`` under a
        ``GradScaler`` (its gradients are still scaled) or without any gradient.
    """
    guard = module.nonfinite
    if getattr(module.trainer.precision_plugin, "scaler", None) is not None:
        if has_loss:
            guard.finite_step()
        return None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = gradient_norm(params)
    if not guard.gradient_ok(norm, module.global_step, batch_idx):
        for p in params:
            p.grad = None
        log_skipped(module)
    elif has_loss:
        guard.finite_step()
    return norm


def checked_closure(module: Any, optimizer: torch.optim.Optimizer, batch_idx: int, closure: Callable[[], Any]
                    ) -> Callable[[], Any]:
    """Lightning's optimizer ``closure`` (the step and its backward), then :func:`check_gradient`; the norm it
    measured is kept as ``module._grad_norm`` for the step's log."""
    def checked() -> Any:
        loss = closure()
        module._grad_norm = check_gradient(module, optimizer, batch_idx, loss is not None)
        return loss

    return checked
