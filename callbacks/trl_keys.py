"""``TRLKeys``: a run's logs under TRL's keys (TRL 1.16's ``DPOTrainer``), with TRL's meaning, so that a TRL
dashboard or comparison script reads the run unchanged. The key map is :mod:`lit_prunedpo.trl_keys`."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lit_prunedpo.metrics import TOKEN_METRICS
from lit_prunedpo.trl_keys import REWARD_KEYS, RowContext, reports_dpo_rewards, trl_row
from lit_prunedpo.run.validation import metric_key

if TYPE_CHECKING:
    from lit_prunedpo.module import PrunedDPO

OWN_KEYS = ("unmatched", "all", "none")


class TRLKeys(Callback):
    """Write every row the trainer logs under TRL 1.16's keys: ``loss``, ``rewards/*``, ``logps/*``, ``logits/*``,
    ``entropy``, ``mean_token_accuracy``, ``num_tokens``, ``grad_norm``, ``learning_rate``, ``epoch``; in evaluation
    ``eval_loss``, ``eval_<each of those>``, ``eval_runtime``, ``eval_samples_per_second``,
    ``eval_steps_per_second``; the ``step`` is TRL's, the optimizer steps done (Lightning's training rows count from
    0). Each key only where the value means what TRL's means (docs/metrics.md, "Under TRL's own keys"):

    * ``loss``, ``rewards/*``, ``logps/*``: in a row whose steps pruned nothing (every ``train/pruning/*`` share 1);
      under pruning they are IPW estimates and stay under their own names (``train/loss``, ...);
    * ``rewards/*``, ``logps/*`` (and ``eval_`` ones): for losses whose rewards are ``DPOTrainer``'s; SimPO's and
      ORPO's follow TRL's ``CPOTrainer`` and ``ORPOTrainer`` (per-token means) and stay under their own names;
    * ``logits/*``, ``entropy``, ``mean_token_accuracy``: in a row that covers one batch (``log_every_n_steps: 1``,
      no gradient accumulation) that pruned nothing: here they are the logged batch's, TRL's the window's mean;
    * ``eval_*`` but ``eval_loss``: the mean of the validation batches' values, as TRL averages them (``val/*`` weigh
      every pair alike; the two agree when the batches are equal); ``eval_loss`` is ``val/loss``, both per pair;
    * ``num_tokens``: counted from this ``fit``'s start, as TRL's (which restarts at 0 on a resume;
      ``train/num_tokens`` goes on counting);
    * ``epoch``: fractional, ``epoch + (batch + 1) / batches per epoch``; none outside ``fit`` or for an endless
      dataloader. Lightning's own ``epoch`` (whole epochs) is never written: it is not TRL's.

    Never written (:data:`lit_prunedpo.trl_keys.NOT_PROVIDED`): ``aux_loss`` (mixture-of-experts router loss) and
    the end-of-training summary (``train_runtime``, ``train_loss``, ``total_flos``, ...). With several validation
    dataloaders a validation row gets the speed keys alone (TRL names each set's keys, ``eval_<name>_*``), its
    ``val/*`` keeping their names; ``test/*`` keep theirs. Rows that other code writes to a logger directly
    (``LearningRateMonitor``'s) pass unchanged.

    It works on every logger of the trainer (CSV, TensorBoard, ...): each one's ``log_metrics`` is wrapped for the
    run, so that the loggers and the folders they write to stay the ones the config chose.

    Args:
        own_keys: ``"unmatched"`` (default) also writes, under their own names, the metrics given no TRL key in a row
            (``train/pruning/*``, ``memory/*``, a pruned window's ``train/loss``); ``"all"`` also every own key
            beside its TRL one (to compare them); ``"none"`` TRL's keys alone.

    Raises:
        ValueError: another ``own_keys``.
        TypeError: at set-up, a module that is no ``PrunedDPO``.

    Example (YAML)::

        trainer:
          callbacks:
            - class_path: lit_prunedpo.callbacks.TRLKeys
    """

    def __init__(self, own_keys: str = "unmatched") -> None:
        super().__init__()
        if own_keys not in OWN_KEYS:
            raise ValueError(f"TRLKeys(own_keys={own_keys!r}): give one of {', '.join(map(repr, OWN_KEYS))}")
        self.own_keys = own_keys
        self._trainer: pl.Trainer | None = None
        self._module: PrunedDPO | None = None
        self._wrapped: list[Any] = []
        self._dpo_rewards = True
        self._token_start: int | None = None
        self._epoch: float | None = None
        self._batches = 0
        self._last: tuple[Mapping[str, Any], dict[str, Any]] | None = None
        self._eval_start = 0.0
        self._sums: list[torch.Tensor] = []
        self._evaluation: dict[str, float] = {}

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not all(hasattr(pl_module, name) for name in ("val_metrics", "num_tokens", "loss")):
            raise TypeError(f"TRLKeys writes PrunedDPO's metrics under TRL's keys; this module is a "
                            f"{type(pl_module).__name__}: remove TRLKeys from the callbacks")
        self._trainer, self._module = trainer, pl_module
        self._dpo_rewards = reports_dpo_rewards(pl_module.loss)
        self._token_start, self._epoch, self._batches = None, None, 0
        for logger in trainer.loggers:
            if "log_metrics" not in vars(logger):  # an instance attribute: this logger alone, the class untouched
                logger.log_metrics = functools.partial(self._write, logger.log_metrics)
                self._wrapped.append(logger)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for logger in self._wrapped:
            vars(logger).pop("log_metrics", None)
        self._wrapped, self._last = [], None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._token_start = int(pl_module.num_tokens)  # restored from a checkpoint by now: TRL's count starts at 0

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        per_epoch = trainer.num_training_batches
        finite = isinstance(per_epoch, int) and per_epoch > 0
        # transformers' state.epoch: epoch + (step + 1) / steps_in_epoch, updated at every optimizer step
        self._epoch = trainer.current_epoch + (batch_idx + 1) / per_epoch if finite else None

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._batches += 1

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._evaluation = {}
        if not trainer.sanity_checking:  # the sanity check logs nothing
            self._eval_start = time.perf_counter()
            self._sums = [self._metric_sums(pl_module)]

    @override
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            self._sums.append(self._metric_sums(pl_module))

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or len(self._sums) < 2:
            return
        # each batch's sums of every rank together: TRL gathers the ranks' values of a batch before its mean
        per_batch = trainer.strategy.reduce(torch.diff(torch.stack(self._sums), dim=0), reduce_op="sum")
        runtime = time.perf_counter() - self._eval_start
        self._sums = []
        self._evaluation = self._speed(runtime, per_batch)
        if len(trainer.num_val_batches) == 1:  # several validation sets: TRL names each, eval_<name>_*
            self._evaluation.update(self._batch_means(per_batch))

    def _names(self) -> list[str]:
        """The validation metrics summed per batch: ``loss`` (its weights count the pairs), then those whose TRL
        value is the mean of the batches' values (``eval_loss`` itself is the mean over pairs, ``val/loss``)."""
        return ["loss", *(REWARD_KEYS if self._dpo_rewards else ()), *TOKEN_METRICS]

    def _metric_sums(self, pl_module: PrunedDPO) -> torch.Tensor:
        """``[M, 2]``: each validation mean's running ``(sum of value * weight, sum of weight)`` on this rank."""
        means = [pl_module.val_metrics[metric_key(name)] for name in self._names()]
        return torch.stack([torch.stack([m.mean_value.double(), m.weight.double()]) for m in means])

    def _batch_means(self, per_batch: torch.Tensor) -> dict[str, float]:
        """TRL's ``eval_<name>``: the mean over batches of each batch's value (0 for a batch without tokens)."""
        value = per_batch[..., 0] / per_batch[..., 1].clamp(min=torch.finfo(torch.float64).tiny)
        return {f"eval_{name}": float(value[:, i].mean()) for i, name in enumerate(self._names()) if i > 0}

    @staticmethod
    def _speed(runtime: float, per_batch: torch.Tensor) -> dict[str, float]:
        """transformers' ``speed_metrics("eval", ...)``: the pairs and batches per second, rounded as there."""
        pairs, runtime = float(per_batch[:, 0, 1].sum()), max(runtime, 1e-9)
        return {"eval_runtime": round(runtime, 4), "eval_samples_per_second": round(pairs / runtime, 3),
                "eval_steps_per_second": round(per_batch.shape[0] / runtime, 3)}

    def _write(self, write: Callable[..., None], metrics: Mapping[str, Any], step: int | None = None) -> None:
        """The wrapped ``log_metrics`` of a logger: the row under TRL's keys, at TRL's step."""
        if "epoch" not in metrics:  # not a row of Lightning's logger connector: written by other code as it is
            write(metrics, step=step)
            return
        if self._last is None or self._last[0] is not metrics:  # one row, computed once for all the loggers
            self._last = (metrics, self._row(metrics))
        write(self._last[1], step=self._trainer.global_step)

    def _row(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        trainer, module = self._trainer, self._module
        fitting = trainer.state.fn == "fit"
        evaluation = any(key.startswith("val/") for key in metrics)
        start = self._token_start if self._token_start is not None and fitting else int(module.num_tokens)
        tokens = metrics.get("train/num_tokens") if not evaluation else module.num_tokens
        ctx = RowContext(epoch=self._epoch if fitting else None,
                         num_tokens=None if tokens is None else float(tokens) - start, batches=self._batches,
                         dpo_rewards=self._dpo_rewards, evaluation=self._evaluation if evaluation else {})
        if any(key.startswith("train/") for key in metrics):
            self._batches = 0
        return trl_row(metrics, ctx, self.own_keys)
