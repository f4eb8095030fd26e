"""Learning-rate schedules that ``torch`` lacks as a class (LightningCLI needs a class to configure)."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class WarmupCosineLR(LambdaLR):
    """Linear warm-up from 0 to the base rate, then cosine decay to ``min_lr_ratio`` of it.

    Args:
        optimizer: the wrapped optimizer.
        warmup_steps: optimizer steps of linear warm-up (>= 0).
        total_steps: optimizer steps of the whole run; ``None`` lets ``PrunedDPO`` fill in the trainer's
            estimated number of stepping batches before training starts.
        min_lr_ratio: final rate as a fraction of the base rate, in [0, 1].
    """

    def __init__(
        self, optimizer: Optimizer, warmup_steps: int = 0, total_steps: int | None = None, min_lr_ratio: float = 0.0
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"total_steps must be >= 1 or None, got {total_steps!r}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
        self.warmup_steps = int(warmup_steps)
        self.total_steps = total_steps
        self.min_lr_ratio = float(min_lr_ratio)
        super().__init__(optimizer, self._factor)

    def _factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.total_steps is None:
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
