"""Reference-free losses: SimPO and ORPO's odds ratio, functions of the policy's mean log-probs alone.

They set ``needs_reference = False``, so ``PrunedDPO`` builds no frozen copy of the policy, runs no reference
forward and loads no cache (``lit_prunedpo.reference.NoReference``): per pair, unpruned, the step costs
the policy's forward and backward only, and branch pruning's ideal saving rises from 1.33x to 1.5x. Both use
means over the full response length, estimated without bias as in ``lit_prunedpo.losses.normalized``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_prunedpo.losses.base import BranchSums, PreferenceLoss


class _ReferenceFree(PreferenceLoss):
    @property
    def needs_reference(self) -> bool:
        return False

    def reported(self, sums: BranchSums) -> BranchSums:
        """Per-token means, as TRL's ``CPOTrainer`` (SimPO) and ``ORPOTrainer`` log them: rewards ``beta * m_b``
        and ``logps/*`` the mean log-prob per token (TRL's ``trl/experimental/cpo/cpo_trainer.py``: ``cpo_loss``
        returns ``beta * policy_chosen_logps``, averaged per token by ``concatenated_forward`` for ``simpo``;
        ``orpo_trainer.py``'s ``odds_ratio_loss`` likewise, ``average_log_prob=True``; read at TRL 1.10)."""
        means = sums.means(type(self).__name__)
        return replace(means, reference=torch.zeros_like(means.policy))  # no reference in these rewards, ever


class SimPOLoss(_ReferenceFree):
    """SimPO (Meng et al., 2024) with its target reward margin ``gamma``: ``-log sigmoid(beta (m_w - m_l) - gamma)``
    with ``m_b`` the policy's mean log-prob per token of branch ``b``; with ``label_smoothing = eps`` the
    conservative mix ``-(1 - eps) log sigmoid(z) - eps log sigmoid(-z)``.

    Source: TRL 1.16.0 ``trl/experimental/cpo/cpo_trainer.py`` lines 709 and 715-722 (``loss_type="simpo"``,
    policy log-probs averaged per token, line 850; SimPO sets ``cpo_alpha=0``, no NLL term).

    Args:
        gamma: the target reward margin (TRL's ``simpo_gamma``).
        label_smoothing: in [0, 0.5).
    """

    def __init__(self, gamma: float = 0.5, label_smoothing: float = 0.0) -> None:
        if not 0.0 <= label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
        self.gamma = float(gamma)
        self.label_smoothing = float(label_smoothing)

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        means = sums.policy / sums.full_lengths("SimPOLoss").clamp(min=1)
        z = beta * (means[:, 0] - means[:, 1]) - self.gamma
        eps = self.label_smoothing
        return -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, switching at ``-ln 2`` for accuracy (TRL's ``log1mexp``)."""
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


class OddsRatioLoss(_ReferenceFree):
    """ORPO's odds-ratio term (Hong et al., 2024, eqs. 4 and 7): ``-beta * log sigmoid(log odds(y_w) -
    log odds(y_l))`` with ``log odds(y) = m - log(1 - exp(m))`` and ``m`` the policy's mean log-prob per token.
    ORPO is this plus the chosen response's NLL: ``WeightedLoss([SftLoss(), OddsRatioLoss()])``
    (``configs/losses/orpo.yaml``); ``beta`` is ORPO's ``lambda``.

    Source: TRL 1.16.0 ``trl/experimental/orpo/orpo_trainer.py`` lines 87-91 (``log1mexp``), 693-697 (the odds
    ratio, on log-probs averaged per token, line 805) and 848 (``loss = nll - losses.mean()``). Departure: ORPO's
    NLL there also covers the prompt tokens; ``SftLoss`` covers the response (TRL DPO's ``sft``).
    """

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        means = sums.policy / sums.full_lengths("OddsRatioLoss").clamp(min=1)
        log_odds = (means[:, 0] - means[:, 1]) - (_log1mexp(means[:, 0]) - _log1mexp(means[:, 1]))
        return -beta * F.logsigmoid(log_odds)
