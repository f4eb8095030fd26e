"""End-to-end checks through the real planner and estimator: any combination of samplers
(:func:`check_unbiased`: :func:`lit_prunedpo.step.plan.plan_step` and :func:`lit_prunedpo.step.estimate.ipw_sums` on
made-up log-probs), and a module's own step (:func:`check_step_unbiased`: its model, scorer, reference and layout);
and the made-up batches and scores they run on (:func:`synthetic_batch`, :func:`scored_values`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.step.estimate import ipw_sums
from lit_prunedpo.step.plan import RowGroup, plan_step
from lit_prunedpo.samplers import (
    AllPositions,
    BothBranches,
    BranchSampler,
    FullPrefix,
    PositionSampler,
    PrefixSampler,
)
from lit_prunedpo.testing.report import SamplerReport, check_monte_carlo
from lit_prunedpo.token_terms import TokenTerms

if TYPE_CHECKING:
    from lit_prunedpo.module import PrunedDPO


def synthetic_batch(lengths: Tensor, prompt_length: int = 2, vocab: int = 16, seed: int = 0) -> PreferenceBatch:
    """A batch with response lengths ``lengths`` (``[B, 2]``) and random tokens, for sampler checks."""
    g = torch.Generator().manual_seed(seed)
    B, T = lengths.shape[0], int(lengths.max())
    response_mask = torch.arange(T)[None, None, :] < lengths[:, :, None]
    return PreferenceBatch(
        prompt_ids=torch.randint(vocab, (B, prompt_length), generator=g),
        prompt_mask=torch.ones(B, prompt_length, dtype=torch.bool),
        response_ids=torch.randint(vocab, (B, 2, T), generator=g) * response_mask,
        response_mask=response_mask,
        index=torch.arange(B),
    )


def scored_values(group: RowGroup, rho: Tensor, lse: Tensor | None = None) -> Tensor | TokenTerms:
    """What a scorer would return for ``group`` if the log-prob of response token ``t`` of pair ``i``, branch ``b``
    were ``rho[i, b, t]`` (``[B, 2, T]``): those log-probs at its scored positions, or, where its log-softmax is split,
    :class:`TokenTerms` with target logits ``rho + lse`` and the log-sum-exps ``lse`` at its drawn positions."""
    if not group.splits_log_softmax:
        return at_scored(group, rho)
    if lse is None:
        raise ValueError("this plan splits the log-softmax: give each token's log-sum-exp (lse)")
    return TokenTerms(target=at_scored(group, rho + lse), lse=at_scored(group, lse)[group.lse_index])


def at_scored(group: RowGroup, values: Tensor) -> Tensor:
    """``[K]`` ``values`` (``[B, 2, T]``, per pair, branch and response position) at ``group``'s scored positions."""
    return values[group.pair[group.scored_row], group.branch[group.scored_row], group.scored_t]


def check_unbiased(
    prefix: PrefixSampler | None = None,
    position: PositionSampler | None = None,
    branch: BranchSampler | None = None,
    lengths: Tensor | None = None,
    num_draws: int = 4000,
    z: float = 5.0,
    seed: int = 0,
) -> SamplerReport:
    """End to end through the real planner and IPW sums: ``E[R_hat] = R`` per branch, and the branch-weighted
    estimate ``sum_b 1{b in B} sign_b R_hat^b / q_b`` has mean ``R_w - R_l``."""
    prefix, position, branch = prefix or FullPrefix(), position or AllPositions(), branch or BothBranches()
    lengths = lengths if lengths is not None else torch.tensor([[5, 3], [1, 8], [12, 12]])
    batch = synthetic_batch(lengths, seed=seed)
    g = torch.Generator().manual_seed(seed)
    rho = torch.randn(batch.response_ids.shape, generator=g, dtype=torch.float64) * batch.response_mask
    # log-sum-exps (and a reference's, near them) for the samplers that split the log-softmax; their own stream,
    # so that every other sampler sees the draws it always saw
    terms = torch.Generator().manual_seed(seed + 1)
    lse = 2.0 + torch.rand(rho.shape, generator=terms, dtype=torch.float64)
    reference_lse = lse + 0.3 * torch.randn(rho.shape, generator=terms, dtype=torch.float64)
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64)
    r_hats, directions = [], []
    for _ in range(num_draws):
        plan = plan_step(batch, prefix, position, branch, g)
        scored = [scored_values(grp, rho, lse) for grp in plan.groups]
        baselines = [at_scored(grp, reference_lse) for grp in plan.groups] if plan.reference_lse else None
        r_hat = ipw_sums(plan, scored, batch.num_pairs, baselines)
        r_hats.append(r_hat)
        directions.append((plan.grad_mask * sign * r_hat / plan.branch_prob).sum(-1))
    report = SamplerReport()
    R = rho.sum(-1)
    stacked, dirs = torch.stack(r_hats), torch.stack(directions)
    check_monte_carlo(report, "E[R_hat] per branch", stacked.mean(0), R, stacked.std(0) / math.sqrt(num_draws), z)
    check_monte_carlo(report, "E[branch-weighted R_hat]", dirs.mean(0), R[:, 0] - R[:, 1],
                      dirs.std(0) / math.sqrt(num_draws), z)
    return report


def check_step_unbiased(
    module: PrunedDPO,
    batch: PreferenceBatch,
    position: PositionSampler,
    prefix: PrefixSampler | None = None,
    branch: BranchSampler | None = None,
    num_draws: int = 300,
    z: float = 5.0,
    directions: int = 4,
    seed: int = 0,
) -> SamplerReport:
    """Check by Monte Carlo that ``module``'s own step (a :class:`~lit_prunedpo.PrunedDPO`: its model, scorer,
    reference and layout) with these samplers estimates the unpruned step's sums and gradient without bias.

    Over ``num_draws`` steps (:meth:`~lit_prunedpo.PrunedDPO.step`, each a plan, the forwards and the estimate), the
    means of the policy's and the reference's IPW sums ``[B, 2]``, and of the gradient of ``sum_b 1{b in B} P_hat^b
    / q_b`` projected on ``directions`` random unit vectors, lie within ``z`` standard errors of the unpruned step's
    (``E[P_hat] = P`` and ``E[grad P_hat] = grad P``, both linear in the draws). The module's gradients are left
    untouched.
    """
    report = SamplerReport()
    params = [p for p in module.policy.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(seed)
    size = sum(p.numel() for p in params)
    unit = torch.nn.functional.normalize(torch.randn(directions, size, generator=g, dtype=torch.float64), dim=1)

    def draw(prefix_, position_, branch_, generator) -> tuple[Tensor, Tensor, Tensor]:
        parts = module.parts_with(prefix_, position_, branch_)  # what training would run with them
        out = module.step(batch, parts, generator)
        est, plan = out.estimate, out.plan
        keep = (plan.grad_mask / plan.branch_prob).to(est.policy_logps)
        grads = torch.autograd.grad((keep * est.policy_logps).sum(), params, allow_unused=True)
        flat = torch.cat([(gr if gr is not None else torch.zeros_like(p)).flatten() for gr, p in zip(grads, params)])
        return est.policy_logps.detach().double(), est.reference_logps.detach().double(), unit @ flat.double()

    exact = draw(FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    draws = [draw(prefix or FullPrefix(), position, branch or BothBranches(), g) for _ in range(num_draws)]
    for what, index in (("E[P_hat] per branch", 0), ("E[Ref_hat] per branch", 1), ("E[grad P_hat] on directions", 2)):
        stacked = torch.stack([d[index] for d in draws])
        check_monte_carlo(report, what, stacked.mean(0), exact[index], stacked.std(0) / math.sqrt(num_draws), z)
    return report
