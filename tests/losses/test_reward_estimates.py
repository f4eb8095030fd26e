"""The rewards the new losses estimate stay unbiased under position and prefix pruning: per-token means over
the full response (length-normalised losses) and the token-averaged NLL (``SftLoss``), exactly by enumeration
and by Monte Carlo through ``lit_prunedpo.testing.check_reward_estimate``."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo.losses import SftLoss
from lit_prunedpo.samplers import (
    AllPositions, BernoulliPositions, FullPrefix, SharedFractionPrefix, StratifiedPositions,
)
from lit_prunedpo.testing import check_reward_estimate

MEANS = lambda s: s.means().policy  # noqa: E731
NLL = lambda s: SftLoss().per_pair(s, 1.0)  # noqa: E731
DESIGNS = [
    (SharedFractionPrefix(0.3), AllPositions()),
    (FullPrefix(), BernoulliPositions(0.3)),
    (SharedFractionPrefix(0.5), StratifiedPositions(0.25)),
]


@pytest.mark.parametrize("reward", [MEANS, NLL], ids=["length-normalised", "nll"])
@pytest.mark.parametrize("prefix, position", DESIGNS, ids=lambda x: type(x).__name__)
def test_reward_unbiased_exactly_and_by_monte_carlo(reward, prefix, position):
    lengths = torch.tensor([[5, 3], [1, 6], [4, 4]])
    report = check_reward_estimate(reward, prefix, position, lengths=lengths, num_draws=600)
    assert report.exact_checks == 1 and report.monte_carlo_checks == 1, report.notes


class LiesAboutInclusion(BernoulliPositions):
    """Draws at rate 0.3 but reports 0.5: its weights are too small, so every estimate is biased low."""

    def __init__(self):
        super().__init__(rate=0.3)

    def inclusion(self, kept, width):
        return BernoulliPositions(0.5).inclusion(kept, width)


def test_a_biased_design_is_caught():
    with pytest.raises(AssertionError, match="by enumeration"):
        check_reward_estimate(MEANS, FullPrefix(), LiesAboutInclusion(), num_draws=10)
    with pytest.raises(AssertionError, match="standard errors"):  # the Monte Carlo check alone catches it too
        check_reward_estimate(MEANS, FullPrefix(), LiesAboutInclusion(), num_draws=800, max_support=1)


def test_mean_over_kept_length_would_be_refused_as_not_affine():
    """Dividing by something that depends on the sums (here their own size) is not a full-length mean."""
    with pytest.raises(AssertionError, match="not affine"):
        check_reward_estimate(lambda s: s.policy / (1 + s.policy.abs()), num_draws=10)
