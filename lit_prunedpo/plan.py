"""Stage 1 of a step, **plan**: every sampler draws before any compute, and the draws become row groups.

A batch of ``B`` pairs has ``2B`` response rows (row ``2i + b``: pair ``i``, branch ``b``). The plan splits
them into at most two groups, each one forward pass:

* the rows that get a gradient (all ``2B`` of them for concatenated DPO), and
* the rows that only need their log-ratio, run under ``torch.no_grad()``.

Each group carries its executed width (``P + max kept length - 1``: the padded tensor really shrinks),
the positions to score and their inverse-probability weights ``1 / (s_t * p_t(L))``: marginal prefix
survival times *conditional* position probability.

This module owns every ``RowGroup``/``StepPlan`` operation: building them (:func:`plan_step`, the unpruned
:func:`exact_plan`), merging groups into one forward (:func:`merge_groups`), the empty placeholder group that
keeps ranks in step (:func:`placeholder_group`), re-grouping a plan (:meth:`StepPlan.with_groups`) and device
moves (:meth:`RowGroup.to`). A new row-group field is added here only: ``to`` and ``merge_groups`` handle every
per-row tensor field, and :func:`_group` fills it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.samplers import (
    AllPositions, BothBranches, BranchSampler, FullPrefix, PositionSampler, PrefixSampler,
)
from lit_prunedpo.shared_prompt import prompt_and_common_lengths

if TYPE_CHECKING:
    from lit_prunedpo.shared_prompt import PackedLayout


@dataclass(frozen=True)
class RowGroup:
    """Response rows executed together in one forward pass.

    Attributes:
        pair: ``[n]`` pair index of each row.
        branch: ``[n]`` branch of each row (0 chosen, 1 rejected).
        kept: ``[n]`` kept response length ``L`` of each row (>= 1).
        width: number of input columns executed, ``P + max(kept) - 1``.
        scored_row: ``[K]`` row (within the group) of each scored position.
        scored_t: ``[K]`` 0-based response position of each scored position.
        weight: ``[K]`` float64 inverse-probability weight of each scored position.
        requires_grad: whether the group's forward keeps a graph.
        prompt_len: ``[n]`` real prompt tokens of each row's pair (``None`` for groups built without them).
        common_len: ``[n]`` length of the common prefix of the two responses of each row's pair.
        shared_prompt: run one packed block per pair (``lit_prunedpo.shared_prompt``) instead of one row per
            response.
        cached_len: ``[n]`` leading input tokens (prompt, then response) of each row that are not executed but
            read from the previous group's forward, detached (``None``: every row runs whole; see
            :func:`lit_prunedpo.shared_prompt.read_prompt_cache`).
        cache_seq: ``[n]`` sequence of the previous group's forward that holds the row's cached tokens.
        cache_col: ``[n]`` column of that sequence where the row's cached tokens start.
    """

    pair: Tensor
    branch: Tensor
    kept: Tensor
    width: int
    scored_row: Tensor
    scored_t: Tensor
    weight: Tensor
    requires_grad: bool
    prompt_len: Tensor | None = None
    common_len: Tensor | None = None
    shared_prompt: bool = False
    cached_len: Tensor | None = None
    cache_seq: Tensor | None = None
    cache_col: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.pair.numel())

    @property
    def num_scored(self) -> int:
        return int(self.scored_row.numel())

    @property
    def executed_shape(self) -> tuple[int, int]:
        """``(sequences, columns)`` of the tensor that enters the model body for this group."""
        if self.shared_prompt:
            layout = self.layout()
            return layout.num_sequences, layout.width
        return self.num_rows, self.width

    @property
    def cached_columns(self) -> int:
        """Key columns each sequence reads from the previous group's forward besides its own (0 without)."""
        return self.layout().cache_width if self.shared_prompt and self.cached_len is not None else 0

    @property
    def tokens_executed(self) -> int:
        """Tokens, padding included, that enter the model body for this group."""
        rows, width = self.executed_shape
        return rows * width

    @property
    def real_tokens_executed(self) -> int:
        """Tokens that enter the model body for this group, padding excluded."""
        if self.shared_prompt:
            return self.layout().real_tokens
        if self.prompt_len is None:
            raise ValueError("this row group was built without prompt lengths: its real tokens are unknown")
        return int((self.prompt_len + self.kept - 1).sum())

    def layout(self) -> "PackedLayout":
        """Where each row sits in the shared-prompt layout (one packed block per pair); computed once per group
        (a step asks for it several times: shapes, token counts, inputs, the cost model)."""
        from lit_prunedpo.shared_prompt import group_layout

        if "_layout" not in self.__dict__:
            object.__setattr__(self, "_layout", group_layout(self))  # frozen: the fields cannot change under it
        return self.__dict__["_layout"]

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
        groups: the forward passes to run, the gradient group first.
        grad_mask: ``[B, 2]`` bool, branches that get a gradient.
        branch_prob: ``[B, 2]`` float64, ``q_b``: probability that each branch gets a gradient.
        unpruned_tokens: tokens a concatenated, unpruned step would execute (``2B * (P + T - 1)``).
        unpruned_positions: response positions an unpruned step would score.
    """

    groups: tuple[RowGroup, ...]
    grad_mask: Tensor
    branch_prob: Tensor
    unpruned_tokens: int
    unpruned_positions: int

    @property
    def tokens_executed(self) -> int:
        return sum(g.tokens_executed for g in self.groups)

    @property
    def real_tokens_executed(self) -> int:
        return sum(g.real_tokens_executed for g in self.groups)

    @property
    def positions_scored(self) -> int:
        return sum(g.num_scored for g in self.groups)

    @property
    def branches_backpropagated(self) -> int:
        return int(self.grad_mask.sum())

    def with_groups(self, groups: Sequence[RowGroup]) -> "StepPlan":
        """The same draws run as ``groups`` (e.g. with placeholder groups added)."""
        return replace(self, groups=tuple(groups))


#: Fields of :class:`RowGroup` that are not one entry per row (or per scored position), for :func:`merge_groups`.
_GROUP_SCALARS = ("width", "requires_grad", "shared_prompt")
#: Fields that point into another group's forward: a merged group runs every row whole.
_CACHE_FIELDS = ("cached_len", "cache_seq", "cache_col")


def merge_groups(groups: Sequence[RowGroup]) -> RowGroup:
    """One no-grad group holding the rows of all ``groups`` (widest width), for a single forward pass.

    Row-indexed and position-indexed tensors are concatenated (``scored_row`` shifted to the merged rows); an
    optional tensor stays ``None`` unless every group has it; the merged group is shared-prompt only if all are,
    and reads no other forward's keys and values (its rows run whole).
    """
    if len(groups) == 1:
        return groups[0] if groups[0].cached_len is None else replace(groups[0], **dict.fromkeys(_CACHE_FIELDS))
    offsets = torch.tensor([0] + [g.num_rows for g in groups[:-1]]).cumsum(0).tolist()
    merged: dict[str, object] = {
        "width": max(g.width for g in groups),
        "requires_grad": False,
        "shared_prompt": all(g.shared_prompt for g in groups),
    }
    for f in fields(RowGroup):
        if f.name in _GROUP_SCALARS or f.name in _CACHE_FIELDS:
            continue
        parts = [getattr(g, f.name) for g in groups]
        if f.name == "scored_row":
            parts = [rows + o for rows, o in zip(parts, offsets, strict=True)]
        merged[f.name] = None if any(x is None for x in parts) else torch.cat(parts)
    return RowGroup(**merged)  # type: ignore[arg-type]


def placeholder_group(prompt_width: int, requires_grad: bool) -> RowGroup:
    """One row (pair 0, chosen) of width ``prompt_width`` scoring nothing: runs the model, contributes exactly 0.

    Lets a rank run a forward its plan does not need, so that every rank runs the same forwards
    (:func:`lit_prunedpo.distributed.balance_plan_groups`).
    """
    empty = torch.zeros(0, dtype=torch.long)
    return RowGroup(
        pair=torch.zeros(1, dtype=torch.long), branch=torch.zeros(1, dtype=torch.long),
        kept=torch.ones(1, dtype=torch.long), width=prompt_width, scored_row=empty, scored_t=empty,
        weight=torch.zeros(0, dtype=torch.float64), requires_grad=requires_grad,
    )


def exact_samplers() -> tuple[PrefixSampler, PositionSampler, BranchSampler]:
    """The samplers of the unpruned step: whole responses, every position, both branches with a gradient."""
    return FullPrefix(), AllPositions(), BothBranches()


def exact_plan(batch: PreferenceBatch, shared_prompt: bool = False) -> StepPlan:
    """The unpruned plan of ``batch`` (one gradient group, rows ``2i + b``, every weight 1); draws nothing."""
    return plan_step(batch, *exact_samplers(), generator=torch.Generator(), shared_prompt=shared_prompt)


def _group(
    rows: Tensor, kept: Tensor, scored: Tensor, weight: Tensor, prompt_width: int, requires_grad: bool,
    prompt_len: Tensor, common_len: Tensor, shared_prompt: bool,
) -> RowGroup | None:
    if rows.numel() == 0:
        return None
    kept_g = kept[rows]
    scored_row, scored_t = scored[rows].nonzero(as_tuple=True)
    return RowGroup(
        pair=rows // 2,
        branch=rows % 2,
        kept=kept_g,
        width=prompt_width + int(kept_g.max()) - 1,
        scored_row=scored_row,
        scored_t=scored_t,
        weight=weight[rows][scored_row, scored_t],
        requires_grad=requires_grad,
        prompt_len=prompt_len[rows // 2],
        common_len=common_len[rows // 2],
        shared_prompt=shared_prompt,
    )


def plan_step(
    batch: PreferenceBatch,
    prefix: PrefixSampler,
    position: PositionSampler,
    branch: BranchSampler,
    generator: torch.Generator,
    shared_prompt: bool = False,
    score_common_prefix: bool = True,
    prompt_cache: bool = False,
) -> StepPlan:
    """Draw branches, then prefixes, then positions (the order data flows) and group the rows.

    All draws happen on the CPU from ``generator``; the returned plan lives on the CPU too. With
    ``shared_prompt`` every group runs one packed block per pair (``lit_prunedpo.shared_prompt``): the same rows,
    positions and weights, fewer executed tokens.

    With ``score_common_prefix=False`` the positions before the two responses of a pair first differ are not
    scored in either branch: their log-ratios are equal in both branches (same context, same token), so they
    cancel exactly in the margin ``R_w - R_l``; a loss of the margin alone loses nothing (the IPW weights of the
    other positions are unchanged), while per-branch sums (``logps/chosen``) then cover the differing part only.

    With ``prompt_cache`` (and ``shared_prompt``) the no-grad group does not run the prompts (and shared tokens)
    that the gradient group runs: its rows read them from the gradient forward's keys and values
    (:func:`lit_prunedpo.shared_prompt.read_prompt_cache`); the executor must then run the groups in order.
    """
    B, P, T = batch.num_pairs, batch.prompt_width, batch.response_width
    lengths = batch.response_lengths.reshape(-1).cpu()  # row 2i + b

    grad_mask = branch.draw(B, generator)
    branch_prob = branch.probabilities(B)
    kept = prefix.draw(lengths, generator)
    scored = position.draw(kept, T, generator)
    prompt_len, common_len = prompt_and_common_lengths(batch)
    if not score_common_prefix:
        scored = scored & (torch.arange(T)[None, :] >= common_len.repeat_interleave(2)[:, None])
    survival = prefix.survival(lengths, T)
    inclusion = position.inclusion(kept, T)

    _check_draws(lengths, kept, scored, survival, inclusion, grad_mask, branch_prob, B)
    weight = torch.where(scored, 1.0 / (survival * inclusion).clamp(min=torch.finfo(torch.float64).tiny), 0.0)

    rows = torch.arange(2 * B)
    flat_grad = grad_mask.reshape(-1)
    layout = (prompt_len, common_len, shared_prompt)
    grad_group = _group(rows[flat_grad], kept, scored, weight, P, True, *layout)
    no_grad_group = _group(rows[~flat_grad], kept, scored, weight, P, False, *layout)
    if prompt_cache and shared_prompt and grad_group is not None and no_grad_group is not None:
        from lit_prunedpo.shared_prompt import read_prompt_cache

        no_grad_group = read_prompt_cache(no_grad_group, grad_group)
    groups = tuple(g for g in (grad_group, no_grad_group) if g is not None)
    return StepPlan(
        groups=groups,
        grad_mask=grad_mask,
        branch_prob=branch_prob,
        unpruned_tokens=2 * B * (P + T - 1),
        unpruned_positions=int(lengths.sum()),
    )


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
