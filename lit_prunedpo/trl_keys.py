"""TRL's logged keys and the rows :class:`lit_prunedpo.callbacks.TRLKeys` writes under them.

The keys are TRL 1.16's ``DPOTrainer`` (its ``_metrics``, averaged over the steps since the previous log and
prefixed ``eval_`` in evaluation) and the ``transformers`` ``Trainer`` under it (``loss``, ``grad_norm``,
``learning_rate``, ``epoch``; ``eval_loss`` and the evaluation's speed). :func:`training_row` and
:func:`evaluation_row` turn one row of this package's metrics (``train/*``, ``val/*``) into TRL's keys, each only
where the value means what TRL's means: a window that pruned anything gives IPW estimates, not TRL's values, and a
loss whose rewards follow another TRL trainer (SimPO, ORPO) gives no ``DPOTrainer`` rewards. What is left out is
said in :data:`NOT_PROVIDED` and docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from lit_prunedpo.losses.base import BranchSums, PreferenceLoss

#: ``DPOTrainer._metrics`` of TRL 1.16 (``trl/trainer/dpo_trainer.py``, ``compute_loss``), in its order.
DPO_METRICS = (
    "aux_loss", "entropy", "num_tokens", "logits/chosen", "logits/rejected", "mean_token_accuracy",
    "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected",
)
#: What the ``transformers`` ``Trainer`` adds to a training row (``_maybe_log_save_evaluate``, ``log``).
TRAINER_TRAINING = ("loss", "grad_norm", "learning_rate", "epoch")
#: What it adds to an evaluation row (``evaluate``: ``eval_loss`` and ``speed_metrics``; ``log``: ``epoch``).
TRAINER_EVALUATION = ("eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch")
#: Its summary row at the end of training (``train``).
TRAINER_END = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss")

#: Every key a TRL 1.16 ``DPOTrainer`` run logs (without opt-in extras such as ``num_input_tokens_seen``).
TRL_KEYS = frozenset(
    {*TRAINER_TRAINING, *DPO_METRICS, *TRAINER_EVALUATION, *(f"eval_{k}" for k in DPO_METRICS), *TRAINER_END}
)
#: The keys :class:`~lit_prunedpo.callbacks.TRLKeys` never writes, and why.
NOT_PROVIDED = {
    "aux_loss": "the router's auxiliary loss of mixture-of-experts models (TRL logs it with output_router_logits); "
                "no loss here adds one",
    "eval_aux_loss": "as aux_loss",
    **{key: "transformers' summary row at the end of training; the run summary is FinalCheckpoint's log line"
       for key in TRAINER_END},
}
#: The keys it writes (each only in the rows where it has TRL's meaning: docs/metrics.md).
PROVIDED = TRL_KEYS - NOT_PROVIDED.keys()

#: TRL's keys whose value the pair metrics give (exact only when nothing was pruned).
PAIR_KEYS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
             "logps/rejected")
#: Of those, the ones that are ``DPOTrainer``'s only when the loss reports its rewards (beta times summed log-ratios).
REWARD_KEYS = PAIR_KEYS[1:]
#: TRL's token metrics: here the logged step's alone, so TRL's (a mean over the window) when a row covers one batch.
TOKEN_KEYS = ("logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy")
#: The samplers' shares: all exactly 1 in a window that pruned nothing (``metrics.StepStats.as_metrics``).
PRUNING_SHARES = ("pruning/response_tokens_kept_frac", "pruning/positions_scored_frac",
                  "pruning/branches_backpropagated_frac")


@dataclass
class RowContext:
    """What a row's TRL keys need beyond the logged metrics.

    Attributes:
        epoch: TRL's fractional epoch (``epoch + (batch + 1) / batches_per_epoch``), ``None`` outside training.
        num_tokens: TRL's ``num_tokens`` (input tokens since this ``fit`` started; TRL's count restarts at a resume).
        batches: training batches since the previous training row was written.
        dpo_rewards: whether the loss's ``rewards/*`` and ``logps/*`` are ``DPOTrainer``'s.
        evaluation: the evaluation's TRL values computed outside the row (batch means, speed), ``eval_`` keys.
    """

    epoch: float | None = None
    num_tokens: float | None = None
    batches: int = 1
    dpo_rewards: bool = True
    evaluation: dict[str, float] = field(default_factory=dict)


def reports_dpo_rewards(loss: PreferenceLoss) -> bool:
    """Whether ``loss`` reports ``DPOTrainer``'s ``rewards/*`` and ``logps/*`` (``beta`` times the summed log-ratios,
    the summed log-probs): its :meth:`~PreferenceLoss.reported` hands the sums back as they are. SimPO and ORPO report
    per-token means, as TRL's ``CPOTrainer`` and ``ORPOTrainer`` do: no ``DPOTrainer`` key has their meaning."""
    probe = BranchSums(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    return loss.reported(probe) is probe


def unpruned(metrics: Mapping[str, Any], prefix: str = "train/") -> bool:
    """Whether the row's window pruned nothing: every sampler share present and exactly 1 (a mean of shares that
    are each at most 1 is 1 only when every step's is)."""
    shares = [metrics.get(prefix + name) for name in PRUNING_SHARES]
    return all(share is not None and float(share) == 1.0 for share in shares)


def training_row(metrics: Mapping[str, Any], ctx: RowContext) -> dict[str, str]:
    """``{TRL key: own key}`` for a training row: the metrics of ``metrics`` that have TRL's meaning here."""
    names = {"grad_norm": "train/grad_norm", "learning_rate": "train/learning_rate"}
    exact = unpruned(metrics)
    if exact:
        names.update({key: f"train/{key}" for key in PAIR_KEYS if ctx.dpo_rewards or key not in REWARD_KEYS})
    if exact and ctx.batches == 1:
        names.update({key: f"train/{key}" for key in TOKEN_KEYS})
    return {trl: own for trl, own in names.items() if own in metrics}


def evaluation_names(metrics: Mapping[str, Any], ctx: RowContext) -> dict[str, str]:
    """``{TRL key: own key}`` for an evaluation row: ``eval_loss`` is ``val/loss`` (both the mean over pairs);
    the other ``eval_*`` come from ``ctx.evaluation`` (TRL averages them per evaluation batch), and the ``val/*``
    they stand for are consumed too."""
    names = {"eval_loss": "val/loss"} if "val/loss" in metrics else {}
    for key in (*PAIR_KEYS[1:], *TOKEN_KEYS):
        if f"eval_{key}" in ctx.evaluation and f"val/{key}" in metrics:
            names[f"eval_{key}"] = f"val/{key}"
    return names


def trl_row(metrics: Mapping[str, Any], ctx: RowContext, own_keys: str = "unmatched") -> dict[str, Any]:
    """One logged row under TRL's keys.

    ``own_keys``: ``"unmatched"`` also keeps, under their own names, the metrics given no TRL key in this row
    (``train/pruning/*``, ``memory/*``, a pruned window's ``train/loss``, ...); ``"all"`` keeps every own key beside
    its TRL one; ``"none"`` writes TRL's keys alone. Lightning's own ``epoch`` (the whole epochs done) is never kept:
    TRL's ``epoch`` is fractional.
    """
    evaluation = any(key.startswith("val/") for key in metrics)
    names = evaluation_names(metrics, ctx) if evaluation else training_row(metrics, ctx)
    # an evaluation row's eval_* but eval_loss are the batch means of ctx.evaluation: the val/* they replace differ
    row: dict[str, Any] = {trl: ctx.evaluation[trl] if trl in ctx.evaluation else metrics[own]
                           for trl, own in names.items()}
    if evaluation:
        row.update({k: v for k, v in ctx.evaluation.items() if k not in row})
    if ctx.num_tokens is not None and ("train/num_tokens" in metrics or evaluation):
        row["eval_num_tokens" if evaluation else "num_tokens"] = ctx.num_tokens
        names["num_tokens"] = "train/num_tokens"
    if ctx.epoch is not None:
        row["epoch"] = ctx.epoch
    if own_keys != "none":
        renamed = set(names.values()) if own_keys == "unmatched" else set()
        row.update({k: v for k, v in metrics.items() if k != "epoch" and k not in renamed and k not in row})
    return row
