"""A user's own preference loss, plugged in by ``class_path`` without touching the package.

``SquaredHingeLoss`` is ``max(0, 1 - beta * Delta)^2`` of the implicit-reward margin ``Delta = R_w - R_l``: a
smooth cousin of TRL's ``hinge`` that stops pushing a pair once its margin reaches ``1 / beta``. A margin loss only
has to give its value; its derivative (the coefficient of the pruned step's single-branch surrogate) comes from
autograd, and because it depends on the sums only through the margin, the log-probs of a response start both
responses share cancel and are scored once (``margin_only``). Any loss of the per-branch log-prob sums fits the
same seam (``lit_prunedpo.losses.PreferenceLoss``: implement ``per_pair``).

Run it:  PYTHONPATH=examples lit-prunedpo fit --config examples/custom_loss.yaml
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_prunedpo.losses import MarginLoss


class SquaredHingeLoss(MarginLoss):
    """``scale * max(0, 1 - beta * Delta)^2``.

    Args:
        scale: the loss's weight (> 0).
    """

    def __init__(self, scale: float = 1.0) -> None:
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale!r}")
        self.scale = float(scale)

    def value(self, margin: Tensor, beta: float) -> Tensor:
        return self.scale * torch.relu(1.0 - beta * margin) ** 2
