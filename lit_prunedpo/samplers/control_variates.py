"""Position samplers that sample only the log-sum-exp of a token's log-prob: control variates from what is computed.

A token's log-prob is ``logp_t = z_t - lse_t``: the target logit ``z_t`` (one row of the LM head, ``2d`` FLOPs) and
the log-sum-exp over the vocabulary ``lse_t`` (the whole head, ``2dV`` FLOPs). The body computes the hidden state of
every executed position anyway, so ``z_t`` is nearly free there; only ``lse_t`` is worth sampling. The two wrappers
here keep any position sampler's draws and inclusion probabilities and change what the estimate weights:

* :class:`ExactTargetLogits`: ``z_t`` exact at every executed position, ``lse_t`` at the drawn ones::

      P_hat = sum_{t executed} z_t / s_t  -  sum_{t in S} lse_t / (s_t p_t)

  The online reference is estimated the same way (its ``z'_t`` are as cheap); a cached one is summed exactly over
  the executed positions (``sum_t logp'_t / s_t``: it holds every token).
* :class:`ReferenceLogSumExp`: the reference's ``lse'_t`` (from a cache that stores it) as the baseline::

      P_hat = sum_{t executed} (z_t - lse'_t) / s_t  -  sum_{t in S} (lse_t - lse'_t) / (s_t p_t)

  and the reference summed exactly from the cache. Its value noise shrinks as the policy stays near the reference.
  An online reference would run its whole head for ``lse'_t`` at every position: refused.

Both are unbiased for ``sum_t logp_t`` in value and gradient (the draws do not depend on the weights). A sampler
knows nothing about models: these only say, through :attr:`LogSoftmaxSplit.uses_reference_lse`, which estimate the
planner (:func:`lit_prunedpo.step.plan.plan_step`) lays out; the executor computes ``z`` at every executed position and
``lse`` at the drawn ones (:mod:`lit_prunedpo.token_terms`), the estimate combines them.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

from lit_prunedpo.samplers.base import PositionSampler
from lit_prunedpo.samplers.position import CoupledStratifiedPositions


class LogSoftmaxSplit(PositionSampler):
    """Wraps a position sampler: its draws choose where the log-sum-exp is computed; the target logit is computed at
    every executed position. Draws, inclusion probabilities and support are the wrapped sampler's.

    Args:
        positions: the position sampler whose draws and probabilities are used (any design: Bernoulli, stratified,
            coupled, ...); ``None`` is ``CoupledStratifiedPositions(rate=0.25)``, the best position design so far.
        fallback: where the policy's head cannot give a target logit as one row of a plain linear layer (a model
            whose own forward computes the logits, a head that transforms its weight, a head sharded by FSDP2),
            score with ``positions`` alone (whole log-probs at the drawn positions: unbiased, with that sampler's
            variance) and say so in a warning at set-up, instead of refusing the run. ``False`` (the default)
            refuses, naming the model and why.

    Raises:
        TypeError: ``positions`` is not a :class:`PositionSampler`, or this base class is instantiated itself.
        ValueError: ``positions`` splits the log-softmax itself (one split is all there is).
    """

    splits_log_softmax = True
    #: whether the policy's sampled log-sum-exps are centred on the reference's (:class:`ReferenceLogSumExp`)
    uses_reference_lse: bool = False

    def __init__(self, positions: PositionSampler | None = None, fallback: bool = False) -> None:
        if type(self) is LogSoftmaxSplit:
            raise TypeError("LogSoftmaxSplit is the base of ExactTargetLogits and ReferenceLogSumExp: use one of them")
        positions = positions if positions is not None else CoupledStratifiedPositions(rate=0.25)
        if not isinstance(positions, PositionSampler):
            raise TypeError(f"{type(self).__name__}: positions must be a PositionSampler, got "
                            f"{type(positions).__name__}")
        if isinstance(positions, LogSoftmaxSplit):
            raise ValueError(f"{type(self).__name__}: positions is already {type(positions).__name__}; wrap the plain "
                             "position sampler (e.g. CoupledStratifiedPositions) in one of them")
        if not isinstance(fallback, bool):
            raise TypeError(f"{type(self).__name__}: fallback must be true or false, got {fallback!r}")
        self.positions = positions
        self.fallback = fallback

    def inclusion(self, kept: Tensor, width: int) -> Tensor:
        return self.positions.inclusion(kept, width)

    def draw(self, kept: Tensor, width: int, generator: torch.Generator) -> Tensor:
        return self.positions.draw(kept, width, generator)

    def support(self, kept: int) -> Iterator[tuple[Tensor, float]]:
        return self.positions.support(kept)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(positions={described(self.positions)}"
                f"{', fallback=True' if self.fallback else ''})")


def described(sampler: PositionSampler) -> str:
    """``Class(argument=value, ...)`` of a plain sampler (they define no ``__repr__``), for messages."""
    arguments = ", ".join(f"{k}={v!r}" for k, v in vars(sampler).items() if not k.startswith("_"))
    return f"{type(sampler).__name__}({arguments})"


class ExactTargetLogits(LogSoftmaxSplit):
    """The target logit ``z_t`` exact at every executed position, the log-sum-exp sampled by ``positions``:
    ``P_hat = sum_t z_t / s_t - sum_{t in S} lse_t / (s_t p_t)`` (see the module docstring). Works with any
    reference; an online one is estimated the same way.

    Args:
        positions, fallback: as for :class:`LogSoftmaxSplit`.
    """


class ReferenceLogSumExp(LogSoftmaxSplit):
    """:class:`ExactTargetLogits` with the reference's log-sum-exp ``lse'_t`` as the baseline of the sampled term:
    ``P_hat = sum_t (z_t - lse'_t) / s_t - sum_{t in S} (lse_t - lse'_t) / (s_t p_t)``, the reference summed exactly.

    Needs a cached reference that stores ``lse'_t`` (``model.reference: lit_prunedpo.reference.CachedReference``,
    built by this version); any other reference is refused at set-up, ``fallback`` or not.

    Args:
        positions, fallback: as for :class:`LogSoftmaxSplit` (``fallback`` concerns the policy's head only).
    """

    uses_reference_lse = True
