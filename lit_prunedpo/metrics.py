"""What a step reports: TRL's metric names (so dashboards carry over) and the pruning statistics.

Per-pair values are returned as tensors so that epoch aggregation (``torchmetrics.MeanMetric``) weighs every
pair equally, across batches of any size and across DDP ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lit_prunedpo.estimate import Estimate

PAIR_METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def pair_metrics(est: Estimate, beta: float) -> dict[str, Tensor]:
    """Per-pair ``[B]`` values under TRL's names; rewards are ``beta * R_hat``."""
    rewards = beta * est.log_ratio
    policy = est.policy_logps.detach()
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
    """Work done by one step's policy forwards, and what an unpruned concatenated step would have done.

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

    def as_metrics(self) -> dict[str, float]:
        return {
            "pruning/tokens_executed": float(self.tokens_executed),
            "pruning/positions_scored": float(self.positions_scored),
            "pruning/branches_backpropagated": float(self.branches_backpropagated),
            "pruning/tokens_executed_frac": self.tokens_executed / self.unpruned_tokens,
            "pruning/positions_scored_frac": self.positions_scored / max(1, self.unpruned_positions),
            "pruning/branches_backpropagated_frac": self.branches_backpropagated / self.unpruned_branches,
        }
