"""``LastCheckpointAtValidation``: the CLI's default checkpoint, ``last.ckpt`` written at every validation.

Why not Lightning's ``ModelCheckpoint(save_top_k=0, save_last=True)`` alone: since Lightning 2.6 it writes ``last``
only in a step where it also saved a top-k checkpoint, which ``save_top_k=0`` never does, so a run killed after
its validations (an out-of-memory kill, a lost node) left no checkpoint at all. This subclass writes ``last.ckpt``
at the end of each validation where nothing else saved in that step; everything else is ``ModelCheckpoint``'s.

A resume restores it without Lightning's warning "The dirpath has changed ... won't be reloaded": every run writes
into a checkpoint folder of its own (``lit_prunedpo.checkpoint.claims``), so the folder always changes, and this
callback keeps no best-k state that would be lost (``save_top_k=0``, no monitor); only ``best_model_path`` is taken.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint


class LastCheckpointAtValidation(ModelCheckpoint):
    """``ModelCheckpoint`` that keeps ``last.ckpt`` current at every validation (see the module docstring)."""

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if (self.save_last and not self._should_skip_saving_checkpoint(trainer)
                and not self._should_save_on_train_epoch_end(trainer)
                and self._last_global_step_saved != trainer.global_step):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath", self.dirpath) == self.dirpath or self.monitor is not None or self.save_top_k:
            return super().load_state_dict(state_dict)
        # another run's folder: its last.ckpt is not this run's (this one writes its own), and there is no best-k
        self.best_model_path = state_dict.get("best_model_path", "")
