"""Scaling sweeps: each mode's per-step time and peak memory against model size and response length, measured
beside the cost model's and the memory model's predictions, with the prediction error of every point.

Two sweeps of Llama-style models (:data:`SIZES`, or ``d<width>l<layers>``), every point one
:func:`~lit_prunedpo_lab.bench.harness.run_benchmark` run (the modes alternating step by step on the same weights and
batches, warm-up excluded, medians; the step's peak memory above its start):

* **size**: every size at one response length (``size_length``), ``size_batch`` pairs;
* **length**: one size (``length_size``) at every response length, ``length_batch`` pairs.

With ``--model`` (``Settings.model``) the length sweep runs on that model, its own weights, vocabulary and shape, and
there is no size sweep: a given model has one size, and what the sizes' sweep shows (the ratios' trend with the
parameter count) needs models that differ in size only. The memory model predicts from the model's real sizes, and
the real-shapes section (:mod:`lit_prunedpo_lab.bench.real_shapes`) predicts its ratios at longer lengths beside the
published shapes'.

Pairs: a ``prompt``-token prompt, chosen and rejected responses of exactly the point's length (random tokens), the
shared-prompt layout. At each point and for each mode (against ``vanilla`` with the same reference and scorer):

* time ratio ``= median step(mode) / median step(vanilla)``, predicted ``1 / ideal_speedup`` (the FLOP ratio on
  the shapes the steps executed, :mod:`lit_prunedpo_lab.bench.cost`);
* memory: the step's peak above its start, the largest over the measured steps, predicted by
  :mod:`lit_prunedpo_lab.bench.memory_model` on the same executed shapes; its ratio to vanilla's likewise;
* error ``= measured / predicted - 1`` of each, and per sweep the median and largest absolute error
  (:func:`error_summary`; vanilla's ratios are 1 by construction and left out of the ratio summaries).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from lit_prunedpo_lab.bench.harness import run_benchmark
from lit_prunedpo_lab.bench.memory_model import LayerDims, predict_step, shapes_of
from lit_prunedpo_lab.bench.own_model import pretrained_source, written_as_path
from lit_prunedpo_lab.bench.presets import MODES, Preset, llama_config
from lit_prunedpo_lab.bench.real_shapes import meta_model
from lit_prunedpo_lab.bench.rounds import Config, MiB



@dataclass(frozen=True)
class Size:
    """A Llama-style model's shape: ``heads`` of 64 (``d / 64``, at least 1), MLP ``4 d``, as many KV heads."""

    name: str
    hidden: int
    layers: int

    @property
    def heads(self) -> int:
        return max(1, self.hidden // 64)

    def model(self, vocab: int, max_len: int) -> dict[str, Any]:
        """The ``transformers`` Llama config arguments."""
        return llama_config(vocab, self.hidden, self.layers, self.heads, 4 * self.hidden, max_len)

    def params(self, vocab: int) -> tuple[int, int]:
        """``(all parameters, body linear layers)``: embeddings and LM head untied, no biases, RMSNorm weights."""
        d, L = self.hidden, self.layers
        body = L * (4 * d * d + 3 * d * 4 * d)
        return body + 2 * vocab * d + (2 * L + 1) * d, body


#: Named sizes of the CPU grid (about 1.2M to 42M parameters with V=8192: 35x) and the smoke test's.
SIZES: dict[str, Size] = {
    s.name: s
    for s in (Size("2xs", 32, 2), Size("xs", 64, 2), Size("s", 128, 4), Size("m", 256, 4), Size("l", 384, 6),
              Size("xl", 512, 8))
}


def parse_size(text: str) -> Size:
    """A name from :data:`SIZES`, or ``d<width>l<layers>`` (``d512l8``; ``width // 64`` heads must divide the width).

    Raises:
        ValueError: naming the known sizes and the pattern.
    """
    if text in SIZES:
        return SIZES[text]
    match = re.fullmatch(r"d(\d+)l(\d+)", text)
    if match:
        size = Size(text, int(match[1]), int(match[2]))
        if size.hidden >= 1 and size.layers >= 1 and size.hidden % size.heads == 0:
            return size
    raise ValueError(f"unknown size {text!r}: choose from {list(SIZES)} or d<width>l<layers> with width and layers "
                     ">= 1 and width divisible by its heads, max(1, width // 64) (e.g. d512l8)")


@dataclass(frozen=True)
class Point:
    """One grid point: a sweep, a model size (``None``: ``--model``), a response length, a batch."""

    sweep: str
    size: Size | None
    response: int
    prompt: int
    batch: int
    model: str | None = None

    @property
    def name(self) -> str:
        """The size's name, or ``--model``'s file, folder or hub name."""
        if self.size is not None:
            return self.size.name
        model = str(self.model)
        return Path(model).name if written_as_path(model) or Path(model).expanduser().exists() else model


@dataclass(frozen=True)
class Settings:
    """What the sweeps run (the CLI's options; see ``lit-prunedpo-bench-scaling --help``)."""

    sizes: tuple[Size, ...]
    lengths: tuple[int, ...]
    length_size: Size
    size_length: int = 256
    prompt: int = 64
    size_batch: int = 2
    length_batch: int = 2
    vocab: int = 8192
    modes: tuple[str, ...] = tuple(MODES)
    references: tuple[str, ...] = ("online",)
    scorers: tuple[str, ...] = ("plain",)
    steps: int = 5
    warmup: int = 1
    device: str = "cpu"
    dtype: str | None = None
    chunk_size: int = 1024
    seed: int = 0
    smoke_test: bool = False
    model: str | None = None

    def __post_init__(self) -> None:
        if not self.sizes and not self.lengths:
            raise ValueError("sizes and lengths are both empty: nothing to sweep")
        if self.model is not None and (self.sizes or not self.lengths):
            raise ValueError("with --model the sweep is over response lengths on that model: give --lengths and no "
                             "--sizes (a given model has one size)")
        for name in ("size_length", "prompt", "size_batch", "length_batch", "steps", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if any(n < 1 for n in self.lengths):
            raise ValueError(f"lengths must all be >= 1, got {list(self.lengths)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup!r}")
        if self.vocab < 8:
            raise ValueError(f"vocab must be >= 8, got {self.vocab!r}")
        if "vanilla" not in self.modes:
            raise ValueError("modes must include vanilla: every ratio is against it")

    def points(self) -> list[Point]:
        """The size sweep's points, then the length sweep's."""
        length_size = None if self.model is not None else self.length_size
        return ([Point("size", s, self.size_length, self.prompt, self.size_batch) for s in self.sizes]
                + [Point("length", length_size, n, self.prompt, self.length_batch, self.model) for n in self.lengths])


def point_preset(point: Point, settings: Settings) -> Preset:
    """The benchmark preset of a point: fixed prompt and response lengths (a one-value quantile table each)."""
    lengths = {"prompt": (point.prompt,) * 2, "chosen": (point.response,) * 2, "rejected": (point.response,) * 2}
    max_len = point.prompt + 2 * point.response + 8
    return Preset(
        name=f"scaling-{point.sweep}-{point.name}-{point.response}",
        description=f"{point.name} at {point.response}-token responses", batch_size=point.batch,
        model=point.size.model(settings.vocab, max_len) if point.size is not None else {},
        response_length=(point.response, point.response), warmup=settings.warmup, steps=settings.steps,
        chunk_size=settings.chunk_size, lengths=lengths, smoke_test=settings.smoke_test,
    )


def rel_error(measured: float | None, predicted: float | None) -> float | None:
    """``measured / predicted - 1``; ``None`` when either is missing or the prediction is 0."""
    if measured is None or not predicted:
        return None
    return measured / predicted - 1.0


def run_point(point: Point, settings: Settings, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run one point and return its payload (the benchmark's) and rows (measured beside predicted).

    Raises:
        ValueError: ``--model``'s config lacks the Llama-style sizes the memory model reads.
    """
    preset = point_preset(point, settings)
    shapes: dict[Config, list] = defaultdict(list)
    payload = run_benchmark(
        preset, modes=settings.modes, references=settings.references, scorers=settings.scorers, prompts=("shared",),
        device=settings.device, seed=settings.seed, log=log, dtype=settings.dtype,
        observe=lambda config, out: shapes[config].append(shapes_of(out.forwards)),
        source=pretrained_source(point.model, settings.dtype) if point.model is not None else None,
    )
    if point.size is not None:
        layer = LayerDims.from_model(meta_model("llama", preset.model))
    elif payload["layer_dims"] is not None:
        layer = LayerDims(**payload["layer_dims"])
    else:
        raise ValueError(f"--model {point.model}: the memory model reads Llama-style config sizes (hidden_size, "
                         f"intermediate_size, num_attention_heads, ...) that {payload['model']['class']} lacks")
    device = "cuda" if settings.device.startswith("cuda") else "cpu"
    predicted = {
        config: max(predict_step(layer, policy, reference if config.reference == "online" else None,
                                 settings.dtype or "float32", config.scorer, settings.chunk_size, device).peak
                    for policy, reference in steps) / MiB
        for config, steps in shapes.items()
    }
    return {"payload": payload, "rows": point_rows(point, settings, payload, predicted)}


def point_shape(point: Point, settings: Settings, payload: dict[str, Any]) -> dict[str, Any]:
    """A point's model in a row: its name, width, layers, parameters (all, body linear layers) and vocabulary; a
    ``--model``'s read from its payload."""
    if point.size is not None:
        params, body = point.size.params(settings.vocab)
        return {"size": point.name, "hidden": point.size.hidden, "layers": point.size.layers, "params": params,
                "body_params": body, "vocab": settings.vocab}
    dims = payload["model_dims"]
    return {"size": point.name, "hidden": dims["hidden_size"], "layers": dims["num_layers"],
            "params": payload["model"]["parameters"], "body_params": dims["body_params"], "vocab": dims["vocab_size"]}


def point_rows(point: Point, settings: Settings, payload: dict[str, Any],
               predicted_mib: dict[Config, float]) -> list[dict[str, Any]]:
    """One row per configuration: measured and predicted time and memory, their ratios to vanilla, the errors."""
    shape = point_shape(point, settings, payload)
    results = {Config(r["mode"], r["reference"], r["scorer"], r["prompt"]): r for r in payload["results"]}
    rows = []
    for config, r in results.items():
        base = Config("vanilla", config.reference, config.scorer, config.prompt)
        memory, base_memory = r.get("peak_step_memory_mb"), results[base].get("peak_step_memory_mb")
        pred, base_pred = predicted_mib[config], predicted_mib[base]
        row = {
            "sweep": point.sweep, **shape, "response": point.response, "prompt": point.prompt,
            "batch": point.batch, "mode": config.mode, "reference": config.reference, "scorer": config.scorer,
            "step_time_s": r["step_time_s"], "tokens_executed": r["tokens_executed"],
            "head_share": payload["head_share"], "load": payload.get("load"),
            "time_ratio": r["step_time_s"] / results[base]["step_time_s"], "time_ratio_pred": 1.0 / r["ideal_speedup"],
            "memory_mb": memory, "memory_pred_mb": pred,
            "memory_ratio": memory / base_memory if memory is not None and base_memory else None,
            "memory_ratio_pred": pred / base_pred,
        }
        row["time_error"] = rel_error(row["time_ratio"], row["time_ratio_pred"])
        row["memory_error"] = rel_error(memory, pred)
        row["memory_ratio_error"] = rel_error(row["memory_ratio"], row["memory_ratio_pred"])
        rows.append(row)
    return rows


#: The summarised errors: (row key, what it is, whether vanilla's rows count).
ERRORS = (
    ("time_error", "time ratio to vanilla", False),
    ("memory_ratio_error", "step memory ratio to vanilla", False),
    ("memory_error", "step memory (MiB)", True),
)


def error_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per sweep and quantity: the number of points, the median and the largest absolute error, and where the
    largest is (vanilla's ratio errors, 0 by construction, are left out)."""
    out = []
    for sweep in dict.fromkeys(r["sweep"] for r in rows):
        for key, what, with_vanilla in ERRORS:
            errors = [(abs(r[key]), r) for r in rows if r["sweep"] == sweep and r.get(key) is not None
                      and (with_vanilla or r["mode"] != "vanilla")]
            if not errors:
                continue
            worst, where = max(errors, key=lambda e: e[0])
            out.append({
                "sweep": sweep, "quantity": key, "what": what, "points": len(errors),
                "median_abs": statistics.median(e for e, _ in errors), "max_abs": worst,
                "worst": f"{where['mode']} at {where['size']}, {where['response']} tokens",
            })
    return out


def size_table(sizes: Sequence[Size], vocab: int) -> list[dict[str, Any]]:
    """The sizes' shapes and parameter counts, for the report."""
    return [{"name": s.name, "hidden": s.hidden, "layers": s.layers, "heads": s.heads, "ffn": 4 * s.hidden,
             "params": s.params(vocab)[0], "body_params": s.params(vocab)[1]} for s in sizes]


def run_scaling(settings: Settings, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every point of both sweeps (:meth:`Settings.points`); returns the rows, the error summary, the sizes and
    what the benchmark says of the device and its memory meter."""
    say = log or (lambda line: None)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    payload: dict[str, Any] = {}
    points = settings.points()
    for i, point in enumerate(points):
        where = f"{point.sweep} sweep, size {point.name}, {point.response}-token responses, {point.batch} pair(s)"
        say(f"point {i + 1}/{len(points)}: {where}")
        try:
            done = run_point(point, settings, log)
        except RuntimeError as error:  # torch.OutOfMemoryError is one: the other points still run
            if "out of memory" not in str(error).lower():
                raise
            skipped.append(f"{where}: out of memory")
            say(f"skipped ({skipped[-1]})")
            _release_device_memory()
            continue
        payload = done["payload"]
        rows += done["rows"]
    with_length = settings.lengths and settings.model is None
    sizes = list(dict.fromkeys([*settings.sizes, settings.length_size] if with_length else settings.sizes))
    table = size_table(sizes, settings.vocab)
    if settings.model is not None and payload:
        shape = point_shape(points[-1], settings, payload)
        table.append({"name": shape["size"], "hidden": shape["hidden"], "layers": shape["layers"],
                      "params": shape["params"], "body_params": shape["body_params"]})
    return {
        "rows": rows, "summary": error_summary(rows), "sizes": table, "skipped": skipped,
        "device_name": payload.get("device_name"), "memory_measure": payload.get("memory_measure"),
        **{key: payload.get(key) for key in ("model", "model_dims", "layer_dims") if settings.model is not None},
    }


def _release_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
