"""TRL loss types this project refuses rather than approximates, under TRL's names so that a search finds why.

``aot`` and ``aot_unpaired`` (TRL 1.16.0 ``trl/trainer/dpo_trainer.py`` lines 1447-1465) sort the batch's
log-ratios and pair the i-th smallest policy value with the i-th smallest reference value: each pair's loss
depends on every other pair's estimate, so it is not a per-pair loss of that pair's sums. Worse, under pruning
the sorted order statistics of unbiased estimates are biased (the largest of noisy values overshoots the
largest true value), so a pruned AOT step would optimise a different objective, not a noisier one.
"""

from __future__ import annotations

from torch import Tensor

from lit_prunedpo.losses.base import BranchSums, PreferenceLoss

_WHY = (
    "sorts log-ratios across the batch, so each pair's loss depends on all others, and sorting pruned (noisy) "
    "estimates biases the objective; lit_prunedpo refuses it rather than approximate it (see docs/losses.md)"
)


class _Refused(PreferenceLoss):
    trl_name = ""

    def __init__(self) -> None:
        raise NotImplementedError(f"TRL's loss_type={self.trl_name!r} {_WHY}")

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:  # never reached: __init__ refuses
        raise NotImplementedError(self.trl_name)


class AotLoss(_Refused):
    """TRL's ``aot`` (AOT, Melnyk et al., 2024): refused, see the module docstring."""

    trl_name = "aot"


class AotUnpairedLoss(_Refused):
    """TRL's ``aot_unpaired``: refused, see the module docstring."""

    trl_name = "aot_unpaired"
