"""The cost model's and the memory model's predictions for real model shapes, without building their weights.

Each shape is a ``transformers`` config with explicit arguments (nothing is downloaded) whose model is built on the
``meta`` device (no memory, no initialisation): :meth:`~lit_prunedpo_lab.bench.cost.ModelDims.from_model` and
:meth:`.memory_model.LayerDims.from_model` read the sizes from it. For each shape, response-length
setting and mode, the shipped mode's samplers plan the same batches, :class:`~lit_prunedpo.step.execute.StepExecutor`
lays them out (shared prompt, keys and values reused), and the two models predict:

* **time ratio** ``= 1 / ideal_speedup``: FLOPs of the mode over FLOPs of vanilla on the same batches
  (:mod:`lit_prunedpo_lab.bench.cost`);
* **memory ratio**: the predicted step peak above its start (activations, gradients, AdamW temporaries on one CUDA
  device) over vanilla's, and the same for the activations alone (:mod:`lit_prunedpo_lab.bench.memory_model`).

Assumptions (stated in the report): time proportional to FLOPs (no kernel launch, memory-bandwidth or
communication time); attention counted as the full rectangle (Gemma 3's sliding-window layers too); an online
reference; the plain scorer; the shared-prompt layout; bf16 parameters, activations and gradients, one device, no
gradient checkpointing, no sharding; the Llama layer structure for memory (Gemma's extra norms not counted).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.batches import make_batches
from lit_prunedpo_lab.bench.memory_model import LayerDims, predict_step, shapes_of
from lit_prunedpo_lab.bench.presets import HH_RLHF_LENGTHS, MODES, Preset
from lit_prunedpo.step.execute import StepExecutor, StepForwards, layout_for
from lit_prunedpo.layout import PairLengths
from lit_prunedpo.step.plan import plan_step


@dataclass(frozen=True)
class RealShape:
    """A published model's shape: its ``transformers`` model type and config arguments."""

    name: str
    model_type: str
    config: dict[str, Any]
    note: str


REAL_SHAPES: dict[str, RealShape] = {
    s.name: s
    for s in (
        RealShape("Qwen2.5-0.5B", "qwen2", dict(
            hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
            intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True), "q/k/v biases, tied embeddings"),
        RealShape("Gemma-3-1B", "gemma3_text", dict(
            hidden_size=1152, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
            intermediate_size=6912, vocab_size=262144, tie_word_embeddings=True),
            "262k vocabulary, tied; 5 of 6 layers sliding-window (counted full)"),
        RealShape("Llama-3-8B", "llama", dict(
            hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
            intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False), "GQA 32/8 heads"),
        RealShape("Llama-3-70B", "llama", dict(
            hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
            intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False), "GQA 64/8 heads"),
    )
}

#: What the predictions assume (the report lists them).
ASSUMPTIONS = (
    "time proportional to FLOPs: no kernel-launch, memory-bandwidth, communication or optimizer time",
    "FLOPs: body 2N per token, attention 4 x layers x heads x head_dim x width x (cached + width) per sequence (the "
    "full rectangle, Gemma 3's sliding-window layers too), LM head 2dV per scored position, backward 2x forward",
    "online reference (one no-grad forward of every planned row), plain scorer, shared-prompt layout with keys and "
    "values reused, a margin loss (a pair's common response start scored once)",
    "the shipped modes (configs/modes/*.yaml), planned as PrunedDPO plans them, on the same batches as vanilla",
    "memory: bf16 parameters, activations and gradients, float32 logits; AdamW foreach on one CUDA device; no "
    "gradient checkpointing, no sharding; the Llama decoder layer's saved tensors (Gemma's extra norms not counted); "
    "the step's peak above its start: weights and optimizer state (held before the step) excluded",
    "activation memory: the same without the gradients and the optimizer's temporaries (what pruning acts on)",
)

#: Response-length settings: HH-RLHF's (prompt and responses from :data:`HH_RLHF_LENGTHS`), or fixed responses.
FIXED_PROMPT = 64
LENGTH_SETTINGS = ("hh-rlhf", "512", "2048")


def describe(shape: RealShape) -> str:
    """One line: the shape's sizes and what is particular to it."""
    c = shape.config
    head_dim = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    return (f"{shape.name} ({shape.model_type}): d={c['hidden_size']}, {c['num_hidden_layers']} layers, "
            f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads of {head_dim}, FFN {c['intermediate_size']}, "
            f"V={c['vocab_size']}; {shape.note}")


def meta_model(model_type: str, config: dict[str, Any]) -> torch.nn.Module:
    """The ``transformers`` causal LM of ``config`` on the ``meta`` device: shapes only, no memory, offline."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))


def dims_of(model_type: str, config: dict[str, Any]) -> tuple[cost.ModelDims, LayerDims]:
    """The cost model's and the memory model's sizes of ``config``, read from its ``meta``-device model."""
    model = meta_model(model_type, config)
    return cost.ModelDims.from_model(model), LayerDims.from_model(model)


def length_preset(setting: str, batch_size: int) -> Preset:
    """Batches of ``batch_size`` pairs for a length setting: HH-RLHF's quantiles (length-grouped) or a fixed
    response length after a :data:`FIXED_PROMPT`-token prompt (chosen and rejected equally long)."""
    if setting == "hh-rlhf":
        lengths = HH_RLHF_LENGTHS
    else:
        n = int(setting)
        lengths = {"prompt": (FIXED_PROMPT, FIXED_PROMPT), "chosen": (n, n), "rejected": (n, n)}
    top = max(lengths["chosen"][-1], lengths["rejected"][-1])
    return Preset(name=f"lengths-{setting}", description="", model={"vocab_size": 1000}, batch_size=batch_size,
                  response_length=(1, top), lengths=lengths)


def planned_forwards(batches: Sequence[PreferenceBatch], mode: str, seed: int = 0) -> list[StepForwards]:
    """What a step of ``mode`` runs on each batch (shared prompt, keys and values reused), as the module plans it:
    a margin loss on the shared layout scores a pair's common response start once."""
    executor = StepExecutor(layout_for(True))
    out = []
    for i, batch in enumerate(batches):
        plan = plan_step(batch, *MODES[mode](), generator=torch.Generator().manual_seed(seed + i),
                         score_common_prefix=False)
        out.append(executor.forwards(plan.groups, PairLengths.of(batch)))
    return out


def predict_shape(
    name: str, dims: cost.ModelDims, layer: LayerDims, forwards: dict[str, list[StepForwards]],
    dtype: str = "bfloat16", device: str = "cuda",
) -> list[dict[str, Any]]:
    """One row per mode: the predicted time and memory ratios to vanilla of the model ``name`` (sizes ``dims`` and
    ``layer``) on the planned ``forwards`` (``vanilla`` among them); memory is the largest over the batches."""
    flops = {m: [cost.step_flops(f, dims, "online") for f in fs] for m, fs in forwards.items()}
    memory = {m: [predict_step(layer, *shapes_of(f), dtype=dtype, device=device) for f in fs]
              for m, fs in forwards.items()}
    peak = {m: max(p.peak for p in ps) for m, ps in memory.items()}
    act = {m: max(p.activation_peak for p in ps) for m, ps in memory.items()}
    first = forwards["vanilla"][0]
    share = cost.forward_flops(dims, *first.reference.shape, first.reference.group.num_scored).head_share
    rows = []
    for mode in forwards:
        rows.append({
            "shape": name, "params": layer.params, "mode": mode,
            "tokens_executed": statistics.fmean(f.tokens_executed for f in forwards[mode]),
            "time_ratio_pred": 1.0 / cost.ideal_speedup(flops["vanilla"], flops[mode]),
            "memory_ratio_pred": peak[mode] / peak["vanilla"],
            "activation_ratio_pred": act[mode] / act["vanilla"],
            "peak_pred_gib": peak[mode] / 2**30, "activation_pred_gib": act[mode] / 2**30,
            "vanilla_peak_gib": peak["vanilla"] / 2**30,
            "head_share": share,
        })
    return rows


def describe_dims(name: str, dims: cost.ModelDims, layer: LayerDims) -> str:
    """One line for a model read from its weights (``--model``): its sizes, as :func:`describe` gives a shape's."""
    return (f"{name} (--model, sizes read from the loaded model): d={layer.hidden}, {layer.layers} layers, "
            f"{layer.heads}/{layer.kv_dim // layer.head_dim} heads of {layer.head_dim}, FFN {layer.ffn}, "
            f"V={dims.vocab_size}")


def predict_real_shapes(
    names: Sequence[str] = tuple(REAL_SHAPES), settings: Sequence[str] = LENGTH_SETTINGS, batch_size: int = 8,
    num_batches: int = 8, seed: int = 0, extra: Mapping[str, tuple[cost.ModelDims, LayerDims]] | None = None,
) -> list[dict[str, Any]]:
    """Rows of :func:`predict_shape` for every shape and length setting (``num_batches`` batches each), the shapes
    of ``extra`` (a name's sizes, e.g. ``--model``'s) after the named ones.

    Raises:
        ValueError: an unknown shape or length setting.
    """
    unknown = [n for n in names if n not in REAL_SHAPES]
    if unknown:
        raise ValueError(f"unknown real shape(s) {unknown}; choose from {list(REAL_SHAPES)}")
    bad = [s for s in settings if s not in LENGTH_SETTINGS]
    if bad:
        raise ValueError(f"unknown length setting(s) {bad}; choose from {list(LENGTH_SETTINGS)}")
    sizes = {n: dims_of(REAL_SHAPES[n].model_type, REAL_SHAPES[n].config) for n in names}
    sizes.update(extra or {})
    rows = []
    for setting in settings:
        batches = make_batches(length_preset(setting, batch_size), num_batches, seed)
        forwards = {m: planned_forwards(batches, m, seed) for m in MODES}
        for name in sizes:
            rows += [{"lengths": setting, **row} for row in predict_shape(name, *sizes[name], forwards)]
    return rows


def real_shapes_payload(names: Sequence[str] = tuple(REAL_SHAPES), settings: Sequence[str] = LENGTH_SETTINGS,
                        batch_size: int = 8, num_batches: int = 8, seed: int = 0,
                        extra: Mapping[str, tuple[cost.ModelDims, LayerDims]] | None = None) -> dict[str, Any]:
    """The report's real-shapes section: :func:`predict_real_shapes`'s rows, the settings and the assumptions."""
    return {
        "rows": predict_real_shapes(names, settings, batch_size, num_batches, seed, extra), "batch_size": batch_size,
        "shapes": [describe(REAL_SHAPES[n]) for n in names]
        + [describe_dims(name, *sizes) for name, sizes in (extra or {}).items()],
        "num_batches": num_batches, "fixed_prompt": FIXED_PROMPT, "settings": list(settings),
        "assumptions": list(ASSUMPTIONS),
    }
