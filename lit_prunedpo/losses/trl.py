"""TRL's ``DPOConfig`` loss options, under TRL's names: ``--model.loss ipo``, or ``TRLLoss`` with its options.

A TRL user writes ``loss_type="robust", label_smoothing=0.1``; here the loss is a class (``model.loss``), which
is what lets a new loss be a small class. :func:`trl_loss` translates TRL 1.16.0's ``loss_type`` names and the
``DPOConfig`` fields that shape the loss (``loss_weights``, ``label_smoothing``, ``discopop_tau``) into those
classes, and :class:`TRLLoss` is that translation as a loss one can configure (a weighted sum, as TRL combines
its loss types). ``PrunedDPO(loss="ipo")`` and ``--model.loss ipo`` go through it.

``label_smoothing`` is used where TRL 1.16 uses it (``robust``, ``exo_pair``), and by ``sigmoid`` (a departure,
below). A ``label_smoothing`` that no loss type given uses (``hinge``, ``ipo``, ...: TRL ignores it there) is
refused; with several loss types, those that ignore it are named in a logged line.

Departures, said where they apply: TRL 1.16's ``sigmoid`` ignores ``label_smoothing``; here it gives conservative
DPO (cDPO, TRL's earlier meaning), with a logged line. TRL refuses ``exo_pair`` with ``label_smoothing`` 0; here it
takes the EXO paper's 1e-3, with a logged line. The ``DPOConfig`` loss fields that have no counterpart here
(``f_divergence_type`` other than ``reverse_kl``, ``ld_alpha``, ``use_weighting``) are refused with the reason,
never ignored.
"""

from __future__ import annotations

import difflib
from typing import Sequence

from lightning.pytorch.utilities import rank_zero_info

from lit_prunedpo.losses.base import PreferenceLoss
from lit_prunedpo.losses.branch import ApoDownLoss, ApoZeroLoss, BcoPairLoss, NcaPairLoss, SppoHardLoss
from lit_prunedpo.losses.combination import WeightedLoss
from lit_prunedpo.losses.margin import DiscoPopLoss, ExoPairLoss, HingeLoss, IPOLoss, RobustLoss, SigmoidLoss
from lit_prunedpo.losses.nll import SftLoss
from lit_prunedpo.losses.normalized import LengthNormalized, SigmoidNormLoss
from lit_prunedpo.losses.refused import AotLoss, AotUnpairedLoss

__all__ = ["TRL_LOSS_TYPES", "TRLLoss", "trl_loss"]

#: TRL 1.16.0's ``DPOConfig.loss_type`` values, in its order.
TRL_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                  "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
#: The loss types that use ``label_smoothing`` here: TRL 1.16's ``robust`` and ``exo_pair`` (its ``aot`` and
#: ``aot_unpaired`` too, refused here), and ``sigmoid`` as cDPO.
SMOOTHED = ("sigmoid", "robust", "exo_pair")

# Why the DPOConfig loss fields without a counterpart are refused (docs/losses.md).
_NOT_HERE = {
    "f_divergence_type": "f-DPO's divergences are per-branch transforms of the log-ratio sums, not shipped yet "
                         "(they fit the loss seam: a PreferenceLoss subclass)",
    "ld_alpha": "LD-DPO's length-desensitised weighting is not shipped yet (its weights are known from the lengths "
                "before pruning, so it fits the seam)",
    "use_weighting": "WPO's weights need a full-vocabulary statistic at every position, which position pruning "
                     "does not compute",
}


def _one(name: str, label_smoothing: float, discopop_tau: float) -> PreferenceLoss:
    """The loss class of one TRL ``loss_type`` name."""
    if name not in TRL_LOSS_TYPES:
        close = difflib.get_close_matches(name, TRL_LOSS_TYPES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"model.loss {name!r}: not one of TRL's loss types ({', '.join(TRL_LOSS_TYPES)}){hint} "
                         "Or give a loss class by class_path (lit_prunedpo.losses, docs/losses.md)")
    if name == "sigmoid":
        if label_smoothing:
            rank_zero_info(f"loss sigmoid with label_smoothing {label_smoothing}: conservative DPO (cDPO); TRL 1.16's "
                           "sigmoid ignores label_smoothing (its robust and exo_pair use it)")
        return SigmoidLoss(label_smoothing)
    if name == "robust":
        return RobustLoss(label_smoothing)
    if name == "exo_pair":
        if not label_smoothing:  # TRL refuses 0 for EXO; 1e-3 is the paper's value
            rank_zero_info("loss exo_pair with label_smoothing 0: epsilon 1e-3, the EXO paper's value (TRL 1.16 "
                           "refuses 0 for exo_pair); set label_smoothing to choose another")
        return ExoPairLoss(label_smoothing or 1e-3)
    if name == "discopop":
        return DiscoPopLoss(discopop_tau)
    if name == "ipo":
        return LengthNormalized(IPOLoss())  # TRL averages IPO's log-ratios per completion token
    plain = {"hinge": HingeLoss, "nca_pair": NcaPairLoss, "bco_pair": BcoPairLoss, "sppo_hard": SppoHardLoss,
             "aot": AotLoss, "aot_unpaired": AotUnpairedLoss, "apo_zero": ApoZeroLoss, "apo_down": ApoDownLoss,
             "sft": SftLoss, "sigmoid_norm": SigmoidNormLoss}
    return plain[name]()


def _parts(loss_type: str | Sequence[str], loss_weights: Sequence[float] | None) -> tuple[list[str], list[float]]:
    names = [loss_type] if isinstance(loss_type, str) else list(loss_type)
    if not names:
        raise ValueError("model.loss: loss_type is empty; give one of TRL's loss types, e.g. 'sigmoid'")
    weights = [1.0] * len(names) if loss_weights is None else [float(w) for w in loss_weights]
    if len(weights) != len(names):
        raise ValueError(f"model.loss: {len(weights)} loss_weights for {len(names)} loss types {names}: give one "
                         "weight per loss type, as TRL's DPOConfig requires")
    return names, weights


def _check_smoothing_used(names: Sequence[str], label_smoothing: float) -> None:
    """Refuse a ``label_smoothing`` that none of ``names`` uses (TRL ignores it there); with some that use it, log
    the ones that do not."""
    if not label_smoothing:
        return
    ignoring = [name for name in names if name not in SMOOTHED]
    if len(ignoring) == len(names):
        raise ValueError(f"model.loss {', '.join(names)} with label_smoothing {label_smoothing}: "
                         f"{'this loss type does' if len(names) == 1 else 'none of these loss types does'} not use "
                         f"label_smoothing (TRL 1.16 ignores it there); only {', '.join(SMOOTHED)} use it (sigmoid as "
                         "cDPO). Leave label_smoothing at 0, or choose one of those")
    if ignoring:
        used = ", ".join(n for n in names if n in SMOOTHED)
        rank_zero_info(f"loss {', '.join(names)} with label_smoothing {label_smoothing}: used by {used}, ignored by "
                       f"{', '.join(ignoring)} (as in TRL 1.16)")


def trl_loss(loss_type: str | Sequence[str] = "sigmoid", loss_weights: Sequence[float] | None = None,
             label_smoothing: float = 0.0, discopop_tau: float = 0.05) -> PreferenceLoss:
    """The loss TRL's ``DPOConfig(loss_type=..., loss_weights=..., label_smoothing=..., discopop_tau=...)`` trains
    with: one loss class, or a :class:`~lit_prunedpo.losses.WeightedLoss` of several (TRL's MPO, RPO).

    Raises:
        ValueError: a name that is not one of :data:`TRL_LOSS_TYPES` (the closest one named), weights that do
            not match the names, or a ``label_smoothing`` none of the loss types uses.
        NotImplementedError: ``aot``, ``aot_unpaired`` (see ``lit_prunedpo.losses.refused``).
    """
    names, weights = _parts(loss_type, loss_weights)
    losses = [_one(name, label_smoothing, discopop_tau) for name in names]
    _check_smoothing_used(names, label_smoothing)
    return losses[0] if len(losses) == 1 and weights[0] == 1.0 else WeightedLoss(losses, weights)


class TRLLoss(WeightedLoss):
    """The loss of TRL's ``DPOConfig`` loss fields, configured under their names::

        model:
          loss:
            class_path: lit_prunedpo.losses.TRLLoss
            init_args: {loss_type: robust, label_smoothing: 0.1}

    Args:
        loss_type: one of :data:`TRL_LOSS_TYPES`, or a list of them (summed with ``loss_weights``).
        loss_weights: one weight per loss type (default 1.0 each).
        label_smoothing: ``robust``'s label-flip rate, ``exo_pair``'s epsilon (1e-3 when 0), cDPO's for ``sigmoid``;
            refused when no loss type given uses it.
        discopop_tau: ``discopop``'s temperature.
        f_divergence_type, ld_alpha, use_weighting: TRL's; only their defaults are accepted (module docstring).

    Raises:
        ValueError: as :func:`trl_loss`.
        NotImplementedError: a non-default ``f_divergence_type``, ``ld_alpha`` or ``use_weighting``, naming why.
    """

    def __init__(self, loss_type: str | list[str] = "sigmoid", loss_weights: list[float] | None = None,
                 label_smoothing: float = 0.0, discopop_tau: float = 0.05, f_divergence_type: str = "reverse_kl",
                 ld_alpha: float | None = None, use_weighting: bool = False) -> None:
        given = {"f_divergence_type": f_divergence_type != "reverse_kl", "ld_alpha": ld_alpha is not None,
                 "use_weighting": bool(use_weighting)}
        for field, set_ in given.items():
            if set_:
                raise NotImplementedError(f"model.loss {field}: {_NOT_HERE[field]}; leave it at TRL's default")
        names, weights = _parts(loss_type, loss_weights)
        losses = [_one(name, label_smoothing, discopop_tau) for name in names]
        _check_smoothing_used(names, label_smoothing)
        super().__init__(losses, weights)
        self.loss_type = names
