"""Stage 3 of a step, **estimate**: IPW sums, margin and the single-branch surrogate.

    R_hat^b   = sum_{t in S} rho_t^b / (s_t p_t(L))              per branch, both branches
    Delta_hat = R_hat^w - R_hat^l
    c         = f'(Delta_hat)                                     detached
    surrogate = mean_i  c_i * sum_{b in B_i} sign_b R_hat_i^b / q_ib

The value handed to ``backward`` equals the estimated DPO loss ``mean f(Delta_hat)`` but carries the
surrogate's gradient, so progress bars show a loss while the gradient is the unbiased single-branch one.
With both branches back-propagated (``q = 1``) and no position/prefix pruning it is exactly the DPO gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from lit_prunedpo.losses import MarginLoss
from lit_prunedpo.plan import StepPlan


@dataclass(frozen=True)
class Estimate:
    """Per-pair estimates of one step (``B`` pairs) and the objective to back-propagate.

    Attributes:
        policy_logps: ``[B, 2]`` IPW sums of policy log-probs (with a graph for the gradient branches).
        reference_logps: ``[B, 2]`` IPW sums of reference log-probs.
        log_ratio: ``[B, 2]`` ``R_hat``, detached.
        margin: ``[B]`` ``Delta_hat``, detached.
        loss: ``[B]`` ``f(Delta_hat)``, detached.
        objective: scalar whose value is ``loss.mean()`` and whose gradient is the surrogate's.
    """

    policy_logps: Tensor
    reference_logps: Tensor
    log_ratio: Tensor
    margin: Tensor
    loss: Tensor
    objective: Tensor


def ipw_sums(plan: StepPlan, token_logps: Sequence[Tensor], num_pairs: int) -> Tensor:
    """Scatter per-group scored log-probs, weighted, into ``[B, 2]`` sums (keeps the graph)."""
    parts, slots = [], []
    for group, logps in zip(plan.groups, token_logps, strict=True):
        weight = group.weight.to(device=logps.device, dtype=logps.dtype)
        parts.append(logps * weight)
        slots.append((group.pair * 2 + group.branch)[group.scored_row].to(logps.device))
    values, index = torch.cat(parts), torch.cat(slots)
    sums = torch.zeros(2 * num_pairs, dtype=values.dtype, device=values.device).index_add(0, index, values)
    return sums.view(num_pairs, 2)


def estimate(
    plan: StepPlan,
    policy_logps: Sequence[Tensor],
    reference_logps: Sequence[Tensor],
    loss: MarginLoss,
    beta: float,
) -> Estimate:
    """Turn the scored log-probs of every group into the step's estimates and objective."""
    B = plan.grad_mask.shape[0]
    policy = ipw_sums(plan, policy_logps, B)
    reference = ipw_sums(plan, [r.detach() for r in reference_logps], B)
    log_ratio = policy - reference
    margin = (log_ratio[:, 0] - log_ratio[:, 1]).detach()
    coefficient = loss.derivative(margin, beta)

    device = policy.device
    sign = torch.tensor([1.0, -1.0], dtype=policy.dtype, device=device)
    keep = plan.grad_mask.to(device=device, dtype=policy.dtype) / plan.branch_prob.to(device=device, dtype=policy.dtype)
    surrogate = (coefficient * (log_ratio * sign * keep).sum(-1)).mean()
    per_pair_loss = loss.value(margin, beta).detach()
    objective = per_pair_loss.mean() + surrogate - surrogate.detach()
    return Estimate(policy, reference.detach(), log_ratio.detach(), margin, per_pair_loss, objective)
