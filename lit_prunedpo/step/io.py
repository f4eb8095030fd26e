"""The typed input and output (the ends) of one training step (:meth:`lit_prunedpo.module.PrunedDPO.step`).

:class:`StepParts` is what a step is made of besides the policy and the loss: the three samplers, the scorer,
the reference source and the layout. ``PrunedDPO`` builds its own from its constructor arguments
(:attr:`~lit_prunedpo.module.PrunedDPO.parts`); the benchmark passes one per configuration, so that every
configuration runs the same step on the same policy without changing the module. :class:`StepOutput` is what
the step produced before the backward, stage by stage: the plan, what the executor ran, the estimate, and the work
counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lit_prunedpo.step.estimate import Estimate
from lit_prunedpo.step.execute import StepForwards, StepLogps
from lit_prunedpo.layout import Layout, SharedPromptLayout
from lit_prunedpo.metrics import StepStats
from lit_prunedpo.step.plan import StepPlan
from lit_prunedpo.reference import ReferenceSource
from lit_prunedpo.samplers import BranchSampler, PositionSampler, PrefixSampler
from lit_prunedpo.scoring import TokenScorer

__all__ = ["StepOutput", "StepParts"]


@dataclass(frozen=True)
class StepParts:
    """The plug-ins one training step runs with."""

    prefix_sampler: PrefixSampler
    """Which response prefixes run."""
    position_sampler: PositionSampler
    """Which kept positions are scored."""
    branch_sampler: BranchSampler
    """Which branches get a gradient."""
    scorer: TokenScorer
    """Per-token log-probs of the policy."""
    reference: ReferenceSource
    """Reference log-probs at the plan's scored positions."""
    layout: Layout = field(default_factory=SharedPromptLayout)
    """How the rows become forwards (``lit_prunedpo.layout``): a concrete layout, e.g. a module's
    :meth:`~lit_prunedpo.module.PrunedDPO.resolved_layout`."""

    @property
    def shared_prompt(self) -> bool:
        """Whether the step runs packed blocks (each pair's prompt once per forward)."""
        return isinstance(self.layout, SharedPromptLayout)


@dataclass(frozen=True)
class StepOutput:
    """One step up to its backward: back-propagate ``estimate.objective``."""

    plan: StepPlan
    """What the samplers drew."""
    logps: StepLogps
    """What the executor ran and scored."""
    estimate: Estimate
    """The IPW estimates and the objective."""
    reference: ReferenceSource
    """The source that scored the reference."""

    @property
    def forwards(self) -> StepForwards:
        """The forwards that ran (shapes and token counts, for the cost model)."""
        return self.logps.forwards

    @property
    def stats(self) -> StepStats:
        """The step's work counts."""
        plan = self.plan
        return StepStats(
            tokens_executed=self.forwards.tokens_executed,
            positions_scored=plan.positions_scored,
            branches_backpropagated=plan.branches_backpropagated,
            reference_tokens_executed=self.logps.reference_tokens_executed,
            unpruned_tokens=plan.unpruned_tokens,
            unpruned_positions=plan.unpruned_positions,
            unpruned_branches=int(plan.grad_mask.numel()),
            kept_positions=plan.kept_positions,
            drawn_positions=plan.drawn_positions,
        )
