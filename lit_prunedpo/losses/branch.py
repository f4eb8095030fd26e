"""Per-branch losses: functions of each branch's log-ratio ``R_b``, not of the margin alone (TRL's ``nca_pair``,
``bco_pair``, ``sppo_hard``, ``apo_zero``, ``apo_down``).

They anchor each response's reward on its own (push the chosen one up, the rejected one down), so the tokens
two responses share do not cancel: ``margin_only`` is False. Their gradient is still ``c_w grad R_w + c_l grad
R_l``, which the pruned surrogate estimates. TRL line numbers refer to ``trl/trainer/dpo_trainer.py`` of TRL
1.16.0, ``_compute_loss``; ``r_b = beta * R_b``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_prunedpo.losses.base import BranchSums, PreferenceLoss


class NcaPairLoss(PreferenceLoss):
    """NCA (Chen et al., 2024), TRL's ``nca_pair`` (lines 1420-1426):
    ``-log sigmoid(r_w) - 0.5 log sigmoid(-r_w) - 0.5 log sigmoid(-r_l)``."""

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        r = beta * sums.log_ratio
        return -F.logsigmoid(r[:, 0]) - 0.5 * F.logsigmoid(-r[:, 0]) - 0.5 * F.logsigmoid(-r[:, 1])


class BcoPairLoss(PreferenceLoss):
    """BCO on pairs (Jung et al., 2024), TRL's ``bco_pair`` (lines 1434-1436): ``-log sigmoid(r_w) -
    log sigmoid(-r_l)``, without BCO's running reward shift (TRL's pair form has none either)."""

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        r = beta * sums.log_ratio
        return -F.logsigmoid(r[:, 0]) - F.logsigmoid(-r[:, 1])


class SppoHardLoss(PreferenceLoss):
    """SPPO with hard labels (Wu et al., 2024), TRL's ``sppo_hard`` (lines 1443-1445):
    ``(R_w - 1 / (2 beta))^2 + (R_l + 1 / (2 beta))^2``."""

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        ratio = sums.log_ratio
        return (ratio[:, 0] - 0.5 / beta) ** 2 + (ratio[:, 1] + 0.5 / beta) ** 2

    def policy_partials(self, sums: BranchSums, beta: float) -> Tensor:
        target = torch.tensor([0.5 / beta, -0.5 / beta], dtype=sums.policy.dtype, device=sums.policy.device)
        return 2.0 * (sums.log_ratio.detach() - target)


class ApoZeroLoss(PreferenceLoss):
    """APO-zero (D'Oosterlinck et al., 2024, eq. 7), TRL's ``apo_zero`` (lines 1470-1473): raise the chosen
    likelihood, lower the rejected one, ``1 - sigmoid(r_w) + sigmoid(r_l)``."""

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        r = beta * sums.log_ratio
        return 1 - torch.sigmoid(r[:, 0]) + torch.sigmoid(r[:, 1])


class ApoDownLoss(PreferenceLoss):
    """APO-down (D'Oosterlinck et al., 2024, eq. 8), TRL's ``apo_down`` (lines 1478-1481): lower both
    likelihoods, the rejected one more, ``sigmoid(r_w) + 1 - sigmoid(r_w - r_l)``."""

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        r = beta * sums.log_ratio
        return torch.sigmoid(r[:, 0]) + 1 - torch.sigmoid(r[:, 0] - r[:, 1])
