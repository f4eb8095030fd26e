"""Margin losses ``f(Delta)`` of the implicit-reward margin ``Delta = R_w - R_l``.

The pruned step needs only the value (for logging) and the derivative ``f'(Delta)`` (the detached
coefficient of the single-branch surrogate). A new loss is a small subclass implementing ``value``; the
derivative defaults to autograd and the built-ins give it in closed form.

Departure from TRL: ``IPO`` here is applied to summed (not length-averaged) log-ratios, like every other loss
in this project, because position pruning estimates sums.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor


class MarginLoss(ABC):
    """A per-pair loss ``f(Delta; beta)``."""

    @abstractmethod
    def value(self, margin: Tensor, beta: float) -> Tensor:
        """Per-pair loss for margins ``[B]``."""

    def derivative(self, margin: Tensor, beta: float) -> Tensor:
        """``f'(Delta)`` per pair, detached; autograd of :meth:`value` unless overridden."""
        with torch.enable_grad():
            m = margin.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.value(m, beta).sum(), m)
        return grad.detach()


def _check_smoothing(label_smoothing: float, upper: float) -> float:
    if not 0.0 <= label_smoothing < upper:
        raise ValueError(f"label_smoothing must be in [0, {upper}), got {label_smoothing!r}")
    return float(label_smoothing)


class SigmoidLoss(MarginLoss):
    """DPO: ``-log sigmoid(beta Delta)``; with ``label_smoothing = eps`` the conservative cDPO mix
    ``-(1 - eps) log sigmoid(beta Delta) - eps log sigmoid(-beta Delta)``.

    Args:
        label_smoothing: probability that a preference label is flipped, in [0, 0.5).
    """

    def __init__(self, label_smoothing: float = 0.0) -> None:
        self.label_smoothing = _check_smoothing(label_smoothing, 0.5)

    def value(self, margin: Tensor, beta: float) -> Tensor:
        eps = self.label_smoothing
        return -(1 - eps) * F.logsigmoid(beta * margin) - eps * F.logsigmoid(-beta * margin)

    def derivative(self, margin: Tensor, beta: float) -> Tensor:
        eps = self.label_smoothing
        m = margin.detach()
        return -(1 - eps) * beta * torch.sigmoid(-beta * m) + eps * beta * torch.sigmoid(beta * m)


class RobustLoss(MarginLoss):
    """Robust DPO (Chowdhury et al., 2024): an unbiased loss under label noise of rate ``label_smoothing``,
    ``(-(1 - eps) log sigmoid(beta Delta) + eps log sigmoid(-beta Delta)) / (1 - 2 eps)``.

    Args:
        label_smoothing: label-flip rate, in [0, 0.5).
    """

    def __init__(self, label_smoothing: float = 0.1) -> None:
        self.label_smoothing = _check_smoothing(label_smoothing, 0.5)

    def value(self, margin: Tensor, beta: float) -> Tensor:
        eps = self.label_smoothing
        return (-(1 - eps) * F.logsigmoid(beta * margin) + eps * F.logsigmoid(-beta * margin)) / (1 - 2 * eps)

    def derivative(self, margin: Tensor, beta: float) -> Tensor:
        eps = self.label_smoothing
        m = margin.detach()
        return beta * (-(1 - eps) * torch.sigmoid(-beta * m) - eps * torch.sigmoid(beta * m)) / (1 - 2 * eps)


class IPOLoss(MarginLoss):
    """IPO (Azar et al., 2023): ``(Delta - 1 / (2 beta))^2``, on summed log-ratios."""

    def value(self, margin: Tensor, beta: float) -> Tensor:
        return (margin - 1.0 / (2.0 * beta)) ** 2

    def derivative(self, margin: Tensor, beta: float) -> Tensor:
        return 2.0 * (margin.detach() - 1.0 / (2.0 * beta))


class HingeLoss(MarginLoss):
    """SLiC hinge: ``max(0, 1 - beta Delta)``."""

    def value(self, margin: Tensor, beta: float) -> Tensor:
        return torch.relu(1.0 - beta * margin)

    def derivative(self, margin: Tensor, beta: float) -> Tensor:
        return -beta * (beta * margin.detach() < 1.0).to(margin.dtype)
