"""Stage 3 of a step, **estimate**: IPW sums, the loss and the single-branch surrogate.

    P_hat^b, Ref_hat^b = sum_{t in S} logp_t^b / (s_t p_t(L))     policy and reference, both branches
    c_b       = d loss / d P^b  at the estimates                   detached (the loss's ``policy_partials``)
    surrogate = mean_i  sum_{b in B_i} c_ib * P_hat_i^b / q_ib

Where a position sampler splits the log-softmax (:mod:`lit_prunedpo.samplers.control_variates`), a group's scored
positions are every executed one and its log-probs come as :class:`~lit_prunedpo.token_terms.TokenTerms`:

    P_hat^b = sum_{t executed} (z_t - b_t) / s_t  -  sum_{t in S} (lse_t - b_t) / (s_t p_t)

with the baseline ``b_t`` the reference's log-sum-exp (``ReferenceLogSumExp``) or 0 (``ExactTargetLogits``); a
reference given as whole log-probs at every executed position (a cache) is summed exactly, ``sum_t logp'_t / s_t``.

For a margin loss ``f(Delta)``, ``c = (f'(Delta_hat), -f'(Delta_hat))`` and this is the design note's
``f'(Delta_hat) * sum_b sign_b R_hat^b / q_b`` (the reference sums carry no gradient). The value handed to
``backward`` equals the estimated loss ``mean loss(sums_hat)`` but carries the surrogate's gradient, so progress
bars show a loss while the gradient is the single-branch one. With both branches back-propagated (``q = 1``)
and no position/prefix pruning it is exactly the loss's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from lit_prunedpo.losses import BranchSums, PreferenceLoss
from lit_prunedpo.step.plan import RowGroup, StepPlan
from lit_prunedpo.token_terms import TokenTerms

__all__ = ["Estimate", "estimate", "ipw_sums", "split_terms"]


@dataclass(frozen=True)
class Estimate:
    """Per-pair estimates of one step (``B`` pairs) and the objective to back-propagate.

    Attributes:
        policy_logps: ``[B, 2]`` IPW sums of policy log-probs (with a graph for the gradient branches).
        reference_logps: ``[B, 2]`` IPW sums of reference log-probs.
        log_ratio: ``[B, 2]`` ``R_hat``, detached.
        margin: ``[B]`` ``Delta_hat``, detached.
        loss: ``[B]`` the per-pair loss at the estimates, detached.
        objective: scalar whose value is ``loss.mean()`` and whose gradient is the surrogate's.
        rewards: ``[B, 2]`` the rewards TRL's trainer for this loss logs (``beta * R_hat`` for DPO's losses,
            ``beta`` times the mean log-prob per token for SimPO and ORPO: :meth:`PreferenceLoss.reported`),
            detached; ``None`` reads as ``beta * log_ratio``.
        reported_logps: ``[B, 2]`` the policy log-probs TRL logs as ``logps/*`` (sums, or per-token means where
            its trainer averages), detached; ``None`` reads as ``policy_logps``.
    """

    policy_logps: Tensor
    reference_logps: Tensor
    log_ratio: Tensor
    margin: Tensor
    loss: Tensor
    objective: Tensor
    rewards: Tensor | None = None
    reported_logps: Tensor | None = None


def split_terms(group: RowGroup, terms: TokenTerms, baseline: Tensor | None = None) -> Tensor:
    """``[K]`` each scored position's share of ``P_hat`` (keeps the graph): ``(z_t - b_t) w_t`` everywhere, minus
    ``(lse_t - b_t) w'_t`` at the drawn positions (``w = weight``, ``w' = lse_weight``, ``b`` the ``baseline``,
    ``[K]``, or 0)."""
    if not group.splits_log_softmax:
        raise ValueError("TokenTerms were scored for a row group whose log-softmax is not split")
    target, lse = terms.target, terms.lse
    index = group.lse_index.to(target.device)
    if baseline is not None:
        baseline = baseline.to(device=target.device, dtype=target.dtype)
        target, lse = target - baseline, lse - baseline[index]
    weight = group.weight.to(device=target.device, dtype=target.dtype)
    lse_weight = group.lse_weight.to(device=target.device, dtype=target.dtype)[index]
    return (target * weight).index_add(0, index, -lse * lse_weight)


def ipw_sums(plan: StepPlan, token_logps: Sequence[Tensor | TokenTerms], num_pairs: int,
             baselines: Sequence[Tensor] | None = None) -> Tensor:
    """Scatter per-group scored log-probs, weighted, into ``[B, 2]`` sums (keeps the graph).

    A group's :class:`TokenTerms` are weighted by :func:`split_terms`, centred on its ``baselines`` entry where
    given; whole log-probs are weighted by the group's ``weight`` (which, for a split group, sums them exactly over
    the executed positions)."""
    parts, slots = [], []
    for i, (group, logps) in enumerate(zip(plan.groups, token_logps, strict=True)):
        if isinstance(logps, TokenTerms):
            weighted = split_terms(group, logps, None if baselines is None else baselines[i])
        else:
            weighted = logps * group.weight.to(device=logps.device, dtype=logps.dtype)
        slot = (group.pair * 2 + group.branch)[group.scored_row].to(weighted.device)
        if group.shared is not None:
            # a common-start position scored once in one row stands for the other branch's too; no gradient:
            # it cancels exactly in the margin (the only losses that share positions are margin losses)
            shared = group.shared.to(weighted.device)
            weighted = torch.where(shared, weighted.detach(), weighted)
            parts.append(weighted[shared])
            slots.append(slot[shared] ^ 1)  # the pair's other branch
        parts.append(weighted)
        slots.append(slot)
    values, index = torch.cat(parts), torch.cat(slots)
    sums = torch.zeros(2 * num_pairs, dtype=values.dtype, device=values.device).index_add(0, index, values)
    return sums.view(num_pairs, 2)


def estimate(
    plan: StepPlan,
    policy_logps: Sequence[Tensor | TokenTerms],
    reference_logps: Sequence[Tensor | TokenTerms],
    loss: PreferenceLoss,
    beta: float,
    lengths: Tensor | None = None,
    reference_lse: Sequence[Tensor] | None = None,
) -> Estimate:
    """Turn the scored log-probs of every group into the step's estimates and objective.

    ``lengths`` (``[B, 2]`` full response lengths) is needed by losses of means or token averages only;
    ``reference_lse`` (one ``[K_g]`` tensor per group, :attr:`~lit_prunedpo.step.execute.StepLogps.reference_lse`) is
    the baseline of the policy's sampled log-sum-exps where ``plan.reference_lse``.

    Raises:
        ValueError: ``plan.reference_lse`` without ``reference_lse``.
    """
    B = plan.grad_mask.shape[0]
    if plan.reference_lse and reference_lse is None:
        raise ValueError("this plan centres the policy's log-sum-exps on the reference's (ReferenceLogSumExp), "
                         "but estimate() was called without reference_lse")
    policy = ipw_sums(plan, policy_logps, B, [r.detach() for r in reference_lse] if plan.reference_lse else None)
    reference = ipw_sums(plan, [r.detach() for r in reference_logps], B).detach()
    sums = BranchSums(policy.detach(), reference, lengths)
    coefficient = loss.policy_partials(sums, beta)

    device, dtype = policy.device, policy.dtype
    keep = plan.grad_mask.to(device=device, dtype=dtype) / plan.branch_prob.to(device=device, dtype=dtype)
    surrogate = (coefficient.to(dtype) * policy * keep).sum(-1).mean()
    per_pair_loss = loss.per_pair(sums, beta).detach()
    objective = per_pair_loss.mean() + surrogate - surrogate.detach()
    reported = loss.reported(sums)
    return Estimate(policy, reference, sums.log_ratio, sums.margin, per_pair_loss, objective,
                    beta * reported.log_ratio, reported.policy)
