"""A memory budget for the study: every arm's measured peak step memory, and each arm fitted to the budget its
fastest exact way.

**What is measured.** The peak memory of one training step above the memory in use when the step starts
(:class:`~lit_prunedpo.callbacks.PeakMemoryMeter`, settled before each step: on the CPU the peak of live tensor
storage, from the CPU allocator's events; on CUDA the allocator's ``max_memory_allocated``): the activations,
logits, gradients and optimizer work a step adds on top of the weights, the share that pruning changes. The
calibration (:func:`lit_prunedpo_lab.study.calibrate.measure_step_costs`) measures it next to the step cost; an arm's
peak is the largest over its measured steps.

**Fitting** (:func:`choose_fit`). An arm whose peak is over the budget is measured again in every exact variant
(:func:`fit_candidates`): the chunked scorer (:class:`~lit_prunedpo.chunked_scorer.ChunkedScorer`: no ``K x V``
logits), the policy's gradient checkpointing, gradient accumulation over 2, 4, ... micro-batches
(:func:`accumulate`), and their combinations; the fastest variant whose measured peak fits is the arm at that
budget (ties: the smaller peak). Every variant computes the same step (the same loss and gradients up to float
rounding), so only its cost differs. For vanilla at the task's batch this is the **memory-fitted vanilla**
control; a pruned arm is replaced by its fitted variant. Nothing fitting is an error naming the budget and the
smallest measured peak. A budget over every arm's peak binds nothing (:func:`budget_binds`): the report says so,
since such a study is the one without the budget and decides nothing about memory.

On the CPU a micro-batch costs about its share of the full step, so accumulation is nearly free; on a GPU
small micro-batches under-use the device. A verdict whose fitting used accumulation is therefore a CPU verdict
that a GPU must confirm (:func:`needs_gpu`; ``lab/scripts/gpu-check`` measures one memory-binding cell on CUDA).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.study.arms import Arm

if TYPE_CHECKING:
    from lit_prunedpo import PrunedDPO

GPU_NOTE = "CPU verdict; GPU needed to confirm"


def split_batch(batch: PreferenceBatch, parts: int) -> list[PreferenceBatch]:
    """``batch`` cut into ``parts`` contiguous micro-batches whose sizes differ by at most one pair.

    Raises:
        ValueError: if ``parts`` is not in ``[1, batch.num_pairs]``.
    """
    B = batch.num_pairs
    if not 1 <= parts <= B:
        raise ValueError(f"micro_batches must be in [1, {B}] (the batch's pairs), got {parts!r}")
    bounds = [round(B * k / parts) for k in range(parts + 1)]
    return [PreferenceBatch(**{f.name: getattr(batch, f.name)[lo:hi] for f in dataclasses.fields(batch)})
            for lo, hi in zip(bounds, bounds[1:])]


def accumulate(module: PrunedDPO, batch: PreferenceBatch, parts: int) -> torch.Tensor:
    """Back-propagate one step of ``batch`` as ``parts`` micro-batches; returns the step's objective (detached).

    A step's objective is a mean over its pairs, so the full batch's is the micro-batches' means weighted by their
    shares ``b_k / B``: scaling each micro-batch's objective by its share before its backward makes the summed
    gradients the full step's (exactly for exact samplers; a pruned mode draws per micro-batch, which is still an
    unbiased step). Each micro-batch's graph is freed after its backward: the peak is one micro-batch's."""
    B = batch.num_pairs
    total = None
    for micro in split_batch(batch, parts):
        objective = module.step(micro).estimate.objective * (micro.num_pairs / B)
        objective.backward()
        total = objective.detach() if total is None else total + objective.detach()
    assert total is not None
    return total


def fit_candidates(arm: Arm) -> list[Arm]:
    """Every exact variant of ``arm`` other than itself: chunked scorer, checkpointing, accumulation over 2, 4, ...
    micro-batches (powers of two up to the batch, and the whole batch one pair at a time), and combinations."""
    micro = sorted({m for m in (2 ** k for k in range(arm.batch_size.bit_length()))
                    if m <= arm.batch_size} | {1, arm.batch_size})
    out = [dataclasses.replace(arm, chunked=c, checkpointing=g, micro_batches=m)
           for c in (False, True) for g in (False, True) for m in micro]
    return [a for a in out if (a.chunked, a.checkpointing, a.micro_batches) != (arm.chunked, arm.checkpointing,
                                                                                arm.micro_batches)]


def base_of(arm: Arm) -> Arm:
    """``arm`` without its fit (the key the table of measured variants is grouped by)."""
    return dataclasses.replace(arm, chunked=False, checkpointing=False, micro_batches=1, memory_fitted=False)


def choose_fit(table: Mapping[Arm, tuple[float, float]], budget_mb: float, what: str = "the arm") -> Arm:
    """The fastest variant in ``table`` (``{variant: (peak MB, cost per step)}``) whose peak is within ``budget_mb``;
    ties go to the smaller peak, then to fewer changes.

    Raises:
        ValueError: naming ``what``, the budget and the smallest measured peak (and its variant), if nothing fits;
            or on an empty table.
    """
    if not table:
        raise ValueError(f"memory budget {budget_mb:g} MB: no measured variant of {what} to choose from")
    fitting = [a for a, (peak, _) in table.items() if peak <= budget_mb]
    if not fitting:
        smallest = min(table, key=lambda a: table[a][0])
        raise ValueError(f"memory budget {budget_mb:g} MB: no exact way of running {what} fits; the smallest measured "
                         f"peak step memory is {table[smallest][0]:.1f} MB ({smallest.fit}); raise --memory-budget-mb "
                         "to at least that")
    changes = lambda a: int(a.chunked) + int(a.checkpointing) + int(a.micro_batches > 1)  # noqa: E731
    return min(fitting, key=lambda a: (table[a][1], table[a][0], changes(a)))


def largest_peak(record: Mapping[str, Any]) -> tuple[str, float] | None:
    """The arm with the largest measured peak in a budget's ``record`` (:class:`BudgetFit`), and that peak."""
    peaks = [(name, peak) for name, peak in record["peaks"].items() if peak is not None]
    return max(peaks, key=lambda np: np[1]) if peaks else None


def budget_binds(record: Mapping[str, Any]) -> bool:
    """Whether any arm's measured peak is over the budget. When none is, the budget changed nothing: the study is
    the one without it, and it says nothing about memory (a budget larger than any arm needs)."""
    top = largest_peak(record)
    return top is not None and top[1] > record["budget_mb"]


def not_binding_text(record: Mapping[str, Any]) -> str:
    """One sentence for a budget that binds nothing (:func:`budget_binds`)."""
    top = largest_peak(record)
    largest = f"the largest: {top[0]}, {top[1]:.1f} MB" if top is not None else "none was measured"
    return (f"the memory budget of {record['budget_mb']:g} MB binds nothing: no arm's peak step memory is over it "
            f"({largest}), so every arm ran as it would without it and the verdicts say nothing about training under a "
            "memory limit")


def needs_gpu(arms: Sequence[Arm]) -> bool:
    """True when any of ``arms`` (a verdict's arm and its references) was fitted with gradient accumulation."""
    return any(a.micro_batches > 1 for a in arms)


@dataclass(frozen=True)
class BudgetFit:
    """What fitting a study's arms to a memory budget decided (:func:`fit_to_budget`)."""

    budget_mb: float
    fitted: dict[Arm, Arm]
    """Each arm over the budget (vanilla and pruned at the task's batch) -> its fastest fitting variant."""
    vanilla: Arm | None
    """The memory-fitted vanilla control (``memory_fitted=True``); ``None`` when same-batch vanilla fits as is."""
    same_batch_fits: bool
    """Whether same-batch vanilla fits as is (then it stays a reference)."""
    controls_fitting: list[Arm]
    """The cost-matched controls within the budget (the others are no reference)."""
    record: dict[str, Any]
    """For the report: budget, measure, every measured peak, the tables of variants, references, the GPU note."""


def fit_to_budget(budget_mb: float, vanilla: Arm, pruned: Sequence[Arm], controls: Sequence[Arm],
                  measured: dict[Arm, Any], measure: Callable[[list[Arm]], Mapping[Arm, Any]], clock: str,
                  measure_name: str = "") -> BudgetFit:
    """Fit a study's arms to ``budget_mb``: measure the peaks not yet in ``measured`` (``{arm: StepCost}``, updated
    in place with everything measured), then every exact variant of each arm over the budget, and choose
    (:func:`choose_fit`). ``measure(arms)`` returns ``{arm: StepCost}`` with ``peak_mb``.

    Raises:
        ValueError: if this machine cannot measure peak memory, or nothing fits for same-batch vanilla or a
            pruned arm (naming the budget and the smallest measured peak).
    """
    peak = lambda a: measured[a].peak_mb  # noqa: E731
    cost = lambda a: measured[a].on(clock)  # noqa: E731
    everyone = list(dict.fromkeys([vanilla, *pruned, *controls]))
    missing = [a for a in everyone if a not in measured or measured[a].peak_mb is None]
    if missing:
        measured.update(measure(missing))
    if any(peak(a) is None for a in everyone):
        raise ValueError(f"memory budget {budget_mb:g} MB: this machine cannot measure a step's peak memory "
                         "(its meter read nothing), so no arm can be fitted to it")
    over = [a for a in [vanilla, *pruned] if peak(a) > budget_mb]
    variants = {a: fit_candidates(a) for a in over}
    fitted, tables = {}, {}
    for a in over:  # one arm's variants at a time, round-robin among them: a refusal comes before the next arm's
        todo = [v for v in variants[a] if v not in measured]
        if todo:
            measured.update(measure(todo))
        table = {v: (peak(v), cost(v)) for v in [a, *variants[a]]}
        fitted[a] = choose_fit(table, budget_mb, a.name)
        tables[a.name] = [{"fit": v.fit, "peak_mb": p, "cost_s": c, "fits": p <= budget_mb, "chosen": v == fitted[a]}
                          for v, (p, c) in sorted(table.items(), key=lambda kv: kv[1][1])]
    fitted_vanilla = dataclasses.replace(fitted[vanilla], memory_fitted=True) if vanilla in fitted else None
    controls_fitting = [c for c in controls if peak(c) <= budget_mb]
    references = ([vanilla.name] if vanilla not in fitted else []) + [c.name for c in controls_fitting]
    references += [fitted_vanilla.name] if fitted_vanilla is not None else []
    chosen = [fitted.get(a, a) for a in [vanilla, *pruned]] + controls_fitting
    record = {
        "budget_mb": budget_mb, "measure": measure_name, "clock": clock,
        "peaks": {**{a.name: peak(a) for a in everyone},
                  **{v.name: peak(v) for v in fitted.values() if v.mode != "vanilla"},
                  **({fitted_vanilla.name: peak(fitted[vanilla])} if fitted_vanilla is not None else {})},
        "tables": tables,
        "fits": {a.name: fitted[a].fit for a in over},
        "vanilla_fit": fitted[vanilla].fit if vanilla in fitted else "as is",
        "references": references, "over": [c.name for c in controls if c not in controls_fitting],
        "gpu_needed": needs_gpu(chosen), "gpu_note": GPU_NOTE,
    }
    return BudgetFit(budget_mb, fitted, fitted_vanilla, vanilla not in fitted, controls_fitting, record)
