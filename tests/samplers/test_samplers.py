"""Every shipped sampler: arguments checked, and unbiased exactly (enumeration) and by Monte Carlo."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo.samplers import (
    AllPositions,
    AntitheticBranch,
    BernoulliPositions,
    BothBranches,
    FixedCountPositions,
    FullPrefix,
    RandomBranch,
    SharedFractionPrefix,
    StratifiedPositions,
)
from lit_prunedpo.testing import check_branch_sampler, check_position_sampler, check_prefix_sampler, check_unbiased

POSITION = [AllPositions(), BernoulliPositions(0.3, 2.0), BernoulliPositions(1.0), FixedCountPositions(3),
            StratifiedPositions(0.3), StratifiedPositions(1.0)]
PREFIX = [FullPrefix(), SharedFractionPrefix(0.5), SharedFractionPrefix(0.1), SharedFractionPrefix(1.0)]
BRANCH = [BothBranches(), RandomBranch(0.3), RandomBranch(0.5), AntitheticBranch()]


@pytest.mark.parametrize("sampler", POSITION, ids=lambda s: repr(vars(s)) + type(s).__name__)
def test_position_samplers_unbiased(sampler):
    report = check_position_sampler(sampler, lengths=(1, 2, 3, 5, 8, 11), num_draws=8000)
    assert report.exact_checks == 18  # the support of every length was enumerated


@pytest.mark.parametrize("sampler", PREFIX, ids=lambda s: repr(vars(s)) + type(s).__name__)
def test_prefix_samplers_unbiased(sampler):
    report = check_prefix_sampler(sampler, num_draws=4000)
    assert report.exact_checks == 2 and report.monte_carlo_checks == 2


@pytest.mark.parametrize("sampler", BRANCH, ids=lambda s: repr(vars(s)) + type(s).__name__)
def test_branch_samplers_unbiased(sampler):
    report = check_branch_sampler(sampler, num_draws=4000)
    assert report.exact_checks == 15


def test_all_three_together_through_the_real_planner():
    check_unbiased(SharedFractionPrefix(0.3), StratifiedPositions(0.4), AntitheticBranch(), num_draws=1500)
    check_unbiased(SharedFractionPrefix(0.6), BernoulliPositions(0.2, 1.0), RandomBranch(0.7), num_draws=1500)


def test_the_checker_catches_a_biased_sampler():
    class WrongProbability(BernoulliPositions):
        def inclusion(self, kept, width):
            return super().inclusion(kept, width) * 0.9

    with pytest.raises(AssertionError, match="inclusion probabilities"):
        check_position_sampler(WrongProbability(0.5))

    class WrongSurvival(SharedFractionPrefix):  # claims the continuous-u survival but always keeps half
        def draw(self, lengths, generator):
            return torch.div(lengths + 1, 2, rounding_mode="floor").clamp(min=1)

    with pytest.raises(AssertionError, match="survival frequency"):
        check_prefix_sampler(WrongSurvival(0.5), num_draws=2000)

    class LopsidedAntithetic(AntitheticBranch):  # the odd pair always takes the chosen branch
        def draw(self, num_pairs, generator):
            mask = super().draw(num_pairs, generator)
            if num_pairs % 2:
                mask[-1] = torch.tensor([True, False])
            return mask

    with pytest.raises(AssertionError):
        check_branch_sampler(LopsidedAntithetic(), num_pairs=(3,), num_draws=4000)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: BernoulliPositions(rate=0.0), "rate"),
        (lambda: BernoulliPositions(rate=1.5), "rate"),
        (lambda: BernoulliPositions(rate=0.5, min_expected=-1), "min_expected"),
        (lambda: FixedCountPositions(k=0), "k"),
        (lambda: StratifiedPositions(rate=-0.1), "rate"),
        (lambda: SharedFractionPrefix(min_fraction=0.0), "min_fraction"),
        (lambda: SharedFractionPrefix(min_fraction=1.2), "min_fraction"),
        (lambda: RandomBranch(chosen_probability=0.0), "chosen_probability"),
        (lambda: RandomBranch(chosen_probability=1.0), "chosen_probability"),
    ],
)
def test_out_of_range_arguments_name_the_argument(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_shared_fraction_shortens_the_longest_kept_response():
    lengths = torch.tensor([40, 10, 25, 3])
    g = torch.Generator().manual_seed(0)
    sampler = SharedFractionPrefix(0.5)
    maxima = [int(sampler.draw(lengths, g).max()) for _ in range(200)]
    # one shared u: the longest kept response is ceil(u * 40) with u in [0.5, 1]
    assert min(maxima) >= 20 and max(maxima) <= 40
    assert sum(maxima) / len(maxima) < 0.8 * 40


def test_stratified_positions_hit_every_stratum_once():
    sampler = StratifiedPositions(rate=0.25)
    kept = torch.tensor([12, 7, 1])
    masks = sampler.draw(kept, 12, torch.Generator().manual_seed(1))
    assert masks.sum(1).tolist() == [3, 2, 1]
