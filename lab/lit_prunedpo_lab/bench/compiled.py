"""``lit-prunedpo-bench --compile``: the exact default step compiled (:mod:`lit_prunedpo.compiling`) against the same
step eager, per mode, alternated in one run, with the graphs compiled and the numbers each gives.

Two modules are built from the same weights (the preset's seed, or ``--model``); one has its policy's and reference's
bodies compiled (after its layout's probe ran, eagerly). They run as two variants of
:func:`lit_prunedpo_lab.bench.variants.compare_variants`: every round, for each mode, one step of each on the same batch
with the same sampler draws, the order swapped every other round; forward, backward and AdamW's update at the
precision's autocast. The first ``warmup`` rounds are not timed: the compilation happens there (its seconds are
reported apart, as ``first step``). What is reported per mode:

* the median step seconds of each arm over the measured rounds and their ratio (eager / compiled);
* ``graphs after warm-up``: graphs compiled during the measured rounds, the recompilation the shapes caused;
* the largest difference of the objective and the largest relative difference of a parameter gradient between the
  two arms over every round (the compiled step computes the same numbers, up to kernel rounding: the two arms' weights
  drift apart by that rounding only, through the optimizer).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo_lab.bench.batches import round_batches
from lit_prunedpo_lab.bench.precision import Precision
from lit_prunedpo_lab.bench.presets import Preset
from lit_prunedpo_lab.bench.variants import Variant, compare_variants
from lit_prunedpo.compiling import CompileOptions, compile_bodies, graphs_compiled
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo.models import FromConfig, ModelSource


def preset_module(preset: Preset, source: ModelSource | None, seed: int, weights: str,
                  device: torch.device) -> PrunedDPO:
    """A module of the preset's random Llama (``seed``) or of ``source``, parameters in ``weights``, on ``device``."""
    policy = source if source is not None else FromConfig("llama", preset.model, seed=seed, dtype=weights)
    return PrunedDPO(policy=policy, beta=0.1, optimizer=partial(torch.optim.AdamW, lr=preset.lr)).to(device)


def compare_compiled(preset: Preset, modes: Sequence[str], steps: int, warmup: int, options: CompileOptions,
                     precision: Precision, device: str = "cpu", seed: int = 0, source: ModelSource | None = None,
                     data: PreferenceDataModule | None = None,
                     log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time every mode's exact step eager and compiled, alternated, over ``warmup`` + ``steps`` rounds.

    Raises:
        ValueError: ``warmup`` < 1 (the compilation must happen outside the timed rounds) or ``steps`` < 2.
    """
    dev = torch.device(device)
    eager = Variant("eager", preset_module(preset, source, seed, precision.weights, dev), precision)
    module = preset_module(preset, source, seed, precision.weights, dev)
    graphs: dict[str, int] = {"before": graphs_compiled()}
    compile_bodies([module.policy, *module.reference.models()], options, before=module.resolved_layout)
    compiled = Variant("compiled", module, precision)
    batches = [b.to(dev) for b in round_batches(preset, warmup + steps, seed, eager.module.policy, data)]

    def count(index: int) -> None:
        if index == warmup:
            graphs["warm"] = graphs_compiled()

    result = compare_variants([eager, compiled], modes, batches, warmup, seed, log, on_round=count)
    by = {(r["mode"], r["variant"]): r for r in result["rows"]}
    rows = [{"mode": m, "eager_s": by[m, "eager"]["step_time_s"], "compiled_s": by[m, "compiled"]["step_time_s"],
             "speedup": by[m, "compiled"]["vs_first"], "first_step_eager_s": by[m, "eager"]["first_step_s"],
             "first_step_compiled_s": by[m, "compiled"]["first_step_s"],
             "max_objective_difference": by[m, "compiled"]["max_objective_difference"],
             "max_grad_relative_difference": by[m, "compiled"]["max_grad_relative_difference"],
             "eager_utilisation": by[m, "eager"]["utilisation"],
             "compiled_utilisation": by[m, "compiled"]["utilisation"]} for m in modes]
    return {**result, "kind": "compile", "preset": preset.name,
            "model": preset.model if source is None else str(source), "precision": precision.name,
            "options": {**options.kwargs(), "recompile_limit": options.recompile_limit},
            "batch_size": preset.batch_size, "variant_rows": result["rows"], "rows": rows,
            "graphs": {"total": graphs_compiled() - graphs["before"],
                       "after_warmup": graphs_compiled() - graphs["warm"]}}


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
