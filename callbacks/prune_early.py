"""Prune early, run exact late: a schedule over the module's samplers.

Early in training the gradient is large and a noisy, cheaper estimate of it still points the right way;
late, the loss is a small difference of large terms and the estimator's noise (IPW weights, a single
branch) is what keeps the loss from falling further. :class:`PruneEarly` keeps the configured samplers for
the first ``prune_fraction`` of the optimizer steps and then switches the module to the exact samplers
(``FullPrefix``, ``AllPositions``, ``BothBranches``), through ``PrunedDPO.use_samplers``: concatenated DPO for the
rest of the run.

Bias: none added. Each step is either a step of the configured samplers (with their guarantees, checked by
``lit_prunedpo.testing``) or an exact step; which one depends only on the step number, drawn before any
compute. The switch is a function of ``trainer.global_step``, so a resumed run switches where an
uninterrupted one would.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lit_prunedpo.step.plan import exact_samplers


class PruneEarly(Callback):
    """Prune during the first ``prune_fraction`` of ``trainer.max_steps``, then train exactly.

    Args:
        prune_fraction: share of the optimizer steps that use the configured samplers, in [0, 1].

    Raises:
        ValueError: on a fraction outside [0, 1], or (at fit start) a trainer without ``max_steps``.

    Example::

        trainer:
          callbacks:
            - class_path: lit_prunedpo.callbacks.PruneEarly
              init_args: {prune_fraction: 0.5}
    """

    def __init__(self, prune_fraction: float = 0.5) -> None:
        if not 0.0 <= prune_fraction <= 1.0:
            raise ValueError(f"prune_fraction must be in [0, 1], got {prune_fraction!r}")
        self.prune_fraction = float(prune_fraction)
        self._configured: tuple[Any, Any, Any] | None = None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.max_steps is None or trainer.max_steps < 1:
            raise ValueError("PruneEarly needs trainer.max_steps >= 1 to know when to stop pruning, got "
                             f"{trainer.max_steps!r}")
        self._configured = (pl_module.prefix_sampler, pl_module.position_sampler, pl_module.branch_sampler)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        assert self._configured is not None
        exact = trainer.global_step >= self.prune_fraction * trainer.max_steps
        pl_module.use_samplers(*(exact_samplers() if exact else self._configured))

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._configured is not None:  # leave the module as configured (e.g. for a second fit)
            pl_module.use_samplers(*self._configured)
