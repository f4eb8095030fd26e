"""The NLL term on the chosen response (TRL's ``sft`` loss type; RPO's and ORPO's NLL), pruned like the rest.

TRL averages the chosen responses' token log-probs over all chosen tokens of the batch. Its numerator is a sum
of per-branch sums, which pruning estimates without bias; its denominator is a count of tokens known before
pruning. So the pruned NLL is unbiased, and its gradient has the seam's form with the constant coefficient
``c_w = -B / sum_i T_w,i`` on each chosen sum (and ``c_l = 0``): add it with ``WeightedLoss``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_prunedpo.losses.base import BranchSums, PreferenceLoss


class SftLoss(PreferenceLoss):
    """TRL's ``sft`` (``trl/trainer/dpo_trainer.py`` lines 1496-1502 of TRL 1.16.0): ``-sum_i log pi(y_w,i) /
    sum_i T_w,i`` over the batch, spread over its pairs so that their mean is that value (as TRL expands it).
    Uses no reference and no ``beta``."""

    @property
    def needs_reference(self) -> bool:
        return False

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        return sums.policy[:, 0] * self._slope(sums)

    def policy_partials(self, sums: BranchSums, beta: float) -> Tensor:
        slope = self._slope(sums).expand(sums.policy.shape[0])
        return torch.stack([slope, torch.zeros_like(slope)], dim=-1)

    def _slope(self, sums: BranchSums) -> Tensor:
        chosen_tokens = sums.full_lengths("SftLoss")[:, 0].sum().clamp(min=1)
        return -sums.policy.shape[0] / chosen_tokens
