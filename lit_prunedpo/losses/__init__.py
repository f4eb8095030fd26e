"""The DPO loss family behind one seam (``base.PreferenceLoss``): margin losses, per-branch losses,
length-normalised and reference-free losses, an NLL term and weighted combinations. See docs/losses.md."""

from lit_prunedpo.losses.base import BranchSums, MarginLoss, PreferenceLoss
from lit_prunedpo.losses.branch import ApoDownLoss, ApoZeroLoss, BcoPairLoss, NcaPairLoss, SppoHardLoss
from lit_prunedpo.losses.combination import WeightedLoss
from lit_prunedpo.losses.margin import DiscoPopLoss, ExoPairLoss, HingeLoss, IPOLoss, RobustLoss, SigmoidLoss
from lit_prunedpo.losses.nll import SftLoss
from lit_prunedpo.losses.normalized import LengthNormalized, SigmoidNormLoss
from lit_prunedpo.losses.reference_free import OddsRatioLoss, SimPOLoss
from lit_prunedpo.losses.refused import AotLoss, AotUnpairedLoss
from lit_prunedpo.losses.trl import TRL_LOSS_TYPES, TRLLoss, trl_loss

__all__ = [
    "AotLoss", "AotUnpairedLoss", "ApoDownLoss", "ApoZeroLoss", "BcoPairLoss", "BranchSums", "DiscoPopLoss",
    "ExoPairLoss", "HingeLoss", "IPOLoss", "LengthNormalized", "MarginLoss", "NcaPairLoss", "OddsRatioLoss",
    "PreferenceLoss", "RobustLoss", "SftLoss", "SigmoidLoss", "SigmoidNormLoss", "SimPOLoss", "SppoHardLoss",
    "TRL_LOSS_TYPES", "TRLLoss", "WeightedLoss", "trl_loss",
]
