"""Lightning's rich progress bar without the ``Epoch 0/-2`` of step-bounded runs.

``RichProgressBar`` writes ``Epoch {e}/{max_epochs - 1}``; a run bounded by ``max_steps`` has
``max_epochs = -1``, hence ``Epoch 0/-2``. :class:`StepProgressBar` writes ``Epoch {e}`` there, and the bar's
own ``{batch}/{total}`` and the step count carry the progress. The ``lit-prunedpo`` command puts it in place of
Lightning's default bar (never of one a config names).
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override


class StepProgressBar(RichProgressBar):
    """``RichProgressBar`` whose training description shows the epoch alone when ``max_epochs`` is unbounded."""

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        description = f"Epoch {current_epoch}"
        if len(self.validation_description) > len(description):  # as the parent pads, against flicker
            description = f"{description:{len(self.validation_description)}}"
        return description
