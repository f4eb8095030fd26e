"""Stage 2 of a step, **execute**: the one place a step's forwards are decided and run.

:class:`StepExecutor` turns a plan (what the samplers drew) into forwards and runs them:

* **layout**: each row group is laid out by the executor's :class:`~lit_prunedpo.layout.Layout` (padded rows,
  or packed blocks with each prompt run once);
* **keys and values reused**: with ``reuse_keys_values`` the gradient forward keeps its keys and values and the
  no-grad forward after it reads its pairs' prompts from them instead of running them again (the packed layout
  does; :func:`keeps_keys_values` says whether a model can: not under gradient checkpointing, where
  ``transformers`` keeps no cache);
* **the same forwards on every rank**: under FSDP, forwards pair their collectives across ranks by call order, so
  with ``agree`` (the ranks' agreement on which forwards run, :func:`lit_prunedpo.distributed.agree_on_forwards`)
  a rank whose plan lacks a gradient or no-grad group runs a one-row placeholder forward that scores nothing;
* **the reference**: a source that runs a frozen model (:meth:`~lit_prunedpo.reference.ReferenceSource.online_model`)
  runs one no-grad forward of every row of the plan, laid out like the policy's; other sources answer
  :meth:`~lit_prunedpo.reference.ReferenceSource.token_logps`.

* **split log-softmax**: a group whose log-softmax is split (a control-variate position sampler,
  :mod:`lit_prunedpo.samplers.control_variates`) is scored as :class:`~lit_prunedpo.token_terms.TokenTerms`: the
  target logits at every executed position and the log-sum-exps at the drawn ones (the whole head there only), for
  the policy and an online reference alike; with :class:`~lit_prunedpo.samplers.ReferenceLogSumExp` the reference
  also gives its log-sum-exp at every executed position (:meth:`ReferenceScores.token_lse`, a cached reference).

:meth:`StepExecutor.forwards` says what will run (shapes and token counts, for the cost model) without running
it; :meth:`StepExecutor.__call__` runs it and returns a typed :class:`StepLogps`, one log-prob tensor per plan
group for the policy and the reference, ready for :func:`lit_prunedpo.step.estimate.estimate`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable, ContextManager, Protocol, Sequence

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.layout import GroupInputs, LaidOutGroup, Layout, LeftPaddedLayout, PairLengths, SharedPromptLayout
from lit_prunedpo.step.plan import RowGroup, StepPlan, merge_groups
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.token_terms import TokenTerms

__all__ = [
    "Agreement", "Forward", "ReferenceScores", "Scored", "StepExecutor", "StepForwards", "StepLogps",
    "keeps_keys_values", "layout_for", "placeholder_group", "split_inputs"
]

#: What a scorer returns for one forward: whole log-probs, or the two terms of a group whose log-softmax is split.
Scored = Tensor | TokenTerms

#: ``(has a gradient forward, has a no-grad forward)`` of one rank, to the forwards every rank runs.
Agreement = Callable[[tuple[bool, bool]], tuple[bool, bool]]


class ReferenceScores(Protocol):
    """What the executor needs of a reference source (:class:`lit_prunedpo.reference.ReferenceSource`)."""

    def online_model(self) -> ContextManager[tuple[nn.Module, TokenScorer]] | None: ...

    def token_logps(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]: ...

    def token_lse(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]: ...


def layout_for(shared_prompt: bool) -> Layout:
    """The packed layout (``shared_prompt``) or the padded one."""
    return SharedPromptLayout() if shared_prompt else LeftPaddedLayout()


def keeps_keys_values(model: nn.Module) -> bool:
    """Whether ``model``'s forwards can keep their keys and values for the next forward: not under gradient
    checkpointing (``transformers`` drops any cache there; the recomputation would write it twice)."""
    return not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def placeholder_group(requires_grad: bool) -> RowGroup:
    """One row (pair 0, chosen, kept length 1) scoring nothing: runs the model, contributes exactly 0."""
    empty = torch.zeros(0, dtype=torch.long)
    return RowGroup(
        pair=torch.zeros(1, dtype=torch.long), branch=torch.zeros(1, dtype=torch.long),
        kept=torch.ones(1, dtype=torch.long), scored_row=empty, scored_t=empty,
        weight=torch.zeros(0, dtype=torch.float64), requires_grad=requires_grad,
    )


@dataclass(frozen=True)
class Forward:
    """One policy forward.

    Attributes:
        laid_out: the rows as the layout arranged them.
        plan_group: index of the plan group it runs (``None``: a placeholder that keeps the ranks in step).
        keeps_keys_values: the next forward reads this one's keys and values.
    """

    laid_out: LaidOutGroup
    plan_group: int | None
    keeps_keys_values: bool = False

    @property
    def requires_grad(self) -> bool:
        return self.laid_out.group.requires_grad


@dataclass
class StepForwards:
    """What a step runs: the policy forwards in order, and the reference forward of a source that runs a model.

    Attributes:
        policy: the policy forwards, the gradient forward first.
        groups: the plan's groups.
        pairs: the batch's lengths the layout read.
        layout: the layout of every forward.
    """

    policy: tuple[Forward, ...]
    groups: tuple[RowGroup, ...]
    pairs: PairLengths
    layout: Layout

    @cached_property
    def reference(self) -> LaidOutGroup:
        """Every row of the plan in one no-grad forward: what a reference that runs a model runs (laid out when
        first asked: a step with a cached reference that logs nothing never pays for it)."""
        return self.layout.arrange(merge_groups(self.groups), self.pairs)

    @property
    def tokens_executed(self) -> int:
        """Tokens, padding included, that enter the policy body."""
        return sum(f.laid_out.tokens for f in self.policy)

    @property
    def real_tokens_executed(self) -> int:
        """Tokens that enter the policy body, padding excluded."""
        return sum(f.laid_out.real_tokens for f in self.policy)


@dataclass(frozen=True)
class StepLogps:
    """The scored log-probs of one step's forwards (torchtune's ``ChosenRejectedOutputs``, per plan group).

    Attributes:
        policy: one ``[K_g]`` tensor per plan group (a graph for the gradient group); for a group whose log-softmax
            is split, its :class:`~lit_prunedpo.token_terms.TokenTerms`.
        reference: one ``[K_g]`` tensor (or ``TokenTerms``, from an online reference) per plan group, no graph.
        forwards: what ran.
        reference_tokens_executed: tokens the reference's model ran (0 for a source that runs none).
        policy_token_stats: one ``[K_g, 3]`` tensor per plan group, the policy's
            :func:`~lit_prunedpo.scoring.token_stats` at the positions the whole head ran on
            (:attr:`~lit_prunedpo.step.plan.RowGroup.lse_index`), when the executor was asked for them
            (``token_stats=True``); else ``None``.
        reference_lse: with ``plan.reference_lse``, one ``[K_g]`` tensor per plan group: the reference's log-sum-exp
            at every scored position, the baseline of the policy's sampled ones; else ``None``.
    """

    policy: tuple[Scored, ...]
    reference: tuple[Scored, ...]
    forwards: StepForwards
    reference_tokens_executed: int
    policy_token_stats: tuple[Tensor, ...] | None = None
    reference_lse: tuple[Tensor, ...] | None = None


class StepExecutor:
    """Lays out and runs a step's forwards (see the module docstring).

    Args:
        layout: how a group's forward is laid out; ``None`` is the padded layout.
        reuse_keys_values: let a no-grad forward read the previous (gradient) forward's keys and values, where the
            layout can; ``False`` under gradient checkpointing (:func:`keeps_keys_values`).
        agree: under FSDP, the ranks' agreement on which forwards run (``None``: one process, no agreement).
        token_stats: also collect the policy's per-position token statistics (:attr:`StepLogps.policy_token_stats`,
            for the logged metrics); ``False`` computes nothing more than the log-probs.
    """

    def __init__(self, layout: Layout | None = None, reuse_keys_values: bool = True, agree: Agreement | None = None,
                 token_stats: bool = False):
        self.layout = layout if layout is not None else LeftPaddedLayout()
        self.reuse_keys_values = reuse_keys_values
        self.agree = agree
        self.token_stats = token_stats

    def forwards(self, groups: Sequence[RowGroup], pairs: PairLengths) -> StepForwards:
        """The forwards that run a plan's ``groups``, laid out, without running them."""
        grad = [(i, g) for i, g in enumerate(groups) if g.requires_grad]
        no_grad = [(i, g) for i, g in enumerate(groups) if not g.requires_grad]
        if self.agree is not None:
            need_grad, need_no_grad = self.agree((bool(grad), bool(no_grad)))
            grad = grad or ([(None, placeholder_group(True))] if need_grad else [])
            no_grad = no_grad or ([(None, placeholder_group(False))] if need_no_grad else [])
        policy: list[Forward] = []
        for index, group in grad + no_grad:
            previous = policy[-1] if policy else None
            reads = (
                self.reuse_keys_values and previous is not None and previous.plan_group is not None
                and previous.requires_grad and not group.requires_grad and index is not None
            )
            laid_out = self.layout.arrange(group, pairs, previous.laid_out if reads else None)
            if laid_out.reads_previous:
                policy[-1] = replace(previous, keeps_keys_values=True)
            policy.append(Forward(laid_out, index))
        return StepForwards(tuple(policy), tuple(groups), pairs, self.layout)

    def run_policy(self, model: nn.Module, scorer: TokenScorer, batch: PreferenceBatch,
                   forwards: StepForwards, stats: list[Tensor | None] | None = None) -> tuple[Scored, ...]:
        """One forward after the other, a graph only for the gradient ones; one log-prob tensor per plan group (its
        :class:`~lit_prunedpo.token_terms.TokenTerms` where its log-softmax is split).

        A placeholder's (empty) log-probs are appended to a plan group's, so that a gradient placeholder is part of
        the graph that backward runs through (its all-gathers and reduce-scatters must run on every rank). With
        ``stats`` (a list with one ``None`` per plan group), each group's ``[K_g, 3]`` token statistics are put
        in its slot.
        """
        logps: list[Scored | None] = [None] * len(forwards.groups)
        extra: list[Tensor] = []
        kept: DynamicCache | None = None
        for forward in forwards.policy:
            inputs = split_inputs(forward.laid_out.inputs(batch), forward.laid_out.group)
            cache = None
            if inputs.past is not None:
                if kept is None:
                    raise RuntimeError("a forward reads the keys and values of a forward that kept none")  # a bug here
                cache = inputs.past.gather(kept)
            if forward.keeps_keys_values:
                cache = DynamicCache()
            if cache is not None:
                inputs = replace(inputs, cache=cache)
            sink: list[Tensor] | None = [] if stats is not None and forward.plan_group is not None else None
            with torch.set_grad_enabled(forward.requires_grad and torch.is_grad_enabled()):
                out = scorer(model, inputs) if sink is None else scorer(model, inputs, sink)
            kept = cache if forward.keeps_keys_values else None
            if forward.plan_group is None:
                extra.append(out)
            else:
                logps[forward.plan_group] = out
                if sink is not None:
                    like = out.target if isinstance(out, TokenTerms) else out
                    stats[forward.plan_group] = torch.cat(sink) if sink else like.new_zeros(0, 3).detach()
        if extra:
            first = logps[0]
            logps[0] = first.with_appended(extra) if isinstance(first, TokenTerms) else torch.cat([first, *extra])
        return tuple(logps)  # type: ignore[arg-type]

    @torch.no_grad()
    def run_reference(self, model: nn.Module, scorer: TokenScorer, batch: PreferenceBatch,
                      forwards: StepForwards, groups: Sequence[RowGroup]) -> tuple[Scored, ...]:
        """The reference forward (every row of the plan, no graph), split back into the plan's ``groups``."""
        logps = scorer(model, split_inputs(forwards.reference.inputs(batch), forwards.reference.group))
        sizes = [g.num_scored for g in groups]
        if isinstance(logps, TokenTerms):
            return tuple(logps.split(sizes, [g.num_head_positions for g in groups]))
        return tuple(logps.split(sizes))

    def __call__(self, policy: nn.Module, scorer: TokenScorer, reference: ReferenceScores,
                 batch: PreferenceBatch, plan: StepPlan) -> StepLogps:
        """Run ``plan``'s policy forwards with ``scorer``, then the reference's."""
        # read first: a source that cannot give them is refused before any forward runs
        reference_lse = tuple(reference.token_lse(batch, plan)) if plan.reference_lse else None
        forwards = self.forwards(plan.groups, PairLengths.of(batch))
        stats: list[Tensor | None] | None = [None] * len(plan.groups) if self.token_stats else None
        policy_logps = self.run_policy(policy, scorer, batch, forwards, stats)
        online = reference.online_model()
        if online is None:
            reference_logps, reference_tokens = tuple(reference.token_logps(batch, plan)), 0
        else:
            with online as (model, reference_scorer):
                reference_logps = self.run_reference(model, reference_scorer, batch, forwards, plan.groups)
            reference_tokens = forwards.reference.tokens
        token_stats = None if stats is None else tuple(stats)  # type: ignore[arg-type]
        return StepLogps(policy_logps, reference_logps, forwards, reference_tokens, token_stats, reference_lse)


def split_inputs(inputs: GroupInputs, group: RowGroup) -> GroupInputs:
    """``inputs`` with the positions where the whole head runs (``lse_index``) where ``group``'s log-softmax is
    split; ``inputs`` as they are otherwise."""
    return replace(inputs, lse_index=group.lse_index) if group.splits_log_softmax else inputs
