"""Time the pruning modes side by side: same weights, same batches, alternating steps, real PrunedDPO steps.

One :class:`~lit_prunedpo.module.PrunedDPO` module and one AdamW optimizer serve every configuration
``(mode, reference, scorer, prompt)``. Each configuration has its own :class:`~lit_prunedpo.step.StepParts`
(samplers, scorer, reference source, ``shared_prompt``) and its own sampler stream; a step is the module's own
training step, ``module.step(batch, parts, generator)`` (what ``training_step`` runs), then
``objective.backward()``, ``optimizer.step()``, ``zero_grad``. The module is never changed between
configurations. Sharing one module keeps the process's resident memory that of a single training run (so peak
RSS compares across modes) and every configuration runs on the same weights: they move by one tiny AdamW step
per step, which does not change any shape or cost.

Rounds: round ``r`` runs one step of every configuration, in order, on batch ``r`` (``A B C ... A B C ...``);
the first ``warmup`` rounds are not recorded. Alternating spreads machine noise (other processes, frequency
changes) evenly over the configurations; medians and p90 summarise it. The rounds are this module's own loop, not
Lightning's ``Trainer``: a ``fit`` trains one configuration, and the rounds alternate every configuration step by
step on one module; each step is nonetheless the module's own, reached through public names only.

Memory per step: the meter of :class:`~lit_prunedpo.callbacks.PeakMemoryMonitor`
(:class:`lit_prunedpo.callbacks.PeakMemoryMeter`): on CUDA ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``; on the CPU the kernel's peak RSS (``VmHWM``) after resetting it through
``/proc/self/clear_refs``. The benchmark's meter settles first (``gc.collect()``, and glibc's ``malloc_trim(0)``)
so that memory a previous configuration freed is given back to the OS and not counted again. Both the absolute
peak and the peak above the step's starting point are reported.

The frozen reference model is built from the policy's own source (same seed: the policy's initial weights) and
shared by every online reference: the one of a ``chunked`` configuration scores with the chunked scorer too,
otherwise its ``K x V`` logits would set the peak. The cached reference is computed once, with the plain scorer,
from that frozen model, for exactly the benchmark's batches.
"""

from __future__ import annotations

import gc
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

import torch

from lit_prunedpo.batch import PreferenceBatch, collate_pairs
from lit_prunedpo.bench import cost
from lit_prunedpo.bench.peer_trl import TRLPeer
from lit_prunedpo.bench.presets import MODES, PROMPTS, REFERENCES, SCORERS, Preset
from lit_prunedpo.callbacks import PeakMemoryMeter, PeakReading
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.data.synthetic import BOS, EOS, PAD, SyntheticPreferenceData
from lit_prunedpo.execute import StepExecutor, layout_for
from lit_prunedpo.layout import PairLengths
from lit_prunedpo.models import FromConfig
from lit_prunedpo.module import PrunedDPO
from lit_prunedpo.plan import plan_step
from lit_prunedpo.reference import CachedReference, ReferenceSource, compute_reference_logps
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.step import StepOutput, StepParts

MiB = float(2**20)


@dataclass(frozen=True)
class Config:
    """One benchmarked configuration."""

    mode: str
    reference: str
    scorer: str
    prompt: str = "shared"


@dataclass
class _Record:
    """What the measured steps of one configuration produced."""

    times: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    step_peaks: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    reference_tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    flops: list[cost.StepFlops] = field(default_factory=list)
    vanilla_flops: list[cost.StepFlops] = field(default_factory=list)

    def add(self, elapsed: float, reading: PeakReading | None) -> None:
        """One measured step's time and peak memory (MiB; absolute and above the step's start)."""
        self.times.append(elapsed)
        if reading is not None:
            self.peaks.append(reading.peak / MiB)
            self.step_peaks.append(reading.above_start / MiB)


def _check_choice(name: str, values: Sequence[str], allowed: Sequence[str]) -> list[str]:
    values = list(dict.fromkeys(values))  # de-duplicate, keep order
    if not values:
        raise ValueError(f"{name} must name at least one of {list(allowed)}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{name}: unknown {bad}; choose from {list(allowed)}")
    return values


def make_batches(preset: Preset, count: int, seed: int = 0) -> list[PreferenceBatch]:
    """``count`` batches of ``preset.batch_size`` synthetic pairs (unique ``index`` values across batches)."""
    if preset.lengths is not None:
        return _length_shaped_batches(preset, count, seed)
    lo, hi = preset.response_length
    data = SyntheticPreferenceData(
        vocab_size=preset.model["vocab_size"], min_response_length=lo, max_response_length=hi,
        batch_size=preset.batch_size, seed=seed + 1,
    )
    pairs = data.make_pairs(count * preset.batch_size, stream=0)
    B = preset.batch_size
    return [collate_pairs(pairs[i * B : (i + 1) * B], pad_id=PAD) for i in range(count)]


def _from_quantiles(table: Sequence[int], u: float) -> int:
    """Inverse CDF of an evenly spaced quantile table, linearly interpolated."""
    x = u * (len(table) - 1)
    lo = min(int(x), len(table) - 2)
    return max(1, round(table[lo] + (x - lo) * (table[lo + 1] - table[lo])))


def _length_shaped_batches(preset: Preset, count: int, seed: int) -> list[PreferenceBatch]:
    """Random-token pairs whose prompt, chosen and rejected lengths are drawn (independently) from
    ``preset.lengths``, grouped by length like ``LengthGroupedSampler``: a mega-batch of at least 50 batches is
    sorted by ``prompt + chosen + rejected``, cut into batches, and ``count`` of them are taken in random order."""
    assert preset.lengths is not None
    B, V = preset.batch_size, preset.model["vocab_size"]
    g = torch.Generator().manual_seed(seed + 1)
    num_batches = max(count, 50)
    tokens = lambda n: torch.randint(3, V, (n,), generator=g).tolist()  # noqa: E731  (0-2: PAD, BOS, EOS)
    pairs = []
    for i in range(num_batches * B):
        u = torch.rand(3, generator=g).tolist()
        p, c, r = (_from_quantiles(preset.lengths[k], x) for k, x in zip(("prompt", "chosen", "rejected"), u))
        pairs.append({"prompt_ids": [BOS] + tokens(p - 1), "chosen_ids": tokens(c - 1) + [EOS],
                      "rejected_ids": tokens(r - 1) + [EOS], "index": i})
    pairs.sort(key=lambda e: len(e["prompt_ids"]) + len(e["chosen_ids"]) + len(e["rejected_ids"]))
    chosen = torch.randperm(num_batches, generator=g)[:count].tolist()
    return [collate_pairs(pairs[k * B : (k + 1) * B], pad_id=PAD) for k in chosen]


# --------------------------------------------------------------------------------------------------- step
def train_step(
    module: PrunedDPO, optimizer: torch.optim.Optimizer, batch: PreferenceBatch, parts: StepParts,
    generator: torch.Generator,
) -> StepOutput:
    """One real training step of one configuration: the module's own step with the configuration's parts, then
    backward and the optimizer."""
    out = module.step(batch, parts, generator)
    out.estimate.objective.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out


def _cached_reference(model: torch.nn.Module, batches: Sequence[PreferenceBatch]) -> ReferenceSource:
    """The reference log-probs of ``model`` on exactly ``batches``, computed once."""
    return CachedReference.from_store(compute_reference_logps(model, batches))


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default), ``0 <= q <= 1``."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


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
    peer: str | None = None,
    observe: Callable[[Config, StepOutput], None] | None = None,
) -> dict[str, Any]:
    """Run every ``(mode, reference, scorer)`` configuration, alternating, and summarise each.

    Args:
        preset: model, batch and step settings.
        modes: names from :data:`~lit_prunedpo.bench.presets.MODES`.
        references: ``online`` and/or ``cached``.
        scorers: ``plain`` (``TokenScorer``) and/or ``chunked`` (``ChunkedScorer(preset.chunk_size)``).
        prompts: ``shared`` (``shared_prompt=True``) and/or ``padded`` (``False``); speedups are against
            ``vanilla`` ``padded`` when it is measured (concatenated DPO), else against ``vanilla`` ``shared``.
        steps: measured rounds; ``None`` is the preset's.
        warmup: un-measured rounds first; ``None`` is the preset's.
        device: ``cpu`` or a CUDA device.
        seed: seed of the data and of every configuration's sampler generator.
        log: called with a progress line after every round; ``None`` is silent.
        dtype: parameter dtype of the policy and reference (``bfloat16``, ...); ``None`` is float32.
        peer: ``trl`` also times TRL's DPO step (:mod:`lit_prunedpo.bench.peer_trl`) in every round, on a copy
            of the same initial weights; each result then carries ``speedup_vs_peer``.
        observe: called with every measured step's configuration and output, after its time and memory are read
            (the scaling sweep reads the executed shapes from it); ``None`` calls nothing.

    Returns:
        The report payload: ``preset``, ``device`` and ``results`` (one dict per configuration) and context.

    Raises:
        ValueError: on an unknown mode, reference or scorer, or a step count out of range.
    """
    modes = _check_choice("modes", modes, tuple(MODES))
    references = _check_choice("references", references, REFERENCES)
    scorers = _check_choice("scorers", scorers, SCORERS)
    prompts = _check_choice("prompts", prompts, PROMPTS)
    steps = preset.steps if steps is None else steps
    warmup = preset.warmup if warmup is None else warmup
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup!r}")
    dev = torch.device(device)

    rounds = build_rounds(preset, modes, references, scorers, prompts, warmup + steps, warmup, dev, seed, dtype, peer)
    configs, batches, dims, trl = list(rounds.parts), rounds.batches, rounds.dims, rounds.peer

    # Everything built so far (transformers' modules, the model) is long-lived: freezing it keeps the per-step
    # gc.collect() of the memory meter at milliseconds instead of a full-heap scan.
    gc.collect()
    gc.freeze()
    try:
        records, peer_record = run_rounds(rounds, log, observe)
    finally:
        gc.unfreeze()

    vanilla_forward = cost.forward_flops(
        dims, 2 * preset.batch_size, batches[0].prompt_width + batches[0].response_width - 1,
        int(batches[0].response_lengths.sum()),
    )
    results = _summarise(configs, records)
    peer_row = None
    if trl is not None:
        rec = peer_record
        peer_row = {"name": "trl", "step_time_s": statistics.median(rec.times),
                    "peak_memory_mb": max(rec.peaks) if rec.peaks else None,
                    "peak_step_memory_mb": max(rec.step_peaks) if rec.step_peaks else None,
                    "tokens_executed": statistics.fmean(rec.tokens), "step_times_s": rec.times}
        for row in results:
            row["speedup_vs_peer"] = peer_row["step_time_s"] / row["step_time_s"]
    return {
        "preset": preset.name,
        "device": dev.type,
        "device_name": _device_name(dev),
        "dtype": dtype or "float32",
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
        "peer": peer_row,
    }


@dataclass
class Rounds:
    """What the alternating rounds run (:func:`run_rounds`)."""

    module: PrunedDPO
    """The one module every configuration trains (never changed by the rounds)."""
    optimizer: torch.optim.Optimizer
    """The module's optimizer, stepped after every configuration's step."""
    batches: Sequence[PreferenceBatch]
    """Round ``r`` runs batch ``r``, already on ``device``."""
    warmup: int
    """Rounds not recorded."""
    parts: dict[Config, StepParts]
    """Each configuration's samplers, scorer, reference and prompt layout, in the order a round runs them."""
    rngs: dict[Config, SamplerRNG]
    """Each configuration's sampler stream."""
    meter: PeakMemoryMeter
    """Peak memory of each step."""
    dims: cost.ModelDims
    """The policy's sizes, for the FLOP counts."""
    device: torch.device
    """Where the steps run."""
    baseline_prompt: str = "shared"
    """The prompt layout of the ``vanilla`` plan the ideal speedups compare with."""
    peer: TRLPeer | None = None
    """TRL's step, timed in every round too, or ``None``."""


def build_rounds(
    preset: Preset,
    modes: Sequence[str],
    references: Sequence[str],
    scorers: Sequence[str],
    prompts: Sequence[str],
    num_batches: int,
    warmup: int,
    dev: torch.device,
    seed: int = 0,
    dtype: str | None = None,
    peer: str | None = None,
) -> Rounds:
    """The module, optimizer, batches and every configuration's parts that :func:`run_rounds` runs (the arguments
    are :func:`run_benchmark`'s, checked; one batch per round, ``warmup`` rounds un-measured)."""
    batches = [b.to(dev) for b in make_batches(preset, num_batches, seed)]
    module = PrunedDPO(
        policy=FromConfig("llama", preset.model, seed=seed, dtype=dtype), beta=0.1,
        optimizer=partial(torch.optim.AdamW, lr=preset.lr),
    ).to(dev)
    module.train()
    optimizer = module.configure_optimizers()
    dims = cost.ModelDims.from_model(module.policy)

    # the module's own reference: a frozen copy of the initial policy, one copy for every online reference
    online = module.reference
    scorer_of = {"plain": TokenScorer(), "chunked": ChunkedScorer(preset.chunk_size)}
    sources: dict[tuple[str, str], ReferenceSource] = {}
    if "online" in references:
        sources["online", "plain"] = online
        sources["online", "chunked"] = online.with_scorer(scorer_of["chunked"])  # same frozen weights, chunked head
    if "cached" in references:
        (frozen,) = online.models()
        cached = _cached_reference(frozen, batches)
        sources["cached", "plain"] = sources["cached", "chunked"] = cached

    trl = None
    if peer is not None:
        if peer != "trl":
            raise ValueError(f"peer must be 'trl' or None, got {peer!r}")
        trl = TRLPeer(FromConfig("llama", preset.model, seed=seed, dtype=dtype).build().to(dev), batches, beta=0.1,
                      lr=preset.lr, pad_id=PAD)
    configs = [Config(m, r, s, p) for r in references for s in scorers for p in prompts for m in modes]
    samplers = {m: MODES[m]() for m in modes}
    return Rounds(
        module=module, optimizer=optimizer, batches=batches, warmup=warmup,
        parts={c: StepParts(*samplers[c.mode], scorer_of[c.scorer], sources[c.reference, c.scorer],
                            layout_for(c.prompt == "shared"))
               for c in configs},
        rngs={c: SamplerRNG(seed=seed) for c in configs},
        meter=PeakMemoryMeter(dev, settle=True), dims=dims, device=dev, baseline_prompt=_baseline_prompt(prompts),
        peer=trl,
    )


def run_rounds(
    rounds: Rounds,
    log: Callable[[str], None] | None = None,
    observe: Callable[[Config, StepOutput], None] | None = None,
) -> tuple[dict[Config, _Record], _Record]:
    """Round ``r``: one step of every configuration on batch ``r``; rounds before ``warmup`` are not recorded;
    ``observe(config, output)`` is called after each recorded step's time and memory are read.

    Returns:
        Each configuration's record, and the peer's (empty without a peer).
    """
    dev, meter = rounds.device, rounds.meter
    log = log or (lambda line: None)
    records = {c: _Record() for c in rounds.parts}
    peer, peer_record = rounds.peer, _Record()
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    for r, batch in enumerate(rounds.batches):
        measured = r >= rounds.warmup
        # the baseline's plan (vanilla draws nothing) for the ideal speedups; with a shared prompt the module's
        # margin loss skips the common prefix, as PrunedDPO.plan does
        shared = rounds.baseline_prompt == "shared"
        vanilla_plan = plan_step(batch, *MODES["vanilla"](), generator=torch.Generator(),
                                 score_common_prefix=not shared)
        vanilla = StepExecutor(layout_for(shared)).forwards(vanilla_plan.groups, PairLengths.of(batch))
        for c, parts in rounds.parts.items():
            generator = rounds.rngs[c].next()
            meter.start()
            sync()
            start = time.perf_counter()
            out = train_step(rounds.module, rounds.optimizer, batch, parts, generator)
            stats = out.stats
            sync()
            elapsed = time.perf_counter() - start
            reading = meter.stop()
            if not measured:
                continue
            rec = records[c]
            rec.add(elapsed, reading)
            rec.tokens.append(stats.tokens_executed)
            rec.reference_tokens.append(stats.reference_tokens_executed)
            rec.positions.append(stats.positions_scored)
            recompute = c.scorer == "chunked"
            rec.flops.append(cost.step_flops(out.forwards, rounds.dims, c.reference, recompute_head=recompute))
            rec.vanilla_flops.append(cost.step_flops(vanilla, rounds.dims, c.reference, recompute_head=recompute))
            if observe is not None:
                observe(c, out)
        if peer is not None:
            inputs = peer.inputs(r)
            meter.start()
            sync()
            start = time.perf_counter()
            peer.step(inputs)
            sync()
            elapsed = time.perf_counter() - start
            reading = meter.stop()
            if measured:
                peer_record.add(elapsed, reading)
                peer_record.tokens.append(int(inputs["input_ids"].numel()))  # one forward: chosen + rejected rows
        log(f"round {r + 1}/{len(rounds.batches)} ({'measured' if measured else 'warm-up'}) done")
    return records, peer_record


def _baseline_prompt(prompts: Sequence[str]) -> str:
    return "padded" if "padded" in prompts else "shared"


def _summarise(configs: Sequence[Config], records: dict[Config, _Record]) -> list[dict[str, Any]]:
    medians = {c: statistics.median(records[c].times) for c in configs}
    totals = {c: sum(records[c].times) for c in configs}
    baseline_prompt = _baseline_prompt([c.prompt for c in configs])
    results = []
    for c in configs:
        rec = records[c]
        base = Config("vanilla", c.reference, c.scorer, baseline_prompt)
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
                "step_time_p90_s": _quantile(rec.times, 0.9),
                "peak_memory_mb": max(rec.peaks) if rec.peaks else None,
                "peak_step_memory_mb": max(rec.step_peaks) if rec.step_peaks else None,
                "tokens_executed": statistics.fmean(rec.tokens),
                "reference_tokens_executed": statistics.fmean(rec.reference_tokens),
                "positions_scored": statistics.fmean(rec.positions),
                "flops_per_step": statistics.fmean(f.total for f in rec.flops),
                "ideal_speedup": ideal,
                "speedup": speedup,
                "efficiency": speedup / ideal if speedup is not None else None,
                "speedup_total_time": speedup_total,
                "step_times_s": rec.times,
            }
        )
    return results
