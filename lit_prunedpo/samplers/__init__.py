"""Sampler plug-ins. Select one of each with ``class_path`` in a config, or write your own subclass."""

from lit_prunedpo.samplers.base import BranchSampler, PositionSampler, PrefixSampler
from lit_prunedpo.samplers.branch import AntitheticBranch, BothBranches, RandomBranch
from lit_prunedpo.samplers.control_variates import ExactTargetLogits, LogSoftmaxSplit, ReferenceLogSumExp
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
    "ExactTargetLogits",
    "FixedCountPositions",
    "FullPrefix",
    "LogSoftmaxSplit",
    "PerPairBranch",
    "PositionSampler",
    "PrefixSampler",
    "RandomBranch",
    "ReferenceLogSumExp",
    "SharedFractionPrefix",
    "StratifiedPositions",
    "differing_share",
]
