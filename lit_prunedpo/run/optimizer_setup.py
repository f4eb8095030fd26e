"""``PrunedDPO``'s optimizer and scheduler: built from the configured factories, recorded for its checkpoints, and
on a resume given back this run's arguments where the checkpoint's differ.

:class:`OptimizerRecord` keeps the record (:func:`lit_prunedpo.optim.describe`: classes and constructor arguments,
as configured and as in effect); checkpoints carry the configured one (``lit_prunedpo.run.state``). A resume loads
the checkpoint's record, and once Lightning has restored the optimizer and scheduler state,
:meth:`OptimizerRecord.apply_resumed` applies this run's arguments where they differ
(:func:`lit_prunedpo.optim.apply_changes`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_prunedpo.optim import WarmupCosineLR, apply_changes, describe

#: a checkpoint with optimizer state but no record (written by an older lit_prunedpo)
UNRECORDED = "unrecorded"


class OptimizerRecord:
    """The run's optimizer and scheduler, as configured and as in effect, and a resumed checkpoint's record until it
    is applied."""

    def __init__(self) -> None:
        self.configured: dict[str, Any] | None = None  # what checkpoints carry, before a resume's changes
        self.in_effect: dict[str, Any] | None = None  # as built (after WarmupCosineLR.fit_to)
        self.resumed: dict[str, Any] | str | None = None  # the checkpoint's, until apply_resumed

    def build(self, params: Iterable[torch.nn.Parameter], optimizer_factory: Callable[..., Any],
              scheduler_factory: Callable[..., Any] | None, stepping_batches: Callable[[], float]) -> Any:
        """``configure_optimizers``' answer: the factories' optimizer over ``params`` (the policy's trainable ones)
        and, when configured, their scheduler, stepped every optimizer step; both recorded. ``stepping_batches``:
        the run's optimizer steps (Lightning's ``estimated_stepping_batches``), asked only for a
        ``WarmupCosineLR``."""
        optimizer = optimizer_factory(list(params))
        scheduler = None if scheduler_factory is None else scheduler_factory(optimizer)
        self.configured = describe(optimizer, scheduler, getattr(scheduler_factory, "keywords", None))
        if isinstance(scheduler, WarmupCosineLR):
            scheduler.fit_to(int(stepping_batches()))
        self.in_effect = describe(optimizer, scheduler)
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``optimizer_setup`` (the configured record), or nothing before :meth:`build`."""
        return {} if self.configured is None else {"optimizer_setup": self.configured}

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Keep the checkpoint's record for :meth:`apply_resumed` (:data:`UNRECORDED` when it has optimizer state
        without one)."""
        self.resumed = checkpoint.get("optimizer_setup", UNRECORDED if "optimizer_states" in checkpoint else None)

    def apply_resumed(self, optimizers: list[torch.optim.Optimizer], schedulers: list[Any]) -> None:
        """After Lightning restored the optimizer and scheduler state (before the first step): apply this run's
        arguments where they differ from the checkpoint's (``lit_prunedpo.optim``); once. ``schedulers``:
        Lightning's scheduler configs (``trainer.lr_scheduler_configs``)."""
        saved, self.resumed = self.resumed, None
        if saved == UNRECORDED:
            rank_zero_warn("resume: the checkpoint records no optimizer or scheduler arguments (written by an older "
                           "lit_prunedpo): the restored optimizer and scheduler keep the checkpoint's, learning rate "
                           "included, whatever this run's model.optimizer and model.scheduler say")
            return
        if saved is None or self.configured is None or self.in_effect is None or len(optimizers) != 1:
            return
        apply_changes(saved, self.configured, self.in_effect, optimizers[0],
                      schedulers[0].scheduler if schedulers else None)
