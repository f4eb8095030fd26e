"""No reference at all, for reference-free losses (SimPO, ORPO, a pure NLL): zeros, and nothing run.

:class:`NoReference` builds no frozen copy of the policy, runs no forward, loads no cache and counts 0
reference tokens. :func:`reference_for` picks it when the loss needs no reference and refuses a reference
that would compute log-probs the loss ignores (a full model forward per step, or a cache, for nothing).
The converse is allowed: a reference-using loss with ``NoReference`` is the old ``reference_free=True`` of
TRL (a uniform reference), e.g. DPO on the policy's log-probs alone.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.losses import PreferenceLoss
from lit_prunedpo.step.plan import StepPlan
from lit_prunedpo.reference.base import ReferenceSource
from lit_prunedpo.reference.online import OnlineReference


class NoReference(ReferenceSource):
    """A reference log-prob of 0 at every scored position, computed by nothing."""

    def token_logps(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        device = batch.prompt_ids.device
        return [torch.zeros(g.num_scored, dtype=torch.float32, device=device) for g in plan.groups]


def reference_for(loss: PreferenceLoss, reference: ReferenceSource | None) -> ReferenceSource:
    """The reference source a module with ``loss`` uses: ``reference`` when given, else ``NoReference`` for a
    reference-free loss and a frozen copy of the policy (``OnlineReference``) otherwise.

    Raises:
        ValueError: when the loss needs no reference but ``reference`` would compute one.
    """
    if reference is None:
        return OnlineReference() if loss.needs_reference else NoReference()
    if not loss.needs_reference and not isinstance(reference, NoReference):
        raise ValueError(
            f"model.loss {type(loss).__name__} uses no reference, but model.reference is "
            f"{type(reference).__name__}, which would compute reference log-probs the loss ignores: "
            "leave model.reference unset (null) or set it to lit_prunedpo.reference.NoReference"
        )
    return reference
