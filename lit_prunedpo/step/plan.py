"""Stage 1 of a step, **plan**: every sampler draws before any compute, and the draws become row groups.

A batch of ``B`` pairs has ``2B`` response rows (row ``2i + b``: pair ``i``, branch ``b``). The plan splits
them into at most two groups:

* the rows that get a gradient (all ``2B`` of them for concatenated DPO), and
* the rows that only need their log-ratio, run under ``torch.no_grad()``.

Each group carries what the samplers drew for its rows (kept lengths, scored positions) and the
inverse-probability weights ``1 / (s_t * p_t(L))`` of its scored positions: marginal prefix survival times
*conditional* position probability. Nothing here says how a group's forward is laid out (padded rows or packed
blocks, keys and values reused, placeholder forwards on other ranks): that is the executor's business
(:mod:`lit_prunedpo.step.execute`, :mod:`lit_prunedpo.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Sequence

import torch
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.samplers import (
    AllPositions, BothBranches, BranchSampler, FullPrefix, PositionSampler, PrefixSampler,
)

__all__ = [
    "RowGroup", "StepPlan", "exact_plan", "exact_samplers", "merge_groups", "plan_step", "prompt_and_common_lengths"
]


@dataclass(frozen=True)
class RowGroup:
    """Response rows whose draws are run together: the rows with a gradient, or the rows without.

    Attributes:
        pair: ``[n]`` pair index of each row.
        branch: ``[n]`` branch of each row (0 chosen, 1 rejected).
        kept: ``[n]`` kept response length ``L`` of each row (>= 1).
        scored_row: ``[K]`` row (within the group) of each scored position.
        scored_t: ``[K]`` 0-based response position of each scored position.
        weight: ``[K]`` float64 inverse-probability weight of each scored position.
        requires_grad: whether the group's rows get a gradient.
        shared: ``[K]`` bool, positions inside the pair's common start, scored in this row once for both
            branches (``plan_step(score_common_prefix=False)``); ``None``: none.
        lse_weight: ``[K]`` float64, set by a position sampler that samples only the log-sum-exp
            (:mod:`lit_prunedpo.samplers.control_variates`): the scored positions are then *every* executed
            position, ``weight`` (``1 / s_t``) weighs the target logit ``z_t`` computed at all of them, and this
            (``1 / (s_t p_t)``, 0 where not drawn) the log-sum-exp ``lse_t`` computed at the drawn ones only.
            ``None`` (every other sampler): ``weight`` weighs each scored position's whole log-prob.
    """

    pair: Tensor
    branch: Tensor
    kept: Tensor
    scored_row: Tensor
    scored_t: Tensor
    weight: Tensor
    requires_grad: bool
    shared: Tensor | None = None
    lse_weight: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.pair.numel())

    @property
    def num_scored(self) -> int:
        return int(self.scored_row.numel())

    @property
    def splits_log_softmax(self) -> bool:
        """Whether the target logit and the log-sum-exp of a position are weighted apart (``lse_weight`` set)."""
        return self.lse_weight is not None

    @property
    def lse_index(self) -> Tensor:
        """``[K_s]`` the scored positions (indices into the ``K``) where the whole LM head runs: every one of them,
        or, where the log-softmax is split, the drawn ones."""
        if self.lse_weight is None:
            return torch.arange(self.num_scored, device=self.scored_row.device)
        return (self.lse_weight > 0).nonzero().flatten()

    @property
    def num_head_positions(self) -> int:
        """Positions where the whole LM head (``2dV`` FLOPs) runs."""
        return self.num_scored if self.lse_weight is None else int((self.lse_weight > 0).sum())

    @property
    def num_target_logits(self) -> int:
        """Positions whose target logit is computed as one row of the head (``2d`` FLOPs): every scored position of a
        group whose log-softmax is split, none otherwise."""
        return 0 if self.lse_weight is None else self.num_scored

    def to(self, device: torch.device | str) -> "RowGroup":
        """The same group with every tensor field on ``device`` (``self`` when they all are already)."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}
        if all(t.device == torch.device(device) for t in tensors.values()):
            return self
        return replace(self, **{name: t.to(device) for name, t in tensors.items()})


@dataclass(frozen=True)
class StepPlan:
    """Everything the samplers decided for one step.

    Attributes:
        groups: the row groups, the gradient group first.
        grad_mask: ``[B, 2]`` bool, branches that get a gradient.
        branch_prob: ``[B, 2]`` float64, ``q_b``: probability that each branch gets a gradient.
        prompt_width: ``P``, the batch's prompt columns (what the padded layout's rows start with).
        unpruned_tokens: tokens a concatenated, unpruned step would execute (``2B * (P + T - 1)``).
        unpruned_positions: response positions an unpruned step would score.
        kept_positions: response positions inside the prefixes the prefix sampler kept.
        drawn_positions: positions the position sampler drew (before a margin loss's common start is left out).
        reference_lse: the policy's log-sum-exps are centred on the reference's, which the executor reads at every
            scored position (:class:`~lit_prunedpo.samplers.ReferenceLogSumExp`).
    """

    groups: tuple[RowGroup, ...]
    grad_mask: Tensor
    branch_prob: Tensor
    prompt_width: int
    unpruned_tokens: int
    unpruned_positions: int
    kept_positions: int
    drawn_positions: int
    reference_lse: bool = False

    @property
    def positions_scored(self) -> int:
        """Positions the whole LM head runs on (the drawn ones where the log-softmax is split)."""
        return sum(g.num_head_positions for g in self.groups)

    @property
    def branches_backpropagated(self) -> int:
        return int(self.grad_mask.sum())


def merge_groups(groups: Sequence[RowGroup]) -> RowGroup:
    """One no-grad group holding the rows of all ``groups``, in order (``scored_row`` shifted to the merged rows).

    What a reference that runs a model scores in one forward (:class:`lit_prunedpo.step.execute.StepExecutor`); a
    single group is returned as it is.
    """
    if len(groups) == 1:
        return groups[0]
    offsets = torch.tensor([0] + [g.num_rows for g in groups[:-1]]).cumsum(0).tolist()
    merged: dict[str, object] = {"requires_grad": False}
    for f in fields(RowGroup):
        if f.name == "requires_grad":
            continue
        parts = [getattr(g, f.name) for g in groups]
        if f.name == "lse_weight":
            if all(part is None for part in parts):
                continue
            if any(part is None for part in parts):  # a bug: the planner splits every group of a plan or none
                raise RuntimeError("cannot merge groups whose log-softmax is split with groups whose is not")
        if f.name == "shared":
            if all(part is None for part in parts):
                continue
            parts = [torch.zeros(g.num_scored, dtype=torch.bool) if part is None else part
                     for g, part in zip(groups, parts, strict=True)]
        if f.name == "scored_row":
            parts = [rows + o for rows, o in zip(parts, offsets, strict=True)]
        merged[f.name] = torch.cat(parts)
    return RowGroup(**merged)  # type: ignore[arg-type]


def prompt_and_common_lengths(batch: PreferenceBatch) -> tuple[Tensor, Tensor]:
    """``([B] real prompt tokens, [B] length of the responses' common prefix)`` of every pair, on the CPU."""
    prompt_len = batch.prompt_mask.sum(1).cpu()
    ids, mask = batch.response_ids.cpu(), batch.response_mask.cpu()
    differ = (ids[:, 0] != ids[:, 1]) | ~mask[:, 0] | ~mask[:, 1]
    T = ids.shape[-1]
    first = differ.int().argmax(-1)
    common = torch.where(differ.any(-1), first, torch.full_like(first, T))
    return prompt_len, common


def exact_samplers() -> tuple[PrefixSampler, PositionSampler, BranchSampler]:
    """The samplers of the unpruned step: whole responses, every position, both branches with a gradient."""
    return FullPrefix(), AllPositions(), BothBranches()


def exact_plan(batch: PreferenceBatch) -> StepPlan:
    """The unpruned plan of ``batch`` (one gradient group, rows ``2i + b``, every weight 1); draws nothing."""
    return plan_step(batch, *exact_samplers(), generator=torch.Generator())


def _grad_and_no_grad_groups(grad_mask: Tensor, kept: Tensor, scored: Tensor, weight: Tensor, shared: Tensor | None,
                             lse_weight: Tensor | None) -> tuple[RowGroup, ...]:
    """The rows with a gradient, then those without, each as one group (an empty one left out); row ``2i + b``."""
    rows = torch.arange(grad_mask.numel())
    flat_grad = grad_mask.reshape(-1)
    grad_group = _group(rows[flat_grad], kept, scored, weight, True, shared, lse_weight)
    no_grad_group = _group(rows[~flat_grad], kept, scored, weight, False, shared, lse_weight)
    return tuple(g for g in (grad_group, no_grad_group) if g is not None)


def _group(rows: Tensor, kept: Tensor, scored: Tensor, weight: Tensor, requires_grad: bool,
           shared: Tensor | None, lse_weight: Tensor | None = None) -> RowGroup | None:
    if rows.numel() == 0:
        return None
    scored_row, scored_t = scored[rows].nonzero(as_tuple=True)
    return RowGroup(
        pair=rows // 2,
        branch=rows % 2,
        kept=kept[rows],
        scored_row=scored_row,
        scored_t=scored_t,
        weight=weight[rows][scored_row, scored_t],
        requires_grad=requires_grad,
        shared=None if shared is None else shared[rows][scored_row, scored_t],
        lse_weight=None if lse_weight is None else lse_weight[rows][scored_row, scored_t],
    )


def plan_step(
    batch: PreferenceBatch,
    prefix: PrefixSampler,
    position: PositionSampler,
    branch: BranchSampler,
    generator: torch.Generator,
    score_common_prefix: bool = True,
) -> StepPlan:
    """Draw branches, then prefixes, then positions (the order data flows) and group the rows.

    All draws happen on the CPU from ``generator``; the returned plan lives on the CPU too.

    With ``score_common_prefix=False`` the positions before the two responses of a pair first differ are scored
    once, in one row (the one with a gradient when only one has it, else the chosen one), and marked ``shared``: their
    log-probs are equal in both branches (same context, same token), so :func:`lit_prunedpo.step.estimate.ipw_sums`
    counts them in both branch sums (``logps/*`` mean what TRL's do) without a gradient (they cancel exactly in the
    margin ``R_w - R_l``, so a loss of the margin alone loses nothing); the rejected row leaves them out.

    A position sampler that samples only the log-sum-exp (``splits_log_softmax``: a
    :class:`~lit_prunedpo.samplers.LogSoftmaxSplit`) gets
    groups whose scored positions are every executed position (``t < L``), the target logit's weight ``1 / s_t``
    and, in ``lse_weight``, the drawn positions' ``1 / (s_t p_t)`` (:class:`RowGroup`).
    """
    B, P, T = batch.num_pairs, batch.prompt_width, batch.response_width
    lengths = batch.response_lengths.reshape(-1).cpu()  # row 2i + b

    # a branch sampler whose probabilities depend on the pairs (DivergentBranch) binds to this batch's responses first
    branch = branch.for_batch(batch.response_ids.cpu(), batch.response_mask.cpu())
    grad_mask = branch.draw(B, generator)
    branch_prob = branch.probabilities(B)
    kept = prefix.draw(lengths, generator)
    scored = position.draw(kept, T, generator)
    drawn = int(scored.sum())
    split = position.splits_log_softmax
    # a split log-softmax: every executed position gets its (cheap) target logit, the draws choose the log-sum-exps
    terms = (torch.arange(T)[None, :] < kept[:, None]) if split else scored
    shared = None
    if not score_common_prefix:
        owned, keep = _common_start(batch, grad_mask)
        shared = terms & owned
        terms, scored = terms & keep, scored & keep
    survival = prefix.survival(lengths, T)
    inclusion = position.inclusion(kept, T)

    _check_draws(lengths, kept, scored, survival, inclusion, grad_mask, branch_prob, B)
    weight, lse_weight = _weights(scored, terms if split else None, survival, inclusion)

    return StepPlan(
        groups=_grad_and_no_grad_groups(grad_mask, kept, terms, weight, shared, lse_weight),
        grad_mask=grad_mask,
        branch_prob=branch_prob,
        prompt_width=P,
        unpruned_tokens=2 * B * (P + T - 1),
        unpruned_positions=int(lengths.sum()),
        kept_positions=int(kept.sum()),
        drawn_positions=drawn,
        reference_lse=split and position.uses_reference_lse,
    )


def _weights(scored: Tensor, terms: Tensor | None, survival: Tensor, inclusion: Tensor) -> tuple[Tensor, Tensor | None]:
    """``(weight, lse_weight)``, ``[2B, T]``: ``1 / (s_t p_t)`` at the ``scored`` positions, no ``lse_weight``; where
    the log-softmax is split (``terms``: the positions with a target logit), ``1 / s_t`` there and ``1 / (s_t p_t)``
    at the drawn positions, apart."""
    tiny = torch.finfo(torch.float64).tiny
    weight = torch.where(scored, 1.0 / (survival * inclusion).clamp(min=tiny), 0.0)
    if terms is None:
        return weight, None
    return torch.where(terms, 1.0 / survival.clamp(min=tiny), 0.0), weight


def _common_start(batch: PreferenceBatch, grad_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``([2B, T] the common start's positions in the row that scores them for both branches, [2B, T] the positions
    each row keeps)``: every position but the common start of the row that does not own it."""
    B, T = batch.num_pairs, batch.response_width
    _, common_len = prompt_and_common_lengths(batch)
    common = torch.arange(T)[None, :] < common_len.repeat_interleave(2)[:, None]
    # scored in the row of the forward that runs the common start anyway: the one with a gradient where only
    # one branch has it (branch pruning), else the chosen one
    owner = torch.where(grad_mask[:, 0] != grad_mask[:, 1], grad_mask[:, 1].long(), 0)
    owns = (torch.arange(2 * B) % 2 == owner.repeat_interleave(2))[:, None]
    return common & owns, owns | ~common


def _check_draws(
    lengths: Tensor, kept: Tensor, scored: Tensor, survival: Tensor, inclusion: Tensor,
    grad_mask: Tensor, branch_prob: Tensor, num_pairs: int,
) -> None:
    """Catch a sampler that breaks its contract here, where the culprit is known, not as a biased loss later."""
    if kept.shape != lengths.shape or bool(((kept < 1) | (kept > lengths)).any()):
        raise RuntimeError("prefix sampler drew kept lengths outside [1, response length]")
    T = scored.shape[1]
    valid = torch.arange(T)[None, :] < lengths[:, None]
    if bool((survival[valid] <= 0).any()):
        raise RuntimeError("prefix sampler reports a zero survival probability for a response position")
    kept_valid = torch.arange(T)[None, :] < kept[:, None]
    if bool((scored & ~kept_valid).any()):
        raise RuntimeError("position sampler scored a position past the kept prefix")
    if bool((inclusion[kept_valid] <= 0).any()):
        raise RuntimeError("position sampler reports a zero inclusion probability for a kept position")
    if grad_mask.shape != (num_pairs, 2) or branch_prob.shape != (num_pairs, 2):
        raise RuntimeError("branch sampler returned a mask or probabilities not shaped [num_pairs, 2]")
    if bool((branch_prob <= 0).any()):
        raise RuntimeError("branch sampler reports a zero probability for a branch")
