"""The loss seam: a per-pair loss of the per-branch log-prob sums, and its partial derivatives.

The estimator (``lit_prunedpo.step.estimate``) hands a loss the IPW estimates of four sums per pair, the policy's and
the reference's log-probs of each branch, plus the full response lengths (known before any pruning). The loss
returns its per-pair value (for logging) and its detached partial derivatives w.r.t. the two policy sums,
``c_w`` and ``c_l``; the step back-propagates ``sum_b c_b * P_hat_b * mask_b / q_b``. Any objective whose gradient
is a coefficient times the gradient of such sums fits: margin losses ``f(R_w - R_l)`` (:class:`MarginLoss`, the
special case), per-branch losses (NCA, BCO, APO), length-normalised ones (a sum over the full length is a
mean), reference-free ones and a token-level NLL term.

A new loss is a small subclass implementing :meth:`PreferenceLoss.per_pair`; the partials default to autograd.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import torch
from torch import Tensor


@dataclass(frozen=True)
class BranchSums:
    """What a loss sees for ``B`` pairs; column 0 is the chosen branch, column 1 the rejected one.

    Attributes:
        policy: ``[B, 2]`` (IPW estimates of) sums of the policy's response log-probs.
        reference: ``[B, 2]`` the same for the reference (zeros for ``NoReference``).
        lengths: ``[B, 2]`` full response lengths, or ``None`` where the caller has none (then only losses
            that do not normalise by length can run).
    """

    policy: Tensor
    reference: Tensor
    lengths: Tensor | None = None

    @property
    def log_ratio(self) -> Tensor:
        """``[B, 2]`` ``R_b = policy_b - reference_b``."""
        return self.policy - self.reference

    @property
    def margin(self) -> Tensor:
        """``[B]`` ``Delta = R_w - R_l``."""
        ratio = self.log_ratio
        return ratio[:, 0] - ratio[:, 1]

    def full_lengths(self, who: str) -> Tensor:
        """The lengths, as the sums' dtype; ``who`` names the loss in the error when there are none."""
        if self.lengths is None:
            raise ValueError(f"{who} needs the full response lengths, but estimate() was called without lengths")
        return self.lengths.to(device=self.policy.device, dtype=self.policy.dtype)

    def means(self, who: str = "a length-normalised loss") -> "BranchSums":
        """Per-token means over the *full* response: the sums divided by the lengths known before pruning, so
        an unbiased sum estimate gives an unbiased mean estimate."""
        lengths = self.full_lengths(who).clamp(min=1)
        return replace(self, policy=self.policy / lengths, reference=self.reference / lengths)


class PreferenceLoss(ABC):
    """A per-pair loss of the branch sums. Subclasses implement :meth:`per_pair`."""

    @property
    def margin_only(self) -> bool:
        """True when the loss depends on the sums only through the margin ``R_w - R_l``. Then log-probs of tokens
        shared by both responses (a common response prefix after the same prompt) cancel and need not be
        scored; for every other loss they must be."""
        return False

    @property
    def needs_reference(self) -> bool:
        """False for reference-free losses: the module then runs no reference model at all."""
        return True

    @abstractmethod
    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        """``[B]`` loss of each pair."""

    def reported(self, sums: BranchSums) -> BranchSums:
        """What ``rewards/*`` (``beta`` times the log-ratios of the result) and ``logps/*`` (its policy column)
        report, as TRL's trainer for this loss logs them: the sums themselves (``DPOTrainer``) unless overridden."""
        return sums

    def policy_partials(self, sums: BranchSums, beta: float) -> Tensor:
        """``[B, 2]`` detached ``d loss_i / d policy_ib``; autograd of :meth:`per_pair` unless overridden."""
        with torch.enable_grad():
            policy = sums.policy.detach().requires_grad_(True)
            value = self.per_pair(replace(sums, policy=policy, reference=sums.reference.detach()), beta).sum()
            (grad,) = torch.autograd.grad(value, policy, allow_unused=True)
        return torch.zeros_like(policy) if grad is None else grad.detach()


class MarginLoss(PreferenceLoss):
    """A per-pair loss ``f(Delta; beta)`` of the margin ``Delta = R_w - R_l`` alone; its partials are
    ``(f'(Delta), -f'(Delta))``. Subclasses implement :meth:`value` (and may give :meth:`derivative` in closed
    form)."""

    @property
    def margin_only(self) -> bool:
        return True

    @abstractmethod
    def value(self, margin: Tensor, beta: float) -> Tensor:
        """Per-pair loss for margins ``[B]``."""

    def derivative(self, margin: Tensor, beta: float) -> Tensor:
        """``f'(Delta)`` per pair, detached; autograd of :meth:`value` unless overridden."""
        with torch.enable_grad():
            m = margin.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.value(m, beta).sum(), m)
        return grad.detach()

    def per_pair(self, sums: BranchSums, beta: float) -> Tensor:
        return self.value(sums.margin, beta)

    def policy_partials(self, sums: BranchSums, beta: float) -> Tensor:
        slope = self.derivative(sums.margin.detach(), beta)
        return torch.stack([slope, -slope], dim=-1)
