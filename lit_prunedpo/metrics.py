"""What a step reports: TRL's metric names (so dashboards carry over) and the pruning statistics.

Per-pair values are returned as tensors so that epoch aggregation (``torchmetrics.MeanMetric``) weighs every
pair equally, across batches of any size and across DDP ranks. The token metrics (:data:`TOKEN_METRICS`) are
TRL's token-weighted means: a ``(value, weight)`` per pair, ``weight`` the (estimated) number of response
tokens, aggregated as ``sum(value * weight) / sum(weight)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.step.estimate import Estimate
from lit_prunedpo.step.plan import StepPlan

PAIR_METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


#: TRL's token-level metrics, from the policy's logits at the scored positions (``lit_prunedpo.scoring.token_stats``).
TOKEN_METRICS = ("logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy")


def pair_metrics(est: Estimate, beta: float) -> dict[str, Tensor]:
    """Per-pair ``[B]`` values under TRL's names; rewards are the loss's (:attr:`Estimate.rewards`: ``beta * R_hat``
    for DPO's losses, per-token means for SimPO and ORPO as TRL logs them)."""
    rewards = est.rewards if est.rewards is not None else beta * est.log_ratio
    policy = (est.reported_logps if est.reported_logps is not None else est.policy_logps).detach()
    return {
        "loss": est.loss,
        "rewards/chosen": rewards[:, 0],
        "rewards/rejected": rewards[:, 1],
        "rewards/margins": rewards[:, 0] - rewards[:, 1],
        "rewards/accuracies": (rewards[:, 0] > rewards[:, 1]).float(),
        "logps/chosen": policy[:, 0],
        "logps/rejected": policy[:, 1],
    }


@dataclass(frozen=True)
class StepStats:
    """Work done by one step's policy forwards, what an unpruned concatenated step would have done, and what the
    samplers kept.

    ``tokens_executed`` counts padded tokens entering the policy body; ``positions_scored`` counts rows
    entering the LM head; ``reference_tokens_executed`` is the online reference's share (0 when cached).
    """

    tokens_executed: int
    positions_scored: int
    branches_backpropagated: int
    reference_tokens_executed: int
    unpruned_tokens: int
    unpruned_positions: int
    unpruned_branches: int
    kept_positions: int
    drawn_positions: int

    def as_metrics(self) -> dict[str, float]:
        """``pruning/*``: the samplers' shares, exactly 1 in a step that prunes nothing; ``work/*``: what the step
        ran against concatenated, unpruned DPO, below 1 also without pruning where the layout saves work (each
        prompt once, the responses' common start scored once under a margin loss)."""
        return {
            "pruning/response_tokens_kept_frac": self.kept_positions / max(1, self.unpruned_positions),
            "pruning/positions_scored_frac": self.drawn_positions / max(1, self.unpruned_positions),
            "pruning/branches_backpropagated_frac": self.branches_backpropagated / self.unpruned_branches,
            "work/tokens_executed": float(self.tokens_executed),
            "work/positions_scored": float(self.positions_scored),
            "work/branches_backpropagated": float(self.branches_backpropagated),
            "work/tokens_executed_frac": self.tokens_executed / self.unpruned_tokens,
            "work/positions_scored_frac": self.positions_scored / max(1, self.unpruned_positions),
        }


class MetricWindow:
    """Per-step training values summed since the last log, logged as their mean: TRL's logged training metrics
    (``DPOTrainer._metrics``, lists averaged and cleared at every log, as ``transformers`` averages the loss over
    ``logging_steps``), not the value of the logged step alone."""

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self._steps = 0

    def add(self, values: dict[str, Tensor | float]) -> None:
        """One step's values (the same names every step); kept on their device, no synchronisation."""
        for name, value in values.items():
            value = torch.as_tensor(value).detach().to(torch.float64)
            self._sums[name] = self._sums[name] + value if name in self._sums else value
        self._steps += 1

    def pop_means(self) -> dict[str, Tensor]:
        """The mean of every value over the steps added since the last call; the window starts again empty."""
        means = {name: total / self._steps for name, total in self._sums.items()}
        self._sums, self._steps = {}, 0
        return means


def token_metrics(plan: StepPlan, token_stats: Sequence[Tensor], num_pairs: int) -> dict[str, tuple[Tensor, Tensor]]:
    """TRL's token metrics of one step as ``(value [B], weight [B])`` per name (see :data:`TOKEN_METRICS`).

    ``token_stats`` holds one ``[K_g, 3]`` tensor per plan group (``StepLogps.policy_token_stats``), at the positions
    the whole LM head ran on (where the log-softmax is split, the drawn ones, ``RowGroup.lse_index``, weighted by
    ``lse_weight``). Each such position counts with its inverse-probability weight: ``value = sum_t w_t x_t / sum_t
    w_t`` over a branch's scored positions, ``weight = sum_t w_t`` (the estimated number of its response positions), so
    the aggregate ``sum(value * weight) / sum(weight)`` is the ratio of two IPW estimates (consistent, not unbiased) of
    TRL's token mean, and exactly TRL's value when nothing is pruned. ``entropy`` covers both branches,
    ``mean_token_accuracy`` the chosen one (as TRL's).
    """
    device = token_stats[0].device if token_stats else torch.device("cpu")
    sums = torch.zeros(2 * num_pairs, 4, dtype=torch.float32, device=device)  # on the stats' device: no sync
    for group, stats in zip(plan.groups, token_stats, strict=True):
        weight, rows, shared = group.weight, group.scored_row, group.shared
        if group.splits_log_softmax:
            index = group.lse_index
            weight, rows = group.lse_weight[index], rows[index]
            shared = None if shared is None else shared[index]
        weight = weight.to(device=device, dtype=torch.float32)
        values = torch.cat([torch.ones_like(weight)[:, None], stats.detach().float()], dim=-1)
        slots = (group.pair * 2 + group.branch)[rows].to(device)
        sums.index_add_(0, slots, values * weight[:, None])
        if shared is not None:  # a common-start position counts in both branches (TRL's means)
            shared = shared.to(device)
            sums.index_add_(0, slots[shared] ^ 1, (values * weight[:, None])[shared])
    sums = sums.view(num_pairs, 2, 4)
    count = sums[..., 0]
    tiny = torch.finfo(torch.float32).tiny
    mean = sums[..., 1:] / count.clamp(min=tiny)[..., None]
    both = count.sum(-1)
    return {
        "logits/chosen": (mean[:, 0, 0], count[:, 0]),
        "logits/rejected": (mean[:, 1, 0], count[:, 1]),
        "entropy": (sums[..., 2].sum(-1) / both.clamp(min=tiny), both),
        "mean_token_accuracy": (mean[:, 0, 2], count[:, 0]),
    }


def weighted_mean(value: Tensor, weight: Tensor) -> Tensor:
    """``sum(value * weight) / sum(weight)`` (0 when every weight is 0)."""
    return (value * weight).sum() / weight.sum().clamp(min=torch.finfo(weight.dtype).tiny)


def input_tokens(batch: PreferenceBatch) -> int:
    """TRL's ``num_tokens`` increment of a batch: the real tokens of its concatenated inputs, prompt + chosen and
    prompt + rejected (each prompt counted twice), padding excluded; what the pairs hold, whatever a step prunes."""
    return int(2 * batch.prompt_mask.sum() + batch.response_mask.sum())


def gradient_norm(parameters: Iterable[Tensor]) -> Tensor | None:
    """The total 2-norm of the parameters' gradients (``torch.nn.utils.clip_grad_norm_``'s return value, before
    any clipping), or ``None`` when none has a gradient. Under FSDP2 the gradients are shards (``DTensor``): the
    norm is made whole across ranks (``full_tensor``, a collective every rank runs); under DDP the gradients are
    already all-reduced, so every rank's norm is the global one."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return None
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    full_tensor = getattr(norm, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else norm
