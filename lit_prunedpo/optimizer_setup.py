"""``PrunedDPO``'s optimizer and scheduler: built from the configured factories, recorded for its checkpoints, and
on a resume given back this run's arguments where the checkpoint's differ.

The record (:func:`lit_prunedpo.optim.describe`: classes and constructor arguments, as configured and as in
effect) is kept on the module as ``_optimizer_setup``; checkpoints carry the configured one
(``lit_prunedpo.run_state``). A resume loads the checkpoint's record as ``_resumed_setup``, and once Lightning has
restored the optimizer and scheduler state, :func:`apply_resumed_setup` applies this run's arguments where they
differ (:func:`lit_prunedpo.optim.apply_changes`).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lit_prunedpo.optim import WarmupCosineLR, apply_changes, describe


def configure_optimizers(module: Any) -> Any:
    """``configure_optimizers``' answer for ``module`` (a ``PrunedDPO``): its factories' optimizer over the policy's
    trainable parameters and, when configured, their scheduler, stepped every optimizer step; records both."""
    params = [p for p in module.policy.parameters() if p.requires_grad]
    optimizer = module.optimizer_factory(params)
    scheduler = None if module.scheduler_factory is None else module.scheduler_factory(optimizer)
    # saved in checkpoints; a resume compares it with its own
    configured = describe(optimizer, scheduler, getattr(module.scheduler_factory, "keywords", None))
    if isinstance(scheduler, WarmupCosineLR):
        scheduler.fit_to(int(module.trainer.estimated_stepping_batches))
    module._optimizer_setup = (configured, describe(optimizer, scheduler))
    if scheduler is None:
        return optimizer
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def apply_resumed_setup(module: Any) -> None:
    """After Lightning restored the optimizer and scheduler state (before the first step): apply this run's
    optimizer and scheduler arguments where they differ from the checkpoint's (``lit_prunedpo.optim``)."""
    saved, module._resumed_setup = getattr(module, "_resumed_setup", None), None
    setup = getattr(module, "_optimizer_setup", None)
    if saved == "unrecorded":
        rank_zero_warn("resume: the checkpoint records no optimizer or scheduler arguments (written by an older "
                       "lit_prunedpo): the restored optimizer and scheduler keep the checkpoint's, learning rate "
                       "included, whatever this run's model.optimizer and model.scheduler say")
        return
    trainer = module.trainer
    if saved is None or setup is None or len(trainer.optimizers) != 1:
        return
    schedulers = trainer.lr_scheduler_configs
    apply_changes(saved, *setup, trainer.optimizers[0], schedulers[0].scheduler if schedulers else None)
