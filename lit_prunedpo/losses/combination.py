"""A weighted sum of losses: TRL's ``loss_type=[...]`` with ``loss_weights=[...]`` (MPO; RPO as DPO + NLL)."""

from __future__ import annotations

from typing import Sequence

from torch import Tensor

from lit_prunedpo.losses.base import BranchSums, PreferenceLoss
from lit_prunedpo.losses.nll import SftLoss


class WeightedLoss(PreferenceLoss):
    """``sum_k weights[k] * losses[k]``, per pair, and likewise for the partials (the gradient is linear).

    Source: TRL 1.16.0 ``trl/trainer/dpo_trainer.py`` lines 1386 and 1528 (``loss += per_sequence_loss.mean()
    * loss_weight`` over ``zip(loss_types, loss_weights)``).

    Args:
        losses: the parts, at least one.
        weights: one per loss; ``None`` weighs each 1 (TRL's default).

    Raises:
        ValueError: on no losses, or a number of weights that differs from the number of losses.
    """

    def __init__(self, losses: Sequence[PreferenceLoss], weights: Sequence[float] | None = None) -> None:
        if not losses:
            raise ValueError("WeightedLoss needs at least one loss")
        weights = [1.0] * len(losses) if weights is None else [float(w) for w in weights]
        if len(weights) != len(losses):
            raise ValueError(f"WeightedLoss got {len(losses)} losses but {len(weights)} weights")
        self.losses = list(losses)
        self.weights = weights

    @property
    def margin_only(self) -> bool:
        return all(loss.margin_only for loss in self.losses)

    @property
    def needs_reference(self) -> bool:
        return any(loss.needs_reference for loss in self.losses)

    def reported(self, sums: BranchSums) -> BranchSums:
        """As its first part that is not an NLL term reports (ORPO, ``[SftLoss, OddsRatioLoss]``: per-token means,
        as TRL's ``ORPOTrainer``; RPO, DPO + NLL: the sums)."""
        preference = [loss for loss in self.losses if not isinstance(loss, SftLoss)] or self.losses
        return preference[0].reported(sums)

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        return sum(w * loss.per_pair(sums, beta) for loss, w in zip(self.losses, self.weights, strict=True))

    def policy_partials(self, sums: BranchSums, beta: float) -> Tensor:
        return sum(w * loss.policy_partials(sums, beta) for loss, w in zip(self.losses, self.weights, strict=True))
