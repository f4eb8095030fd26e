"""Margin losses ``f(Delta)`` of the implicit-reward margin ``Delta = R_w - R_l`` (TRL's ``sigmoid``, ``hinge``,
``ipo``, ``robust``, ``exo_pair``, ``discopop``).

The pruned step needs only the value (for logging) and the derivative ``f'(Delta)`` (the detached
coefficient of the single-branch surrogate). A new loss is a small subclass implementing ``value``; the
derivative defaults to autograd and the built-ins give it in closed form where it is short.

TRL line numbers refer to ``trl/trainer/dpo_trainer.py`` of TRL 1.16.0, ``_compute_loss``.

Departure from TRL: ``IPOLoss`` here is applied to summed log-ratios; TRL's ``ipo`` divides them by the
response lengths first, which is ``LengthNormalized(IPOLoss())`` (``lit_prunedpo.losses.normalized``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_prunedpo.losses.base import MarginLoss


def _check_smoothing(label_smoothing: float, upper: float) -> float:
    if not 0.0 <= label_smoothing < upper:
        raise ValueError(f"label_smoothing must be in [0, {upper}), got {label_smoothing!r}")
    return float(label_smoothing)


class SigmoidLoss(MarginLoss):
    """DPO, TRL's ``sigmoid`` (line 1388): ``-log sigmoid(beta Delta)``; with ``label_smoothing = eps`` the
    conservative cDPO mix ``-(1 - eps) log sigmoid(beta Delta) - eps log sigmoid(-beta Delta)``.

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
    """Robust DPO (Chowdhury et al., 2024), TRL's ``robust`` (lines 1429-1431): an unbiased loss under label
    noise of rate ``label_smoothing``, ``(-(1 - eps) log sigmoid(beta Delta) + eps log sigmoid(-beta Delta)) / (1 - 2
    eps)``.

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
    """IPO (Azar et al., 2023): ``(Delta - 1 / (2 beta))^2``, on summed log-ratios. TRL's ``ipo``
    (lines 1399-1404) is the same formula on length-averaged ones: ``LengthNormalized(IPOLoss())``."""

    def value(self, margin: Tensor, beta: float) -> Tensor:
        return (margin - 1.0 / (2.0 * beta)) ** 2

    def derivative(self, margin: Tensor, beta: float) -> Tensor:
        return 2.0 * (margin.detach() - 1.0 / (2.0 * beta))


class HingeLoss(MarginLoss):
    """SLiC hinge, TRL's ``hinge`` (line 1391): ``max(0, 1 - beta Delta)``."""

    def value(self, margin: Tensor, beta: float) -> Tensor:
        return torch.relu(1.0 - beta * margin)

    def derivative(self, margin: Tensor, beta: float) -> Tensor:
        return -beta * (beta * margin.detach() < 1.0).to(margin.dtype)


class ExoPairLoss(MarginLoss):
    """EXO (Ji et al., 2024, eq. 16), TRL's ``exo_pair`` (lines 1409-1417): the reverse KL between the
    policy's two-way preference ``q = (sigmoid(beta Delta), sigmoid(-beta Delta))`` and the smoothed label
    ``p = (1 - eps, eps)``: ``sum_k q_k (log q_k - log p_k)``.

    Args:
        label_smoothing: ``eps`` in (0, 0.5); must be positive (``log eps``); the paper recommends 1e-3.
    """

    def __init__(self, label_smoothing: float = 1e-3) -> None:
        self.label_smoothing = _check_smoothing(label_smoothing, 0.5)
        if self.label_smoothing == 0.0:
            raise ValueError("ExoPairLoss needs label_smoothing > 0 (its loss has log(label_smoothing)); try 1e-3")

    def value(self, margin: Tensor, beta: float) -> Tensor:
        eps = self.label_smoothing
        logits = beta * margin
        return torch.sigmoid(logits) * (F.logsigmoid(logits) - math.log1p(-eps)) + torch.sigmoid(-logits) * (
            F.logsigmoid(-logits) - math.log(eps)
        )


class DiscoPopLoss(MarginLoss):
    """DiscoPOP (Chris Lu et al., 2024, eq. 5), TRL's ``discopop`` (lines 1485-1493): a log-ratio-modulated
    blend of the logistic and exponential losses, ``(1 - m) * -log sigmoid(z) + m * exp(-z)`` with
    ``z = beta Delta`` and ``m = sigmoid(z / tau)``.

    Args:
        tau: the modulation temperature (TRL's ``discopop_tau``), > 0.
    """

    def __init__(self, tau: float = 0.05) -> None:
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau!r}")
        self.tau = float(tau)

    def value(self, margin: Tensor, beta: float) -> Tensor:
        logits = beta * margin
        modulation = torch.sigmoid(logits / self.tau)
        return -F.logsigmoid(logits) * (1 - modulation) + torch.exp(-logits) * modulation
