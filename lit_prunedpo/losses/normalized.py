"""Length-normalised losses: any loss applied to per-token means instead of sums (TRL's ``sigmoid_norm``, and
its ``ipo``, which averages too).

Pruning estimates sums, but a mean over the *full* response is a sum divided by a length the batch knows
before anything is pruned: ``R_hat / T`` is unbiased for ``R / T`` under position and prefix pruning (checked
by enumeration in the tests, with ``lit_prunedpo.testing.check_reward_estimate``). The chain rule then gives
the partials of the sums: the inner loss's partials of the means divided by ``T``.
"""

from __future__ import annotations

from torch import Tensor

from lit_prunedpo.losses.base import BranchSums, PreferenceLoss
from lit_prunedpo.losses.margin import SigmoidLoss


class LengthNormalized(PreferenceLoss):
    """``loss`` applied to the policy's and the reference's mean log-prob per response token.

    ``LengthNormalized(IPOLoss())`` is TRL's ``ipo`` (``dpo_trainer.py`` lines 1399-1404 of TRL 1.16.0: the
    summed scores divided by ``completion_mask.sum(dim=1).clamp(min=1.0)``).

    Args:
        loss: the loss of the means.
    """

    def __init__(self, loss: PreferenceLoss) -> None:
        if not isinstance(loss, PreferenceLoss):
            raise TypeError(f"LengthNormalized wraps a PreferenceLoss, got {type(loss).__name__}")
        self.loss = loss

    @property
    def needs_reference(self) -> bool:
        return self.loss.needs_reference

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        return self.loss.per_pair(sums.means(type(self).__name__), beta)

    def policy_partials(self, sums: BranchSums, beta: float) -> Tensor:
        means = sums.means(type(self).__name__)
        return self.loss.policy_partials(means, beta) / sums.full_lengths(type(self).__name__).clamp(min=1)


class SigmoidNormLoss(LengthNormalized):
    """TRL's ``sigmoid_norm`` (``dpo_trainer.py`` lines 1505-1509 of TRL 1.16.0): DPO's sigmoid loss on the
    length-averaged log-ratios, ``-log sigmoid(beta (R_w / T_w - R_l / T_l))``."""

    def __init__(self) -> None:
        super().__init__(SigmoidLoss())
