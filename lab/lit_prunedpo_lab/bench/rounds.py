"""The benchmark's rounds: every configuration's real training step, alternating on one module and one batch.

One :class:`~lit_prunedpo.module.PrunedDPO` module and one AdamW optimizer serve every configuration
``(mode, reference, scorer, prompt)``. Each configuration has its own :class:`~lit_prunedpo.step.io.StepParts`
(samplers, scorer, reference source, ``shared_prompt``) and its own sampler stream; a step is the module's own
training step, ``module.step(batch, parts, generator)`` (what ``training_step`` runs), then
``objective.backward()``, ``optimizer.step()``, ``zero_grad`` (:func:`train_step`). The module is never changed
between configurations.

Rounds (:func:`run_rounds`): round ``r`` runs one step of every configuration, in order, on batch ``r``
(``A B C ... A B C ...``); the first ``warmup`` rounds are not recorded. The rounds are this module's own loop, not
Lightning's ``Trainer``: a ``fit`` trains one configuration, and the rounds alternate every configuration step by
step on one module; each step is nonetheless the module's own, reached through public names only.

Memory per step: :class:`lit_prunedpo.callbacks.PeakMemoryMeter`, settled (``gc.collect()`` first), the same for
every configuration and every TRL peer: on CUDA ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``; on the CPU the peak of live tensor storage above the step's start (``"cpu_tensors"``:
the CPU allocator's events, the same quantity as CUDA's), not the RSS, which also holds freed pages the C
allocator keeps and moves with what ran before. That CPU meter records every operator, so it would slow the step it
measures: the rounds are then timed without it, and **memory rounds** follow them (:func:`memory_rounds`), untimed:
every measured round again, each configuration on the same batch with its sampler stream rewound to the same step
(the same draws), each peer on the same batch. Where the meter reads the process's peak (CUDA, or a meter given the
RSS mode) the measured steps themselves are metered, and both the absolute peak and the peak above the step's start
are recorded; the CPU tensor meter records the peak above the start only.

The frozen reference model is the module's own copy of the policy's initial weights, shared by every online
reference: the one of a ``chunked`` configuration scores with the chunked scorer too, otherwise its ``K x V``
logits would set the peak. The cached reference is computed once, with the plain scorer, from that frozen model,
for exactly the benchmark's batches (:func:`build_rounds`). Each TRL peer (:mod:`.peer_trl`) trains
another copy of those weights, after the configurations in every round, on the same batch; ``trl-online`` runs a
further frozen copy as its reference.

Precision (``--precision``, :mod:`lit_prunedpo_lab.bench.precision`): every configuration's step and every peer's runs
its forward, up to the loss, under the same autocast (``*-mixed``), backward and the optimizer outside it, as
Lightning's precision plugin runs ``training_step``, in the timed and the memory rounds alike; the cached reference
is built under it too, as training builds it under the trainer's precision context.

The policy is the preset's random Llama or ``--model``'s (:mod:`lit_prunedpo_lab.bench.own_model`); the batches the
preset's synthetic ones or ``--data``'s, the data module's own (:mod:`lit_prunedpo_lab.bench.own_data`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence, TypeVar

import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.batches import round_batches
from lit_prunedpo_lab.bench.peer_trl import PEERS, TRLPeer, make_peers
from lit_prunedpo_lab.bench.precision import Precision, Stepper, resolve_precision
from lit_prunedpo_lab.bench.presets import MODES, Preset
from lit_prunedpo_lab.bench.utilisation import peer_step_flops
from lit_prunedpo.callbacks import PeakMemoryMeter, PeakReading
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.data import PAD, PreferenceDataModule
from lit_prunedpo.step.execute import StepExecutor, StepForwards, layout_for
from lit_prunedpo.layout import PairLengths
from lit_prunedpo.models import FromConfig, ModelSource
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.reference import CachedReference, ReferenceSource, compute_reference_logps
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.step.io import StepOutput, StepParts

MiB = float(2**20)
T = TypeVar("T")
FLOAT32 = resolve_precision(None, None)


@dataclass(frozen=True)
class Config:
    """One benchmarked configuration."""

    mode: str
    reference: str
    scorer: str
    prompt: str = "shared"


@dataclass
class StepRecord:
    """What the measured steps of one configuration produced."""

    times: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    step_peaks: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    reference_tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    flops: list[cost.StepFlops] = field(default_factory=list)
    vanilla_flops: list[cost.StepFlops] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def add(self, elapsed: float, reading: PeakReading | None) -> None:
        """One measured step's time and peak memory (MiB; absolute and above the step's start)."""
        self.times.append(elapsed)
        self.add_memory(reading)

    def add_memory(self, reading: PeakReading | None) -> None:
        """One step's peak memory: above the step's start, and the absolute peak where the meter reads one."""
        if reading is not None:
            if reading.absolute:
                self.peaks.append(reading.peak / MiB)
            self.step_peaks.append(reading.above_start / MiB)


def train_step(
    module: PrunedDPO, optimizer: torch.optim.Optimizer, batch: PreferenceBatch, parts: StepParts,
    generator: torch.Generator, stepper: Stepper | None = None,
) -> StepOutput:
    """One real training step of one configuration: the module's own step with the configuration's parts (under
    ``stepper``'s autocast, as Lightning runs ``training_step``), then backward and the optimizer outside it
    (``None``: float32's plain backward and step)."""
    stepper = stepper or FLOAT32.stepper(torch.device("cpu"))
    with stepper.forward():
        out = module.step(batch, parts, generator)
    stepper.backward(out.estimate.objective)
    stepper.step(optimizer)
    return out


def _cached_reference(model: torch.nn.Module, batches: Sequence[PreferenceBatch], stepper: Stepper) -> ReferenceSource:
    """The reference log-probs of ``model`` on exactly ``batches``, computed once, under the step's autocast (as
    the cache's build runs under the trainer's precision context)."""
    return CachedReference.from_store(compute_reference_logps(model, batches, forward_context=stepper.forward))


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
    peers: dict[str, TRLPeer] = field(default_factory=dict)
    """TRL's steps (:data:`~lit_prunedpo_lab.bench.peer_trl.PEERS`), timed in every round too, in this order."""
    precision: Precision = FLOAT32
    """Every step's precision (:mod:`~lit_prunedpo_lab.bench.precision`), each peer's too."""
    stepper: Stepper | None = None
    """How the module's steps run at :attr:`precision` (``None``: float32)."""

    @property
    def peer(self) -> TRLPeer | None:
        """The ``trl`` peer (precomputed reference), else the first peer, else ``None``."""
        return self.peers.get("trl", next(iter(self.peers.values()), None))


def peer_names(peer: str | Sequence[str] | None) -> list[str]:
    """The peers asked for: ``None``, a comma-separated string or names, de-duplicated in order.

    Raises:
        ValueError: on a name not in :data:`~lit_prunedpo_lab.bench.peer_trl.PEERS`, naming the argument.
    """
    if peer is None:
        return []
    names = [p.strip() for p in peer.split(",")] if isinstance(peer, str) else list(peer)
    names = list(dict.fromkeys(n for n in names if n))
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise ValueError(f"peer: unknown {bad}; choose from {list(PEERS)}")
    return names


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
    peer: str | Sequence[str] | None = None,
    source: ModelSource | None = None,
    data: PreferenceDataModule | None = None,
    precision: str | None = None,
) -> Rounds:
    """The module, optimizer, batches and every configuration's parts that :func:`run_rounds` runs (the arguments
    are :func:`run_benchmark`'s, checked; one batch per round, ``warmup`` rounds un-measured). The policy comes from
    ``source`` (``--model``, built in ``precision``'s parameter dtype by the caller), else the preset's random
    Llama; the batches from ``data`` (``--data``), else the preset's synthetic ones, in the model's vocabulary;
    ``peer`` names TRL peers (:func:`peer_names`); ``precision`` and ``dtype`` are
    :func:`~lit_prunedpo_lab.bench.precision.resolve_precision`'s."""
    peers, prec = peer_names(peer), resolve_precision(precision, dtype)
    stepper = prec.stepper(dev)
    module = PrunedDPO(
        policy=source if source is not None else FromConfig("llama", preset.model, seed=seed, dtype=prec.weights),
        beta=0.1,
        optimizer=partial(torch.optim.AdamW, lr=preset.lr),
    ).to(dev)
    module.train()
    weights = next(module.policy.parameters()).dtype
    if weights != getattr(torch, prec.weights):
        raise ValueError(f"--precision {prec.name} runs {prec.weights} parameters; the model's are {weights}")
    optimizer = module.configure_optimizers()
    dims = cost.ModelDims.from_model(module.policy)
    batches = [b.to(dev) for b in round_batches(preset, num_batches, seed, module.policy, data)]
    scorer_of = {"plain": TokenScorer(), "chunked": ChunkedScorer(preset.chunk_size)}
    sources = _reference_sources(module, references, scorer_of["chunked"], batches, stepper)
    # copies of the policy before any step: the same initial weights, in the same dtype, on the same device
    trl = make_peers(peers, module.policy, batches, beta=0.1, lr=preset.lr,
                     pad_id=data.pad_token_id if data is not None else PAD, precision=prec)
    configs = [Config(m, r, s, p) for r in references for s in scorers for p in prompts for m in modes]
    samplers = {m: MODES[m]() for m in modes}
    return Rounds(
        module=module, optimizer=optimizer, batches=batches, warmup=warmup,
        parts={c: StepParts(*samplers[c.mode], scorer_of[c.scorer], sources[c.reference, c.scorer],
                            layout_for(c.prompt == "shared"))
               for c in configs},
        rngs={c: SamplerRNG(seed=seed) for c in configs},
        meter=PeakMemoryMeter(dev, settle=True), dims=dims, device=dev, baseline_prompt=baseline_prompt(prompts),
        peers=trl, precision=prec, stepper=stepper,
    )


def _reference_sources(module: PrunedDPO, references: Sequence[str], chunked: ChunkedScorer,
                       batches: Sequence[PreferenceBatch], stepper: Stepper,
                       ) -> dict[tuple[str, str], ReferenceSource]:
    """Each ``(reference, scorer)``'s reference: the module's own frozen copy of the initial policy, one copy for
    every online reference (the chunked scorer's runs the same weights through it); a cache of that model's log-probs
    on exactly ``batches``."""
    online = module.reference
    sources: dict[tuple[str, str], ReferenceSource] = {}
    if "online" in references:
        sources["online", "plain"] = online
        sources["online", "chunked"] = online.with_scorer(chunked)  # same frozen weights, chunked head
    if "cached" in references:
        (frozen,) = online.models()
        cached = _cached_reference(frozen, batches, stepper)
        sources["cached", "plain"] = sources["cached", "chunked"] = cached
    return sources


def run_rounds(
    rounds: Rounds,
    log: Callable[[str], None] | None = None,
    observe: Callable[[Config, StepOutput], None] | None = None,
) -> tuple[dict[Config, StepRecord], dict[str, StepRecord]]:
    """Round ``r``: one step of every configuration, then of every peer, on batch ``r``; rounds before ``warmup``
    are not recorded; ``observe(config, output)`` is called after each recorded step's time and memory are read.

    Returns:
        Each configuration's record, and each peer's (none without peers).
    """
    log = log or (lambda line: None)
    records = {c: StepRecord() for c in rounds.parts}
    peer_records = {name: StepRecord() for name in rounds.peers}
    draws = {c: rng.step + rounds.warmup for c, rng in rounds.rngs.items()}  # each stream's first measured step
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
            out, elapsed, reading = _timed(rounds, lambda: train_step(rounds.module, rounds.optimizer, batch, parts,
                                                                      generator, rounds.stepper))
            if measured:
                _record_config(records[c], c, out, vanilla, rounds.dims, elapsed, reading)
                if observe is not None:
                    observe(c, out)
        for name, peer in rounds.peers.items():
            inputs = peer.inputs(r)
            loss, elapsed, reading = _timed(rounds, lambda: peer.step(inputs))
            if measured:
                _record_peer(peer_records[name], peer, loss, rounds.dims, elapsed, reading)
        log(f"round {r + 1}/{len(rounds.batches)} ({'measured' if measured else 'warm-up'}) done")
    if rounds.meter.intrusive:
        memory_rounds(rounds, records, peer_records, draws, log)
    return records, peer_records


def memory_rounds(rounds: Rounds, records: dict[Config, StepRecord], peer_records: dict[str, StepRecord],
                  draws: dict[Config, int], log: Callable[[str], None]) -> None:
    """The measured rounds again, metered and untimed, for a meter that slows what it measures: round ``r`` runs
    every configuration on batch ``r`` with its sampler stream at the step it drew in the timed round ``r``
    (``draws``: each stream's first measured step), then every peer on batch ``r``. The streams end where the timed
    rounds left them."""
    ends = {c: rng.step for c, rng in rounds.rngs.items()}
    for i, r in enumerate(range(rounds.warmup, len(rounds.batches))):
        batch = rounds.batches[r]
        for c, parts in rounds.parts.items():
            rounds.rngs[c].step = draws[c] + i
            generator = rounds.rngs[c].next()
            records[c].add_memory(_metered(rounds, lambda: train_step(rounds.module, rounds.optimizer, batch, parts,
                                                                       generator, rounds.stepper)))
        for name, peer in rounds.peers.items():
            inputs = peer.inputs(r)
            peer_records[name].add_memory(_metered(rounds, lambda: peer.step(inputs)))
        log(f"memory round {i + 1}/{len(rounds.batches) - rounds.warmup} done")
    for c, rng in rounds.rngs.items():
        rng.step = ends[c]


def _metered(rounds: Rounds, step: Callable[[], object]) -> PeakReading | None:
    """The peak memory of ``step()``, untimed."""
    rounds.meter.start()
    step()
    return rounds.meter.stop()


def _timed(rounds: Rounds, step: Callable[[], T]) -> tuple[T, float, PeakReading | None]:
    """``step()``'s result, its wall time (the device synchronised before and after) and its peak memory (``None``
    for a meter that slows what it measures: :func:`memory_rounds` measures it)."""
    dev = rounds.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    meter = None if rounds.meter.intrusive else rounds.meter
    if meter is not None:
        meter.start()
    sync()
    start = time.perf_counter()
    result = step()
    sync()
    elapsed = time.perf_counter() - start
    return result, elapsed, meter.stop() if meter is not None else None


def _record_config(rec: StepRecord, c: Config, out: StepOutput, vanilla: StepForwards, dims: cost.ModelDims,
                   elapsed: float, reading: PeakReading | None) -> None:
    """A measured configuration step: time, memory, work counts and the FLOPs of the forwards it ran."""
    stats = out.stats
    rec.add(elapsed, reading)
    rec.tokens.append(stats.tokens_executed)
    rec.reference_tokens.append(stats.reference_tokens_executed)
    rec.positions.append(stats.positions_scored)
    recompute = c.scorer == "chunked"
    rec.flops.append(cost.step_flops(out.forwards, dims, c.reference, recompute_head=recompute))
    rec.vanilla_flops.append(cost.step_flops(vanilla, dims, c.reference, recompute_head=recompute))
    rec.losses.append(float(out.estimate.objective.detach()))


def _record_peer(rec: StepRecord, peer: TRLPeer, loss: float, dims: cost.ModelDims, elapsed: float,
                 reading: PeakReading | None) -> None:
    """A measured peer step: time, memory, the tokens of its policy and reference forwards (padding included, as
    its hooks saw them) and their FLOPs."""
    forwards = peer.forwards
    rec.add(elapsed, reading)
    rec.tokens.append(sum(f.rows * f.width for f in forwards if not f.reference))
    rec.reference_tokens.append(sum(f.rows * f.width for f in forwards if f.reference))
    rec.positions.append(sum(f.positions for f in forwards if not f.reference))
    rec.flops.append(peer_step_flops(dims, forwards))
    rec.losses.append(loss)


def baseline_prompt(prompts: Sequence[str]) -> str:
    """The prompt layout of the ``vanilla`` steps speedups compare with: ``padded`` when it is measured
    (concatenated DPO), else ``shared``."""
    return "padded" if "padded" in prompts else "shared"
