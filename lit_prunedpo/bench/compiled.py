"""``lit-prunedpo-bench --compile``: the exact default step compiled (:mod:`lit_prunedpo.compiling`) against the same
step eager, per mode, alternated in one run, with the graphs compiled and the numbers each gives.

Two modules are built from the same weights (the preset's seed, or ``--model``); one has its policy's and reference's
bodies compiled. Every round runs, for each mode, one step of each (eager first, then compiled, the order swapped
every other round), on the same batch, with the same sampler draws (one ``SamplerRNG`` seed per arm and mode); each
step is forward, backward and AdamW's update at the precision's autocast. The first ``warmup`` rounds are not timed:
the compilation happens there (its seconds are reported apart, as ``first step``). What is reported per mode:

* the median step seconds of each arm over the measured rounds and their ratio (eager / compiled);
* ``graphs after warm-up``: graphs compiled during the measured rounds, the recompilation the shapes caused;
* the largest difference of the objective and the largest relative difference of a parameter gradient between the
  two arms over every round (the compiled step computes the same numbers, up to kernel rounding: the two arms' weights
  drift apart by that rounding only, through the optimizer).
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any, Callable, Sequence

import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.bench.batches import round_batches
from lit_prunedpo.bench.precision import Precision, Stepper
from lit_prunedpo.bench.presets import MODES, Preset
from lit_prunedpo.compiling import CompileOptions, compile_bodies, graphs_compiled
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo.models import FromConfig, ModelSource
from lit_prunedpo.rng import SamplerRNG


def _module(preset: Preset, source: ModelSource | None, seed: int, precision: Precision,
            device: torch.device) -> PrunedDPO:
    policy = source if source is not None else FromConfig("llama", preset.model, seed=seed, dtype=precision.weights)
    module = PrunedDPO(policy=policy, beta=0.1, optimizer=partial(torch.optim.AdamW, lr=preset.lr)).to(device)
    module.train()
    return module


def _step(module: PrunedDPO, optimizer: torch.optim.Optimizer, stepper: Stepper, batch: Any,
          rng: SamplerRNG) -> tuple[float, float, list[torch.Tensor]]:
    """One timed step; returns its seconds, its objective and a copy of the gradients (taken after the clock)."""
    module.sampler_rng = rng
    if batch.response_ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with stepper.forward():
        objective = module.step(batch).estimate.objective
    stepper.backward(objective)
    grads = [p.grad for p in module.policy.parameters()]
    if batch.response_ids.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    kept = [g.detach().clone() if g is not None else None for g in grads]
    stepper.step(optimizer)
    return seconds, float(objective.detach()), kept


def _grad_difference(a: list[torch.Tensor | None], b: list[torch.Tensor | None]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        if x is None or y is None:
            continue
        scale = float(x.abs().max())
        if scale > 0:
            worst = max(worst, float((x - y).abs().max()) / scale)
    return worst


def compare_compiled(preset: Preset, modes: Sequence[str], steps: int, warmup: int, options: CompileOptions,
                     precision: Precision, device: str = "cpu", seed: int = 0, source: ModelSource | None = None,
                     data: PreferenceDataModule | None = None,
                     log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time every mode's exact step eager and compiled, alternated, over ``warmup`` + ``steps`` rounds.

    Raises:
        ValueError: ``warmup`` < 1 (the compilation must happen outside the timed rounds) or ``steps`` < 2.
    """
    if warmup < 1 or steps < 2:
        raise ValueError(f"--compile needs --warmup >= 1 (the compilation is not timed) and --steps >= 2, got "
                         f"warmup {warmup}, steps {steps}")
    log = log or (lambda line: None)
    dev = torch.device(device)
    arms = {"eager": _module(preset, source, seed, precision, dev),
            "compiled": _module(preset, source, seed, precision, dev)}
    graphs_before = graphs_compiled()
    compile_bodies([arms["compiled"].policy, *arms["compiled"].reference.models()], options,
                   before=arms["compiled"].resolved_layout)
    optimizers = {name: m.configure_optimizers() for name, m in arms.items()}
    steppers = {name: precision.stepper(dev) for name in arms}
    batches = [b.to(dev) for b in round_batches(preset, warmup + steps, seed, arms["eager"].policy, data)]
    rngs = {(name, mode): SamplerRNG(seed=seed) for name in arms for mode in modes}
    times: dict[tuple[str, str], list[float]] = {key: [] for key in rngs}
    first: dict[tuple[str, str], float] = {}
    loss_diff = {mode: 0.0 for mode in modes}
    grad_diff = {mode: 0.0 for mode in modes}
    graphs_at_warm = 0
    for index, batch in enumerate(batches):
        if index == warmup:
            graphs_at_warm = graphs_compiled()
        for mode in modes:
            results = {}
            order = ("eager", "compiled") if index % 2 == 0 else ("compiled", "eager")
            for name in order:
                arms[name].use_samplers(*MODES[mode]())
                results[name] = _step(arms[name], optimizers[name], steppers[name], batch, rngs[name, mode])
                first.setdefault((name, mode), results[name][0])
                if index >= warmup:
                    times[name, mode].append(results[name][0])
            loss_diff[mode] = max(loss_diff[mode], abs(results["eager"][1] - results["compiled"][1]))
            grad_diff[mode] = max(grad_diff[mode], _grad_difference(results["eager"][2], results["compiled"][2]))
        log(f"round {index + 1}/{len(batches)}{' (warm-up)' if index < warmup else ''}: graphs so far "
            f"{graphs_compiled() - graphs_before}")
    rows = []
    for mode in modes:
        eager, compiled = (statistics.median(times[name, mode]) for name in ("eager", "compiled"))
        rows.append({"mode": mode, "eager_s": eager, "compiled_s": compiled, "speedup": eager / compiled,
                     "first_step_eager_s": first["eager", mode], "first_step_compiled_s": first["compiled", mode],
                     "max_objective_difference": loss_diff[mode], "max_grad_relative_difference": grad_diff[mode]})
    return {"kind": "compile", "preset": preset.name, "model": preset.model if source is None else str(source),
            "precision": precision.name, "device": str(dev), "threads": torch.get_num_threads(),
            "options": {**options.kwargs(), "recompile_limit": options.recompile_limit},
            "rounds": {"warmup": warmup, "measured": steps}, "batch_size": preset.batch_size,
            "graphs": {"total": graphs_compiled() - graphs_before, "after_warmup": graphs_compiled() - graphs_at_warm},
            "rows": rows, "torch": torch.__version__}


def to_markdown(payload: dict[str, Any]) -> str:
    """The comparison as a table and a line on the graphs."""
    lines = [f"Compiled vs eager, exact steps ({payload['preset']}, {payload['precision']}, {payload['threads']} "
             f"thread(s), {payload['device']}, torch {payload['torch']}); medians over {payload['rounds']['measured']} "
             f"alternated rounds after {payload['rounds']['warmup']} warm-up (compilation) round(s); options "
             f"{payload['options']}.", "",
             "| mode | eager s | compiled s | speedup | first step eager s | first step compiled s | "
             "max objective diff | max grad rel diff |", "|---|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        lines.append(f"| {r['mode']} | {r['eager_s']:.4f} | {r['compiled_s']:.4f} | {r['speedup']:.2f}x | "
                     f"{r['first_step_eager_s']:.3f} | {r['first_step_compiled_s']:.1f} | "
                     f"{r['max_objective_difference']:.2e} | {r['max_grad_relative_difference']:.2e} |")
    graphs = payload["graphs"]
    lines += ["", f"Graphs compiled: {graphs['total']} in all, {graphs['after_warmup']} after the warm-up rounds "
                  f"(recompilation during the measured rounds)."]
    return "\n".join(lines)
