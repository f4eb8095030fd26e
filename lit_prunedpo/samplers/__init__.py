"""Sampler plug-ins. Select one of each with ``class_path`` in a config, or write your own subclass."""

from lit_prunedpo.samplers.base import BranchSampler, PositionSampler, PrefixSampler
from lit_prunedpo.samplers.branch import AntitheticBranch, BothBranches, RandomBranch
from lit_prunedpo.samplers.divergence import DivergentBranch, PerPairBranch, differing_share
from lit_prunedpo.samplers.position import (
    AllPositions,
    BernoulliPositions,
    CoupledBernoulliPositions,
    CoupledStratifiedPositions,
    FixedCountPositions,
    StratifiedPositions,
)
from lit_prunedpo.samplers.prefix import FullPrefix, SharedFractionPrefix

__all__ = [
    "AllPositions",
    "AntitheticBranch",
    "BernoulliPositions",
    "BothBranches",
    "BranchSampler",
    "CoupledBernoulliPositions",
    "CoupledStratifiedPositions",
    "DivergentBranch",
    "FixedCountPositions",
    "FullPrefix",
    "PerPairBranch",
    "PositionSampler",
    "PrefixSampler",
    "RandomBranch",
    "SharedFractionPrefix",
    "StratifiedPositions",
    "differing_share",
]
