"""What ``PrunedDPO``'s training steps log, under TRL's names (``train/*``), and when.

* Every step's pair metrics (``loss``, ``rewards/*``, ``logps/*``) and pruning statistics (``pruning/*``,
  ``work/*``) go into a window (``metrics.MetricWindow``). A step whose logs Lightning writes (every
  ``log_every_n_steps``, and the last; under gradient accumulation the micro-batch that steps the optimizer) logs
  their means over the (micro-batch) steps since the last log, as TRL's ``DPOTrainer``
  averages its metrics, with that step's own token metrics (``logits/*``, ``entropy``, ``mean_token_accuracy``) and
  the running ``num_tokens``; each value the mean over ranks.
* Every optimizer step logs the learning rate and the gradient norm, as TRL (``transformers``) logs them.
* A step skipped for a non-finite loss or gradient (``model.on_nonfinite: skip``) logs the run's count of skipped
  steps, ``train/skipped_nonfinite_steps``.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import torch
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.metrics import MetricWindow, gradient_norm, input_tokens, pair_metrics, token_metrics, weighted_mean
from lit_prunedpo.step.io import StepOutput


def logs_this_step(trainer: Any) -> bool:
    """Whether Lightning writes this training step's on-step logs (every ``log_every_n_steps``, and the last);
    True outside a trainer. Under gradient accumulation only the micro-batch that steps the optimizer: Lightning
    writes its row alone, and a window emptied by an earlier micro-batch would lose that one's values."""
    connector = getattr(trainer, "_logger_connector", None)
    if not getattr(connector, "should_update_logs", True):
        return False
    loop = getattr(trainer, "fit_loop", None)
    return not (loop is not None and trainer.lightning_module.automatic_optimization and loop._should_accumulate())


def window_values(out: StepOutput, beta: float) -> dict[str, Tensor | float]:
    """A step's values for the window: the means of its pair metrics, and its pruning statistics."""
    return {**{f"train/{k}": v.mean() for k, v in pair_metrics(out.estimate, beta).items()},
            **{f"train/{k}": v for k, v in out.stats.as_metrics().items()}}


class Logs(Protocol):
    """What writes values to the run's logs: a ``LightningModule``'s ``log`` and ``log_dict``."""

    def log(self, name: str, value: Any, **kwargs: Any) -> None: ...

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None: ...


def tokens_over_ranks(batch: PreferenceBatch, trainer: Any | None) -> int:
    """The batch's input tokens (TRL's ``num_tokens`` increment), summed over ``trainer``'s ranks as TRL gathers
    them; the batch's own outside a trainer."""
    count = input_tokens(batch)
    if trainer is not None and trainer.world_size > 1:
        total = torch.tensor(count, device=trainer.strategy.root_device)
        count = int(trainer.strategy.reduce(total, reduce_op="sum"))
    return count


class TrainingLog:
    """The window of per-step values a training log averages (``metrics.MetricWindow``), and what writes it."""

    def __init__(self) -> None:
        self.window = MetricWindow()

    def restart(self) -> None:
        """An empty window: a resumed run's starts with its first step."""
        self.window = MetricWindow()

    def add(self, out: StepOutput, beta: float) -> None:
        """A step's values into the window (a skipped step's own non-finite ones too, never the previous step's)."""
        self.window.add(window_values(out, beta))

    def write(self, sink: Logs, out: StepOutput, num_pairs: int, num_tokens: int) -> None:
        """Log through ``sink`` the window's means (emptying it), the step's token metrics and ``num_tokens``, each
        the mean over ranks."""
        values = self.window.pop_means()
        tokens = token_metrics(out.plan, out.logps.policy_token_stats, num_pairs)
        values.update({f"train/{k}": weighted_mean(v, w) for k, (v, w) in tokens.items()})
        # float64, so that the count stays exact past float32's 2**24 (Lightning keeps a step-only value's dtype)
        values["train/num_tokens"] = torch.tensor(num_tokens, dtype=torch.float64)
        # the mean over ranks, as TRL gathers every rank's values (only on logged steps: one small all-reduce)
        sink.log("train/loss", values.pop("train/loss"), on_step=True, on_epoch=False, prog_bar=True,
                 batch_size=num_pairs, sync_dist=True)
        sink.log_dict(values, on_step=True, on_epoch=False, batch_size=num_pairs, sync_dist=True)


def log_optimizer_step(sink: Logs, optimizer: torch.optim.Optimizer, norm: Tensor | None) -> None:
    """Log the learning rate and the gradient norm: ``norm`` if the gradient check measured it, else measured here;
    NaN for a step without a gradient (skipped), not the previous step's norm. Called after the (accumulated)
    backward, with gradients unscaled and not yet clipped: the norm that gradient clipping compares with
    ``gradient_clip_val``, as TRL's (``transformers``')."""
    sink.log("train/learning_rate", float(optimizer.param_groups[0]["lr"]), on_step=True, on_epoch=False)
    if norm is None:
        norm = gradient_norm(p for group in optimizer.param_groups for p in group["params"])
    sink.log("train/grad_norm", norm if norm is not None else float("nan"), on_step=True, on_epoch=False)


def log_skipped(sink: Logs, skipped_steps: int) -> None:
    """Log the run's count of steps skipped for a non-finite loss or gradient."""
    sink.log("train/skipped_nonfinite_steps", float(skipped_steps), on_step=True, on_epoch=False)
