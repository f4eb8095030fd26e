"""What a training step does with a non-finite loss or gradient: stop naming it, or skip the step and count it.

Two places can go non-finite: the DPO loss (the forward) and the gradient (the backward, with a finite loss: an
overflow in a large-rate step). Both are checked before the optimizer step, so that NaN never reaches the
weights: ``raise`` stops the run with the step and the figures; ``skip`` skips the optimizer step (it is not
counted, the scheduler does not move), warns, and counts it, and more than ``max_consecutive_skips`` skipped steps
in a row stop the run (it diverged). The loss decision is taken by all ranks together (one rank skipping its
backward alone would hang DDP); the gradient norm is already the global one on every rank (DDP's gradients are
all-reduced, FSDP2's norm is made whole), so every rank decides the same without another collective. Under a
``GradScaler`` (16-bit mixed precision) an infinite gradient is the scaler's business: it skips that step and
lowers its scale, so the gradient is not checked here.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_prunedpo.batch import BRANCH_NAMES, PreferenceBatch
from lit_prunedpo.step.estimate import Estimate

OnNonFinite = Literal["raise", "skip"]


class NonFiniteGuard:
    """The failure policy of :class:`~lit_prunedpo.module.PrunedDPO` (``model.on_nonfinite``,
    ``model.max_consecutive_skips``) and its counts, which checkpoints keep so that a resume goes on counting.

    Args:
        mode: ``raise`` or ``skip``.
        max_consecutive_skips: with ``skip``, more skipped steps in a row than this stop the run.

    Raises:
        ValueError: an unknown ``mode`` or a negative ``max_consecutive_skips``.
    """

    def __init__(self, mode: OnNonFinite = "raise", max_consecutive_skips: int = 10) -> None:
        if mode not in ("raise", "skip"):
            raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {mode!r}")
        if max_consecutive_skips < 0:
            raise ValueError(f"max_consecutive_skips must be >= 0, got {max_consecutive_skips!r}")
        self.mode = mode
        self.max_consecutive_skips = int(max_consecutive_skips)
        self.skipped_steps = 0
        self.skipped_in_a_row = 0

    # ------------------------------------------------------------------------------------- the loss
    def loss_ok(self, est: Estimate, batch: PreferenceBatch, batch_idx: int, step: int, strategy: Any) -> bool:
        """Whether the step goes on to its backward; raises under ``raise`` on a non-finite loss."""
        finite = bool(torch.isfinite(est.objective).all() and torch.isfinite(est.log_ratio).all())
        if self.mode == "skip":
            finite = strategy.reduce_boolean_decision(finite, all=True) if strategy is not None else finite
            if not finite:
                self._skip(step, batch_idx, "non-finite DPO loss")
            return finite
        if not finite:
            raise FloatingPointError(f"non-finite DPO loss at step {step} (batch {batch_idx}); "
                                     + "; ".join(_bad_rows(est, batch))
                                     + ". Set model.on_nonfinite=skip to skip such steps.")
        return True

    # ------------------------------------------------------------------------------------- the gradient
    def gradient_ok(self, norm: torch.Tensor | None, step: int, batch_idx: int) -> bool:
        """Whether the optimizer may apply a gradient of total norm ``norm`` (``None``: no gradient, nothing to
        check); raises under ``raise`` on a non-finite norm."""
        if norm is None or math.isfinite(float(norm)):
            if norm is not None:
                self.skipped_in_a_row = 0
            return True
        if self.mode == "skip":
            self._skip(step, batch_idx, f"non-finite gradient (norm {float(norm)}) with a finite loss")
            return False
        raise FloatingPointError(
            f"non-finite gradient (total norm {float(norm)}) at step {step} (batch {batch_idx}) with a finite DPO "
            "loss: the optimizer step would put NaN or Inf into the weights. Lower the learning rate, or set "
            "model.on_nonfinite=skip to skip such steps")

    # ------------------------------------------------------------------------------------- counting
    def _skip(self, step: int, batch_idx: int, what: str) -> None:
        self.skipped_steps += 1
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row > self.max_consecutive_skips:
            raise FloatingPointError(
                f"{self.skipped_in_a_row} steps in a row had a non-finite DPO loss or gradient (the last at step "
                f"{step}, batch {batch_idx}: {what}), more than model.max_consecutive_skips="
                f"{self.max_consecutive_skips}: the run diverged and is stopped. Lower the learning rate, or resume "
                "from a checkpoint written before the divergence")
        rank_zero_warn(f"skipping step {step} (batch {batch_idx}): {what}")

    def finite_step(self) -> None:
        """A step whose loss was finite and whose gradient is applied ends a streak of skips."""
        self.skipped_in_a_row = 0

    def state_dict(self) -> dict[str, int]:
        return {"skipped_nonfinite_steps": self.skipped_steps, "skipped_nonfinite_in_a_row": self.skipped_in_a_row}

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        self.skipped_steps = int(checkpoint.get("skipped_nonfinite_steps", 0))
        self.skipped_in_a_row = int(checkpoint.get("skipped_nonfinite_in_a_row", 0))


def _bad_rows(est: Estimate, batch: PreferenceBatch) -> list[str]:
    """The figures of up to four pairs whose loss or log-ratio is not finite: what a user needs to find them."""
    bad = (~torch.isfinite(est.log_ratio).all(-1) | ~torch.isfinite(est.loss)).nonzero().flatten()
    parts = []
    for i in bad[:4].tolist():
        row = int(batch.index[i])
        for b, name in enumerate(BRANCH_NAMES):
            parts.append(f"row {row} {name}: policy logp {float(est.policy_logps[i, b]):.4g}, "
                         f"reference logp {float(est.reference_logps[i, b]):.4g}")
        parts.append(f"row {row}: margin {float(est.margin[i]):.4g}, loss {float(est.loss[i]):.4g}")
    return parts
