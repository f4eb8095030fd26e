"""Lightning's rich progress bar showing what a DPO run is watched by: step, loss, validation accuracy, speed.

``RichProgressBar`` writes ``Epoch {e}/{max_epochs - 1}``; a run bounded by ``max_steps`` has
``max_epochs = -1``, hence ``Epoch 0/-2``. :class:`StepProgressBar` writes ``Epoch {e}`` there, and the bar's
own ``{batch}/{total}`` and the step count carry the progress. Its metrics are ``step``, ``loss``
(``train/loss``), ``val acc`` (``val/rewards/accuracies``, once a validation ran), ``steps/s`` and ``tokens/s``
(forward tokens this rank executed, from the module's ``step_stats``) over the last ``window`` steps; no
``v_num`` (the log folder is named at the start and in the summary) and no metric name cut off by the bar's width.
Other metrics logged with ``prog_bar=True`` follow under their own names. The ``lit-prunedpo`` command puts it in
place of Lightning's default bar (never of one a config names).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override

# progress-bar metrics shown under a short name (the full names are in the logs)
_SHORT = {"train/loss": "loss", "val/rewards/accuracies": "val acc"}


def _count(value: float) -> str:
    """``987``, ``13.2k``, ``4.1M``: a rate short enough for the bar."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


class StepProgressBar(RichProgressBar):
    """``RichProgressBar`` with step, loss, validation accuracy, steps and tokens per second, and no ``v_num``.

    Args:
        window: steps the speeds are averaged over.
        **kwargs: ``RichProgressBar``'s arguments (``refresh_rate``, ``leave``, ``theme``, ...).

    Raises:
        ValueError: ``window`` below 1.
    """

    def __init__(self, window: int = 10, **kwargs: Any) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        super().__init__(**kwargs)
        self._marks: deque[tuple[float, int, int]] = deque(maxlen=window + 1)  # (clock, step, tokens so far)
        self._tokens = 0

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._tokens = 0
        self._marks.clear()
        self._marks.append((time.perf_counter(), trainer.global_step, 0))

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        stats = getattr(pl_module, "step_stats", None)
        self._tokens += int(getattr(stats, "tokens_executed", 0) or 0)
        if not self._marks or trainer.global_step != self._marks[-1][1]:  # a whole optimizer step, not a micro-batch
            self._marks.append((time.perf_counter(), trainer.global_step, self._tokens))
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        shown: dict[str, Any] = {"step": str(trainer.global_step)}
        logged = dict(trainer.progress_bar_metrics)
        for name, short in _SHORT.items():
            if name in logged:
                shown[short] = f"{float(logged.pop(name)):.3f}"
        if len(self._marks) > 1:
            (t0, s0, k0), (t1, s1, k1) = self._marks[0], self._marks[-1]
            if t1 > t0:
                shown["steps/s"] = f"{(s1 - s0) / (t1 - t0):.3g}"
                if k1 > k0:
                    shown["tok/s"] = _count((k1 - k0) / (t1 - t0))
        return {**shown, **logged}

    @override
    def configure_columns(self, trainer: pl.Trainer) -> list:
        # Lightning's it/s column counts validation batches too; steps/s among the metrics replaces it, which also
        # leaves the metrics room on an 80-column terminal
        columns = [c for c in super().configure_columns(trainer) if type(c).__name__ != "ProcessingSpeedColumn"]
        for column in columns:
            if hasattr(column, "bar_width"):
                column.bar_width = 20  # rich's 40 leaves the metrics a second line on a 120-column terminal
        return columns

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        description = f"Epoch {current_epoch}"
        if len(self.validation_description) > len(description):  # as the parent pads, against flicker
            description = f"{description:{len(self.validation_description)}}"
        return description
