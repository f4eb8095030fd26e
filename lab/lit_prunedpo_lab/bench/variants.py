"""One exact step run several ways, alternated in one run: the bench's ``--compile`` (eager against compiled bodies) and
``--compare-precisions`` (float32 against ``bf16-mixed`` and ``bf16-true``).

Each :class:`Variant` is its own module built from the same initial weights (cast to its parameters' dtype), with its
own AdamW and precision stepper. Every round runs, for each mode, one step of every variant on the same batch with the
same sampler draws (one ``SamplerRNG`` seed per variant and mode); the order of the variants turns by one every round,
so that no variant always runs first. A step is forward, backward and the optimizer's update at the variant's
precision, timed to the optimizer step. The first ``warmup`` rounds are not timed (compilation happens there; their
first step is reported apart). Reported per mode and variant:

* the median step seconds over the measured rounds and the first variant's median over it (``vs first``: above 1,
  faster than the first variant);
* ``utilisation``: the cost model's FLOPs of the forwards the step ran (:func:`lit_prunedpo_lab.bench.cost.step_flops`)
  over the median step, as a share of a matmul peak of the model's MLP shape measured in the same run, before and
  after the rounds (the higher kept), in the dtype the variant's matmuls run in (:mod:`.utilisation`);
* the largest difference of its objective from the first variant's, and the largest relative difference of a
  parameter gradient (the largest absolute difference over the first variant's largest absolute value, per
  parameter): rounding of a lower precision or of other kernels, carried on by the optimizer as the weights drift.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.precision import Precision, Stepper
from lit_prunedpo_lab.bench.presets import MODES
from lit_prunedpo_lab.bench.utilisation import higher_peak, intermediate_size, measure_peak, rate_fields, typical_tokens
from lit_prunedpo.rng import SamplerRNG


@dataclass
class Variant:
    """One way of running the step: its module (own weights, from the same initial ones), precision and stepper."""

    name: str
    module: PrunedDPO
    precision: Precision
    stepper: Stepper = field(init=False)
    optimizer: torch.optim.Optimizer = field(init=False)

    def __post_init__(self) -> None:
        self.module.train()
        self.stepper = self.precision.stepper(next(self.module.policy.parameters()).device)
        self.optimizer = self.module.configure_optimizers()


@dataclass
class _Record:
    times: list[float] = field(default_factory=list)
    flops: list[cost.StepFlops] = field(default_factory=list)
    first_s: float | None = None
    objective_diff: float = 0.0
    grad_diff: float = 0.0


def _step(variant: Variant, batch: Any, rng: SamplerRNG) -> tuple[float, float, list[torch.Tensor | None], Any]:
    """One timed step: its seconds, its objective, a copy of the gradients (taken after the clock), its forwards."""
    module, cuda = variant.module, batch.response_ids.is_cuda
    module.run_state.sampler_rng = rng
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with variant.stepper.forward():
        out = module.step(batch)
    variant.stepper.backward(out.estimate.objective)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    grads = [p.grad.detach().float().clone() if p.grad is not None else None for p in module.policy.parameters()]
    variant.stepper.step(variant.optimizer)
    return seconds, float(out.estimate.objective.detach()), grads, out.forwards


def _grad_difference(a: list[torch.Tensor | None], b: list[torch.Tensor | None]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        if x is not None and y is not None and float(x.abs().max()) > 0:
            worst = max(worst, float((x - y).abs().max()) / float(x.abs().max()))
    return worst


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _peaks(variants: Sequence[Variant], batches: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """A matmul peak of the model's MLP shape per compute dtype the variants run in."""
    policy = variants[0].module.policy
    hidden = policy.get_input_embeddings().embedding_dim
    device = next(policy.parameters()).device
    dtypes = {_name(v.precision.compute_dtype): v.precision.compute_dtype for v in variants}
    return {name: measure_peak(typical_tokens(batches), hidden, intermediate_size(policy, hidden), dtype, device)
            for name, dtype in dtypes.items()}


def compare_variants(variants: Sequence[Variant], modes: Sequence[str], batches: Sequence[Any], warmup: int,
                     seed: int = 0, log: Callable[[str], None] | None = None,
                     on_round: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run every mode's step in every variant over ``batches`` (the first ``warmup`` untimed), alternated.

    ``on_round(index)`` is called before each round (the compile comparison counts graphs there).

    Raises:
        ValueError: fewer than two variants, ``warmup`` < 1 or fewer than two measured rounds.
    """
    if len(variants) < 2 or warmup < 1 or len(batches) - warmup < 2:
        raise ValueError(f"a comparison needs two variants or more, --warmup >= 1 (compilation and first-call costs "
                         f"are not timed) and --steps >= 2; got {len(variants)} variants, warmup {warmup}, "
                         f"{len(batches) - warmup} measured rounds")
    log = log or (lambda line: None)
    dims = cost.ModelDims.from_model(variants[0].module.policy)
    before = _peaks(variants, batches)
    records = {(v.name, m): _Record() for v in variants for m in modes}
    rngs = {key: SamplerRNG(seed=seed) for key in records}
    for index, batch in enumerate(batches):
        if on_round is not None:
            on_round(index)
        order = [variants[(index + k) % len(variants)] for k in range(len(variants))]
        for mode in modes:
            results = {}
            for variant in order:
                variant.module.use_samplers(*MODES[mode]())
                results[variant.name] = _step(variant, batch, rngs[variant.name, mode])
                rec = records[variant.name, mode]
                rec.first_s = rec.first_s if rec.first_s is not None else results[variant.name][0]
                if index >= warmup:
                    rec.times.append(results[variant.name][0])
                    rec.flops.append(cost.step_flops(results[variant.name][3], dims, "online"))
            base = results[variants[0].name]
            for variant in variants[1:]:
                rec, mine = records[variant.name, mode], results[variant.name]
                rec.objective_diff = max(rec.objective_diff, abs(mine[1] - base[1]))
                rec.grad_diff = max(rec.grad_diff, _grad_difference(base[2], mine[2]))
        log(f"round {index + 1}/{len(batches)}{' (warm-up)' if index < warmup else ''}")
    peaks = {name: higher_peak(before[name], after) for name, after in _peaks(variants, batches).items()}
    rows = []
    for mode in modes:
        first = statistics.median(records[variants[0].name, mode].times)
        for variant in variants:
            rec = records[variant.name, mode]
            median = statistics.median(rec.times)
            peak = peaks[_name(variant.precision.compute_dtype)]["flops_per_s"]
            rows.append({"mode": mode, "variant": variant.name, "precision": variant.precision.name,
                         "step_time_s": median, "vs_first": first / median, "first_step_s": rec.first_s,
                         "max_objective_difference": rec.objective_diff,
                         "max_grad_relative_difference": rec.grad_diff, **rate_fields(rec.flops, median, peak)})
    return {"variants": [v.name for v in variants], "modes": list(modes), "rows": rows, "peaks": peaks,
            "rounds": {"warmup": warmup, "measured": len(batches) - warmup}, "threads": torch.get_num_threads(),
            "device": str(next(variants[0].module.policy.parameters()).device), "torch": torch.__version__}


def to_markdown(payload: dict[str, Any], title: str) -> str:
    """The comparison as one table (a row per mode and variant) and a line on the peaks."""
    lines = [f"{title} ({payload['threads']} thread(s), {payload['device']}, torch {payload['torch']}); medians over "
             f"{payload['rounds']['measured']} alternated rounds after {payload['rounds']['warmup']} warm-up round(s).",
             "", "| mode | variant | step s | vs first | utilisation | first step s | max objective diff | "
             "max grad rel diff |", "|---|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        share = "-" if r["utilisation"] is None else f"{r['utilisation']:.1%}"
        lines.append(f"| {r['mode']} | {r['variant']} | {r['step_time_s']:.4f} | {r['vs_first']:.2f}x | {share} | "
                     f"{r['first_step_s']:.3f} | {r['max_objective_difference']:.2e} | "
                     f"{r['max_grad_relative_difference']:.2e} |")
    lines.append("")
    for dtype, peak in payload["peaks"].items():
        readings = ", ".join(f"{x / 1e9:.0f}" for x in peak.get("readings_flops_per_s", []))
        lines.append(f"- {dtype} matmul peak {peak['flops_per_s'] / 1e9:.0f} GFLOP/s ({peak['shape']}; readings "
                     f"before, after: {readings})")
    return "\n".join(lines)
