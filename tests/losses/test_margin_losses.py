"""Margin losses: values match the published formulas (TRL's conventions) and closed-form derivatives match autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lit_prunedpo.losses import HingeLoss, IPOLoss, MarginLoss, RobustLoss, SigmoidLoss

MARGINS = torch.tensor([-30.0, -2.5, -0.1, 0.0, 0.3, 4.0, 25.0], dtype=torch.float64)
BETA = 0.2


@pytest.mark.parametrize(
    "loss, formula",
    [
        (SigmoidLoss(), lambda m: -F.logsigmoid(BETA * m)),
        (SigmoidLoss(0.1), lambda m: -0.9 * F.logsigmoid(BETA * m) - 0.1 * F.logsigmoid(-BETA * m)),
        (RobustLoss(0.1), lambda m: (-0.9 * F.logsigmoid(BETA * m) + 0.1 * F.logsigmoid(-BETA * m)) / 0.8),
        (IPOLoss(), lambda m: (m - 1 / (2 * BETA)) ** 2),
        (HingeLoss(), lambda m: torch.relu(1 - BETA * m)),
    ],
    ids=["sigmoid", "cdpo", "robust", "ipo", "hinge"],
)
def test_value_and_derivative(loss, formula):
    torch.testing.assert_close(loss.value(MARGINS, BETA), formula(MARGINS))
    autograd = MarginLoss.derivative(loss, MARGINS, BETA)  # the base class's autograd derivative
    torch.testing.assert_close(loss.derivative(MARGINS, BETA), autograd)


def test_a_user_loss_needs_only_its_value():
    class Squared(MarginLoss):
        def value(self, margin, beta):
            return (beta * margin - 1) ** 2

    torch.testing.assert_close(Squared().derivative(MARGINS, BETA), 2 * BETA * (BETA * MARGINS - 1))


@pytest.mark.parametrize("make", [lambda: SigmoidLoss(-0.1), lambda: SigmoidLoss(0.5), lambda: RobustLoss(0.6)])
def test_label_smoothing_out_of_range(make):
    with pytest.raises(ValueError, match="label_smoothing"):
        make()
