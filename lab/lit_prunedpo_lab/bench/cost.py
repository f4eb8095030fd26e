"""FLOP cost model of one PrunedDPO step, from the shapes the plan actually executes.

Counted (multiply-add = 2 FLOPs), per forward of a row group of ``rows`` sequences padded to ``width`` columns
with ``K`` scored positions:

    body       2 * N_body * rows * width           N_body: parameters of the body's nn.Linear layers
    attention  4 * layers * a * width * (cached + width) * rows
                                                   QK^T and AV, a = heads * head_dim; the full rectangle is
                                                   counted (what SDPA with a mask computes on the CPU)
    head       2 * d * V * K                       the LM head on the gathered positions only
               + 2 * d * K_z                       a split log-softmax (control variates): the target logit alone, one
                                                   row of the head, at every executed position (``K`` the drawn ones)

* a group with a gradient costs forward + backward = 3x its forward (backward = 2x forward: gradients
  w.r.t. activations and weights), body and head alike;
* the chunked scorer (``recompute_head=True``) recomputes the head's forward in backward: + 1x head forward
  of the gradient groups;
* the online reference runs the executor's reference forward (``StepForwards.reference``: one no-grad forward
  of all the plan's rows); a cached reference costs 0;
* every shape is the one the executor lays out and the body really receives (``LaidOutGroup.shape``): with a
  shared prompt (:mod:`lit_prunedpo.layout.packed`) a forward's ``rows`` are packed sequences and ``width`` the
  longest; a no-grad forward that reads its prompts from the gradient forward executes only its own tokens, and
  its queries attend to ``cached`` more key columns (``LaidOutGroup.cached_columns``).

Not counted: embedding lookups, norms, activations, rotary, softmaxes (O(d) per token, not O(d^2)),
and the optimizer (O(N) per step, independent of tokens).

``ideal_speedup = flops(vanilla) / flops(mode)`` summed over the same batches: the speedup if time were
proportional to FLOPs. For ``B`` pairs with equal lengths and no attention term, concatenated DPO costs
``4F`` with the online reference (policy forward F, backward 2F, reference F) and ``3F`` cached; one branch per
pair costs ``3F`` (``F/2 + F`` with grad, ``F/2`` without, reference ``F``) and ``2F``: the design note's 1.33x and
1.5x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from torch import nn

from lit_prunedpo.step.execute import StepExecutor, StepForwards
from lit_prunedpo.layout import PairLengths, LeftPaddedLayout
from lit_prunedpo.step.plan import StepPlan
from lit_prunedpo.scoring import split_causal_lm

Reference = Literal["online", "cached"]


@dataclass(frozen=True)
class ModelDims:
    """The sizes the cost model needs.

    Attributes:
        body_params: parameters of the body's ``nn.Linear`` layers (matmul weights; embeddings excluded).
        hidden_size: ``d``, the LM head's input size.
        vocab_size: ``V``, the LM head's output size.
        num_layers: transformer layers (for the attention term).
        attention_dim: ``heads * head_dim`` (for the attention term).
    """

    body_params: int
    hidden_size: int
    vocab_size: int
    num_layers: int
    attention_dim: int

    def __post_init__(self) -> None:
        for name in ("body_params", "hidden_size", "vocab_size", "num_layers", "attention_dim"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    @classmethod
    def from_model(cls, model: nn.Module) -> "ModelDims":
        """Read the sizes of a ``transformers`` causal LM (its body's linear layers and its config)."""
        body, head = split_causal_lm(model)
        body_params = sum(
            m.weight.numel() + (m.bias.numel() if m.bias is not None else 0)
            for m in body.modules()
            if isinstance(m, nn.Linear)
        )
        weight = head.weight
        config = model.config
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            body_params=int(body_params),
            hidden_size=int(weight.shape[1]),
            vocab_size=int(weight.shape[0]),
            num_layers=int(config.num_hidden_layers),
            attention_dim=int(heads * head_dim),
        )


@dataclass(frozen=True)
class ForwardFlops:
    """FLOPs of one forward of a row group, by part."""

    body: int
    attention: int
    head: int

    @property
    def total(self) -> int:
        return self.body + self.attention + self.head

    @property
    def head_share(self) -> float:
        """Fraction of the forward spent in the LM head."""
        return self.head / self.total if self.total else 0.0


def forward_flops(
    dims: ModelDims, rows: int, width: int, positions: int, attention: bool = True, cached: int = 0,
    target_logits: int = 0,
) -> ForwardFlops:
    """FLOPs of one forward of ``rows`` sequences of ``width`` columns, with the head on ``positions`` rows,
    ``cached`` key columns per sequence from an earlier forward and ``target_logits`` positions whose target logit
    alone is computed (one row of the head each).

    Raises:
        ValueError: on a negative ``rows``, ``width``, ``positions``, ``cached`` or ``target_logits``.
    """
    for name, value in (("rows", rows), ("width", width), ("positions", positions), ("cached", cached),
                        ("target_logits", target_logits)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    return ForwardFlops(
        body=2 * dims.body_params * rows * width,
        attention=4 * dims.num_layers * dims.attention_dim * width * (cached + width) * rows if attention else 0,
        head=2 * dims.hidden_size * (dims.vocab_size * positions + target_logits),
    )


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one step, by stage.

    Attributes:
        policy_forward: forwards of every row group (gradient and no-grad).
        policy_backward: 2x the forward of the gradient groups.
        head_recompute: the chunked scorer's head recomputation in backward (0 for the plain scorer).
        reference_forward: the online reference's forward (0 when cached).
        body_recompute: activation checkpointing's forward of the body and attention again in backward (a TRL peer
            with it on; 0 otherwise).
    """

    policy_forward: int
    policy_backward: int
    head_recompute: int
    reference_forward: int
    body_recompute: int = 0

    @property
    def total(self) -> int:
        return (self.policy_forward + self.policy_backward + self.head_recompute + self.reference_forward
                + self.body_recompute)


def step_flops(
    forwards: StepForwards | StepPlan,
    dims: ModelDims,
    reference: Reference = "online",
    attention: bool = True,
    recompute_head: bool = False,
) -> StepFlops:
    """FLOPs of the forwards a step ran (:attr:`lit_prunedpo.step.io.StepOutput.forwards`, or
    :meth:`lit_prunedpo.step.execute.StepExecutor.forwards`): their actual rows, widths and scored positions. A bare
    plan is counted as the padded layout runs it.

    Raises:
        ValueError: on an unknown ``reference``.
    """
    if reference not in ("online", "cached"):
        raise ValueError(f"reference must be 'online' or 'cached', got {reference!r}")
    if isinstance(forwards, StepPlan):
        forwards = StepExecutor(LeftPaddedLayout()).forwards(forwards.groups, PairLengths.of_plan(forwards))
    forward = backward = recompute = 0
    for run in forwards.policy:
        laid_out = run.laid_out
        group = laid_out.group
        f = forward_flops(dims, *laid_out.shape, group.num_head_positions, attention, laid_out.cached_columns,
                          group.num_target_logits)
        forward += f.total
        if run.requires_grad:
            backward += 2 * f.total
            recompute += f.head if recompute_head else 0
    ref = 0
    if reference == "online":
        group = forwards.reference.group
        ref = forward_flops(dims, *forwards.reference.shape, group.num_head_positions, attention,
                            target_logits=group.num_target_logits).total
    return StepFlops(forward, backward, recompute, ref)


def total_flops(steps: Iterable[StepFlops]) -> int:
    """Sum of the steps' totals."""
    return sum(s.total for s in steps)


def ideal_speedup(vanilla: Iterable[StepFlops], mode: Iterable[StepFlops]) -> float:
    """``flops(vanilla) / flops(mode)`` summed over the same batches.

    Raises:
        ValueError: if ``mode`` has no FLOPs.
    """
    num, den = total_flops(vanilla), total_flops(mode)
    if den <= 0:
        raise ValueError("mode must have a positive FLOP count")
    return num / den
