"""Time the pruning modes side by side: same weights, same batches, alternating steps, real PrunedDPO steps.

:func:`run_benchmark` checks the configurations ``(mode, reference, scorer, prompt)`` asked for, builds and runs
the alternating rounds (:mod:`lit_prunedpo_lab.bench.rounds`: one module and one AdamW optimizer serve every
configuration, round ``r`` runs one step of every configuration on batch ``r``, the first ``warmup`` rounds
unrecorded) on synthetic batches of the preset's shape (:mod:`lit_prunedpo_lab.bench.batches`) or on ``--data``'s, with
the preset's random model or ``--model``, and summarises each configuration: median and p90 step time, peak memory,
tokens executed, FLOPs, utilisation of a peak measured right before the rounds (:mod:`.utilisation`),
and speedups against ``vanilla`` and each TRL peer; the payload names the model and data measured and the load the
rounds ran under (:mod:`lit_prunedpo_lab.bench.load`).

Sharing one module keeps the process's memory that of a single training run (so peak memory compares across
modes) and every configuration runs on the same weights: they move by one tiny AdamW step per step, which does not
change any shape or cost. Alternating spreads machine noise (other processes, frequency changes) evenly over the
configurations; medians and p90 summarise it.
"""

from __future__ import annotations

import gc
import platform
import statistics
import sys
from dataclasses import asdict
from typing import Any, Callable, Sequence

import torch

from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.load import LoadMeter
from lit_prunedpo_lab.bench.memory_model import LayerDims
from lit_prunedpo_lab.bench.own_data import DataSpec, data_identity
from lit_prunedpo_lab.bench.own_model import model_identity, preset_identity
from lit_prunedpo_lab.bench.presets import MODES, PROMPTS, REFERENCES, SCORERS, Preset
from lit_prunedpo_lab.bench.peer_trl import PEERS
from lit_prunedpo_lab.bench.rounds import (Config, Rounds, StepRecord, baseline_prompt, build_rounds, peer_names,
                                           run_rounds)
from lit_prunedpo_lab.bench.utilisation import (higher_peak, intermediate_size, measure_peak, rate_fields,
                                             typical_tokens)
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo.layout import SharedPromptLayout
from lit_prunedpo.models import ModelSource
from lit_prunedpo.intervals import quantile
from lit_prunedpo.step.io import StepOutput


def _check_choice(name: str, values: Sequence[str], allowed: Sequence[str]) -> list[str]:
    values = list(dict.fromkeys(values))  # de-duplicate, keep order
    if not values:
        raise ValueError(f"{name} must name at least one of {list(allowed)}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{name}: unknown {bad}; choose from {list(allowed)}")
    return values


def _check_configs(modes: Sequence[str], references: Sequence[str], scorers: Sequence[str],
                   prompts: Sequence[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """The configurations' names, each checked and de-duplicated (:func:`_check_choice`)."""
    return (_check_choice("modes", modes, tuple(MODES)), _check_choice("references", references, REFERENCES),
            _check_choice("scorers", scorers, SCORERS), _check_choice("prompts", prompts, PROMPTS))


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} torch threads"


def run_benchmark(
    preset: Preset,
    modes: Sequence[str] = tuple(MODES),
    references: Sequence[str] = REFERENCES,
    scorers: Sequence[str] = SCORERS,
    prompts: Sequence[str] = ("shared",),
    steps: int | None = None,
    warmup: int | None = None,
    device: str = "cpu",
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    dtype: str | None = None,
    peer: str | Sequence[str] | None = None,
    observe: Callable[[Config, StepOutput], None] | None = None,
    source: ModelSource | None = None,
    data: DataSpec | None = None,
    precision: str | None = None,
) -> dict[str, Any]:
    """Run every ``(mode, reference, scorer)`` configuration, alternating, and summarise each.

    Args:
        preset: model, batch and step settings.
        modes: names from :data:`~lit_prunedpo_lab.bench.presets.MODES`.
        references: ``online`` and/or ``cached``.
        scorers: ``plain`` (``TokenScorer``) and/or ``chunked`` (``ChunkedScorer(preset.chunk_size)``).
        prompts: ``shared`` (``shared_prompt=True``) and/or ``padded`` (``False``); speedups are against
            ``vanilla`` ``padded`` when it is measured (concatenated DPO), else against ``vanilla`` ``shared``.
        steps: measured rounds; ``None`` is the preset's.
        warmup: un-measured rounds first; ``None`` is the preset's.
        device: ``cpu`` or a CUDA device.
        seed, log: seed of the data and the sampler generators; called with a progress line per round (or None).
        dtype, precision: parameter dtype (older) or Lightning's precision (:mod:`~lit_prunedpo_lab.bench.precision`).
        peer: TRL peers (names, or comma-separated; :data:`~lit_prunedpo_lab.bench.peer_trl.PEERS`), each timed in
            every round on a copy of the same initial weights; results carry ``speedup_vs_<peer>``
            (``speedup_vs_peer``: against ``trl``).
        observe: called with every measured step's configuration and output, after its time and memory are read
            (the scaling sweep reads the executed shapes from it); ``None`` calls nothing.
        source: the model (``--model``, :mod:`~lit_prunedpo_lab.bench.own_model`) instead of the preset's random one;
            the preset then gives the step counts, chunk size, learning rate (and, without ``data``, the batches).
        data: the pairs (``--data``, :mod:`~lit_prunedpo_lab.bench.own_data`) instead of the preset's synthetic ones.

    Returns:
        The payload: ``preset``, ``device``, ``results``, ``peers``, ``peak_flops_per_s``, ``load``, ``model``, context.

    Raises:
        ValueError: an unknown mode, reference, scorer, peer or precision (or a ``dtype`` unlike it), a step count
            out of range, data not fitting the model, ``--model`` not running the shared prompt exactly if asked.
    """
    modes, references, scorers, prompts = _check_configs(modes, references, scorers, prompts)
    peers, (steps, warmup) = peer_names(peer), _step_counts(preset, steps, warmup)
    module = data.data_module() if data is not None else None
    rounds = build_rounds(preset, modes, references, scorers, prompts, warmup + steps, warmup, torch.device(device),
                          seed, dtype, peers, source=source, data=module, precision=precision)
    measured = _measured(preset, seed, rounds, prompts, source, data, module)  # before any step: the initial weights
    before = _peak(rounds)  # right before the rounds, on the machine as they find it, and again after them
    records, peer_records, load = _run_frozen(rounds, log, observe)
    peak = higher_peak(before, _peak(rounds))
    results = _summarise(list(rounds.parts), records, peak["flops_per_s"])
    peer_rows = _peer_rows(peer_records, results, peak)
    return {**_payload(preset, rounds, steps, warmup, results, peer_rows, peak), "load": load, **measured}


def _peer_rows(peer_records: dict[str, Any], results: list[dict[str, Any]],
               peak: dict[str, Any]) -> list[dict[str, Any]]:
    return [_peer_row(name, rec, results, peak["flops_per_s"]) for name, rec in peer_records.items()]


def _peak(rounds: Rounds) -> dict[str, Any]:
    """The peak FLOP/s of this run: a matmul of the policy's MLP shape on a typical batch's tokens, on its device,
    in the dtype the steps' matmuls run in (the autocast's under ``*-mixed``, else the parameters')
    (:func:`~lit_prunedpo_lab.bench.utilisation.measure_peak`)."""
    policy = rounds.module.policy
    hidden = rounds.dims.hidden_size
    autocast = rounds.precision.autocast is not None
    dtype = rounds.precision.compute_dtype if autocast else next(policy.parameters()).dtype
    return measure_peak(typical_tokens(rounds.batches), hidden, intermediate_size(policy, hidden), dtype,
                        rounds.device)


def _measured(preset: Preset, seed: int, rounds: Rounds, prompts: Sequence[str], source: ModelSource | None,
              data: DataSpec | None, module: PreferenceDataModule | None) -> dict[str, Any]:
    """What the payload records of the model and the data measured (:mod:`~lit_prunedpo_lab.bench.own_model`,
    :mod:`~lit_prunedpo_lab.bench.own_data`) and the memory model's sizes of the model (``None`` for a config without
    Llama-style field names); for ``--model``, the layout training's set-up check runs it with.

    Raises:
        ValueError: ``shared`` is among ``prompts`` and the set-up check does not run the model with the shared
            prompt (the layout it would run instead is named).
    """
    policy = rounds.module.policy
    try:
        layer_dims: dict[str, int] | None = asdict(LayerDims.from_model(policy))
    except (AttributeError, TypeError):  # e.g. GPT-2's config has no intermediate_size
        layer_dims = None
    out: dict[str, Any] = {
        "model": model_identity(source, policy) if source is not None else preset_identity(preset.name, seed, policy),
        "data": data_identity(module, data) if data is not None and module is not None else None,
        "layer_dims": layer_dims,
    }
    if source is not None:
        layout = rounds.module.resolved_layout()  # the set-up conformance check against the model's plain forward
        if "shared" in prompts and not isinstance(layout, SharedPromptLayout):
            raise ValueError(f"--model {out['model'].get('name_or_path')}: the set-up check runs it with "
                             f"{type(layout).__name__}, not the shared prompt: give --prompts padded")
        out["layout"] = type(layout).__name__
    return out


def _step_counts(preset: Preset, steps: int | None, warmup: int | None) -> tuple[int, int]:
    """The measured and warm-up rounds (``None``: the preset's).

    Raises:
        ValueError: on fewer than 1 measured round or a negative warm-up.
    """
    steps = preset.steps if steps is None else steps
    warmup = preset.warmup if warmup is None else warmup
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup!r}")
    return steps, warmup


def _run_frozen(rounds: Rounds, log: Callable[[str], None] | None,
                observe: Callable[[Config, StepOutput], None] | None,
                ) -> tuple[dict[Config, StepRecord], dict[str, StepRecord], dict[str, Any]]:
    """:func:`~lit_prunedpo_lab.bench.rounds.run_rounds` with everything built so far frozen out of the collector, and
    the load the rounds ran under (:mod:`~lit_prunedpo_lab.bench.load`, the load average sampled after every round)."""
    # Everything built so far (transformers' modules, the model) is long-lived: freezing it keeps the per-step
    # gc.collect() of the memory meter at milliseconds instead of a full-heap scan.
    gc.collect()
    gc.freeze()
    meter = LoadMeter()

    def each_round(line: str) -> None:  # run_rounds logs once per round: the load is sampled there
        meter.sample()
        if log is not None:
            log(line)

    try:
        records, peer_records = run_rounds(rounds, each_round, observe)
        return records, peer_records, meter.record()
    finally:
        gc.unfreeze()


def _peer_row(name: str, rec: StepRecord, results: list[dict[str, Any]], peak: float) -> dict[str, Any]:
    """A peer's row; every configuration's result gets its ``speedup_vs_<name>`` (and ``trl``'s its
    ``speedup_vs_peer`` too, the key readers of a single peer know)."""
    step_time = statistics.median(rec.times)
    peer_row = {"name": name, "reference": PEERS[name], "step_time_s": step_time,
                "peak_memory_mb": max(rec.peaks) if rec.peaks else None,
                "peak_step_memory_mb": max(rec.step_peaks) if rec.step_peaks else None,
                "tokens_executed": statistics.fmean(rec.tokens),
                "reference_tokens_executed": statistics.fmean(rec.reference_tokens),
                "positions_scored": statistics.fmean(rec.positions),
                **rate_fields(rec.flops, step_time, peak), "losses": rec.losses, "step_times_s": rec.times}
    for row in results:
        row[f"speedup_vs_{name}"] = step_time / row["step_time_s"]
        if name == "trl":
            row["speedup_vs_peer"] = row["speedup_vs_trl"]
    return peer_row


def _payload(preset: Preset, rounds: Rounds, steps: int, warmup: int, results: list[dict[str, Any]],
             peer_rows: list[dict[str, Any]], peak: dict[str, Any]) -> dict[str, Any]:
    """The report payload: the results, the peers' rows (``trl``'s also as ``peer``), the peak their utilisations
    divide by and the context they were measured in."""
    dev, dims, batches = rounds.device, rounds.dims, rounds.batches
    vanilla_forward = cost.forward_flops(
        dims, 2 * batches[0].num_pairs, batches[0].prompt_width + batches[0].response_width - 1,
        int(batches[0].response_lengths.sum()),
    )
    return {
        "preset": preset.name,
        "device": dev.type,
        "device_name": _device_name(dev),
        "dtype": rounds.precision.weights,
        "precision": rounds.precision.name,
        "autocast_dtype": rounds.precision.autocast,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "steps": steps,
        "warmup": warmup,
        "memory_measure": rounds.meter.measure,
        "preset_config": {**asdict(preset), "response_length": list(preset.response_length)},
        "model_dims": asdict(dims),
        "head_share": vanilla_forward.head_share,
        "results": results,
        "peers": peer_rows,
        "peer": next((row for row in peer_rows if row["name"] == "trl"), None),
        "peak_flops_per_s": peak["flops_per_s"],
        "peak_measure": peak,
    }


def _summarise(configs: Sequence[Config], records: dict[Config, StepRecord], peak: float) -> list[dict[str, Any]]:
    """Per configuration: its step times (median, p90), peak memory, tokens and FLOPs per step, utilisation of
    ``peak``, and its speedups against ``vanilla`` with the same reference and scorer (median and total time; ideal,
    from the FLOPs)."""
    medians = {c: statistics.median(records[c].times) for c in configs}
    totals = {c: sum(records[c].times) for c in configs}
    baseline = baseline_prompt([c.prompt for c in configs])
    results = []
    for c in configs:
        rec = records[c]
        base = Config("vanilla", c.reference, c.scorer, baseline)
        ideal = cost.ideal_speedup(rec.vanilla_flops, rec.flops)
        speedup = medians[base] / medians[c] if base in medians else None
        # Ratio of total times over the same batches: the like-for-like counterpart of the FLOP ratio (which
        # sums over the batches too); the median ratio is the robust headline number.
        speedup_total = totals[base] / totals[c] if base in totals else None
        results.append(
            {
                "mode": c.mode,
                "reference": c.reference,
                "scorer": c.scorer,
                "prompt": c.prompt,
                "step_time_s": medians[c],
                "step_time_p90_s": quantile(rec.times, 0.9),
                "peak_memory_mb": max(rec.peaks) if rec.peaks else None,
                "peak_step_memory_mb": max(rec.step_peaks) if rec.step_peaks else None,
                "tokens_executed": statistics.fmean(rec.tokens),
                "reference_tokens_executed": statistics.fmean(rec.reference_tokens),
                "positions_scored": statistics.fmean(rec.positions),
                "flops_per_step": statistics.fmean(f.total for f in rec.flops),
                **rate_fields(rec.flops, medians[c], peak),
                "ideal_speedup": ideal,
                "speedup": speedup,
                "efficiency": speedup / ideal if speedup is not None else None,
                "speedup_total_time": speedup_total,
                "losses": rec.losses,
                "step_times_s": rec.times,
            }
        )
    return results
