"""Write a scaling payload (:mod:`.scaling`) as ``scaling.json``, ``scaling.md`` and ``scaling.png``.

The markdown opens with the run's context (date, commit, machine, versions, command), then the prediction-error
summary, one table per sweep (measured beside predicted, with each error) and the real shapes' predictions with
their assumptions. The PNG (matplotlib, the ``bench`` extra; skipped without it) draws each mode's time and memory
ratio to vanilla against parameters and against response length, measured solid and predicted dashed.

A smoke test (``--quick``) states no measured time ratios or their errors, in the markdown or the chart (its tiny
models time overheads, not pruning: see :mod:`lit_prunedpo_lab.bench.presets`); the JSON keeps every number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from lit_prunedpo_lab.bench.load import under_load

SMOKE_HIDDEN = ("time_ratio", "time_error")  # measured speedups: not stated by a smoke test


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.0%}"


def _mib(value: float | None) -> str:
    return _fmt(value, ".1f" if value is not None and value < 100 else ".0f")


def millions(n: float) -> str:
    """Parameters in millions, two decimals below 10M."""
    return f"{n / 1e6:.2f}M" if n < 1e7 else f"{n / 1e6:.1f}M"


SWEEP_COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("mode", "mode", str),
    ("step_time_s", "median step (s)", lambda v: _fmt(v, ".3f")),
    ("time_ratio", "time ratio", lambda v: _fmt(v, ".2f")),
    ("time_ratio_pred", "predicted", lambda v: _fmt(v, ".2f")),
    ("time_error", "error", _pct),
    ("memory_mb", "step mem (MiB)", _mib),
    ("memory_pred_mb", "predicted", _mib),
    ("memory_error", "error", _pct),
    ("memory_ratio", "mem ratio", lambda v: _fmt(v, ".2f")),
    ("memory_ratio_pred", "predicted", lambda v: _fmt(v, ".2f")),
    ("memory_ratio_error", "error", _pct),
)


def context_lines(payload: dict[str, Any]) -> list[str]:
    """The run's context: when, which code, which machine, how measured."""
    c, s = payload["context"], payload["settings"]
    measured = bool(payload.get("rows"))
    lines = [
        f"- date {c['date']}, commit {c['commit']}",
        f"- machine: {c['machine']}, {c['cpu_count']} CPUs; torch {c['torch']}, python {c['python']}"
        + (f"; device {c['device']} ({c['device_name']}), {c['threads']} torch thread(s), parameters in {c['dtype']}"
           if measured else ""),
        f"- command: `{c['command']}`" + (f", {payload['elapsed_s']:.0f} s" if "elapsed_s" in payload else ""),
    ]
    if measured:
        lines += [
            f"- {s['steps']} measured steps per configuration after {s['warmup']} warm-up round(s), the modes "
            "alternating on the same weights and batches (lit-prunedpo-bench's harness); reference "
            f"{'/'.join(s['references'])}, scorer {'/'.join(s['scorers'])}, shared prompt",
            f"- memory: {c['memory_measure']}, the step's peak above its start, the largest over the measured steps",
        ]
    model = payload.get("model")
    if model:  # --model: the length sweep's model, named as bench.json names it
        file = f", file sha256 `{model['file_sha256']}`" if model.get("file_sha256") else ""
        lines.append(f"- model (--model, the length sweep's): `{model.get('name_or_path')}` ({model.get('kind')}"
                     f"{file}), {model.get('class')}, {millions(model.get('parameters', 0))} parameters in "
                     f"{model.get('dtype')}; weights sha256 `{model.get('weights_sha256')}`; no size sweep (a given "
                     "model has one size)")
    for point in payload.get("skipped") or []:
        lines.append(f"- **not measured**: {point}")
    lines += load_lines(payload.get("rows") or [])
    if payload.get("smoke_test"):
        lines.append("- **smoke test** (`--quick`): tiny models and 2 steps check that the sweeps run; measured time "
                     "ratios mean nothing here and are not stated (the cost model's FLOP ratios are exact for these "
                     "shapes)")
    return lines


def load_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The points whose rounds ran under load (:func:`~lit_prunedpo_lab.bench.load.under_load`), if any."""
    points = {(r["sweep"], r["size"], r["response"], r["batch"]): r.get("load") for r in rows}
    loaded = {point: why for point, load in points.items() if (why := under_load(load))}
    if not loaded:
        return []
    (sweep, size, response, batch), why = next(iter(loaded.items()))
    return [f"- **taken under load**: {len(loaded)} of {len(points)} points, e.g. the {sweep} sweep's size {size}, "
            f"{response}-token responses, {batch} pair(s) ({why}): their time ratios may move with it"]


def definitions(measure: str = "") -> list[str]:
    """What the tables' columns mean; the last sentence says what the run's memory ``measure`` (its words) holds."""
    if "RSS" in measure:
        meter = ("On the CPU the meter reads the process's RSS, which also holds freed heap memory glibc has not "
                 "returned (up to its trim threshold, 64 MiB once its mmap threshold has grown to 32 MiB): the memory "
                 "model counts live tensors only, so small steps read above it.")
    else:
        meter = ("On the CPU the meter reads live tensor storage (the CPU allocator's events), the quantity the "
                 "memory model predicts; allocator caching is in neither.")
    return [
        "Time ratio: median step time of the mode over `vanilla`'s (same reference and scorer; below 1 is faster). "
        "Predicted: the cost model's FLOP ratio on the shapes the steps executed (`1 / ideal_speedup`). Step memory: "
        "the step's peak above its start; predicted by `lab/lit_prunedpo_lab/bench/memory_model.py` (tensors alive: "
        "saved "
        "activations, head buffers, gradients, optimizer temporaries) on the same shapes. Error = measured / "
        "predicted - 1. " + meter,
    ]


def summary_table(payload: dict[str, Any]) -> list[str]:
    smoke = payload.get("smoke_test")
    lines = ["| sweep | quantity | points | median abs error | max abs error | worst point |",
             "|---|---|---|---|---|---|"]
    for s in payload["summary"]:
        if smoke and s["quantity"] == "time_error":
            continue
        lines.append(f"| {s['sweep']} | {s['what']} | {s['points']} | {s['median_abs']:.0%} | {s['max_abs']:.0%} | "
                     f"{s['worst']} |")
    return lines


def sweep_table(payload: dict[str, Any], sweep: str) -> list[str]:
    smoke = payload.get("smoke_test")
    rows = [r for r in payload["rows"] if r["sweep"] == sweep]
    lead = ("size", "params") if sweep == "size" else ("response", "tokens / step")
    lines = ["| " + " | ".join([*lead, *(t for _, t, _ in SWEEP_COLUMNS)]) + " |",
             "|" + "---|" * (len(SWEEP_COLUMNS) + 2)]
    for r in rows:
        first = [r["size"], millions(r["params"])] if sweep == "size" else [str(r["response"]),
                                                                         f"{r['tokens_executed']:.0f}"]
        cells = ["-" if smoke and key in SMOKE_HIDDEN else fmt(r.get(key)) for key, _, fmt in SWEEP_COLUMNS]
        lines.append("| " + " | ".join(first + cells) + " |")
    return lines


def sweep_heading(payload: dict[str, Any], sweep: str) -> str:
    s = payload["settings"]
    rows = [r for r in payload["rows"] if r["sweep"] == sweep]
    r = rows[0]
    if sweep == "size":
        sizes = ", ".join(f"{z['name']} (d={z['hidden']}, {z['layers']} layers, {millions(z['params'])})"
                          for z in payload["sizes"] if any(x["size"] == z["name"] for x in rows))
        return (f"## Size sweep: {r['response']}-token responses, {r['prompt']}-token prompt, {r['batch']} pair(s), "
                f"V={s['vocab']}\n\nSizes: {sizes}.")
    return (f"## Length sweep: size {r['size']} (d={r['hidden']}, {r['layers']} layers, {millions(r['params'])}), "
            f"{r['prompt']}-token prompt, {r['batch']} pair(s), V={r.get('vocab', s['vocab'])}")


def real_shapes_section(real: dict[str, Any]) -> list[str]:
    lines = ["## Real shapes: predicted (cost model and memory model, nothing measured)", "",
             f"{real['batch_size']} pairs per step, {real['num_batches']} batches per length setting; HH-RLHF: prompt "
             f"and response lengths drawn from its quantiles, length-grouped; 512 / 2048: fixed responses after a "
             f"{real['fixed_prompt']}-token prompt. Memory: the largest step over the batches. Shapes (transformers "
             "configs with explicit arguments, built on the meta device: no weights, nothing downloaded):", ""]
    lines += [f"- {s}" for s in real.get("shapes", [])]
    lines += ["", "Assumptions:", ""]
    lines += [f"- {a}" for a in real["assumptions"]]
    lines += ["", "| lengths | shape | params (B) | LM head share | mode | tokens / step | time ratio "
              "| step memory ratio | activation memory ratio | vanilla step peak (GiB) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in real["rows"]:
        lines.append(f"| {r['lengths']} | {r['shape']} | {r['params'] / 1e9:.2f} | {r['head_share']:.1%} | {r['mode']} "
                     f"| {r['tokens_executed']:.0f} | {r['time_ratio_pred']:.2f} | {r['memory_ratio_pred']:.2f} | "
                     f"{r['activation_ratio_pred']:.2f} | {r['vanilla_peak_gib']:.1f} |")
    return lines


def to_markdown(payload: dict[str, Any]) -> str:
    """The whole report (see the module docstring)."""
    lines = ["# lit-prunedpo scaling: per-step time and memory of each mode against model size and response length",
             "", *context_lines(payload), ""]
    if payload.get("rows"):
        measure = str(payload["context"].get("memory_measure", ""))
        lines += [*definitions(measure), "", "## Prediction error", "", *summary_table(payload), ""]
        for sweep in dict.fromkeys(r["sweep"] for r in payload["rows"]):
            lines += [sweep_heading(payload, sweep), "", *sweep_table(payload, sweep), ""]
    if payload.get("real_shapes"):
        lines += [*real_shapes_section(payload["real_shapes"]), ""]
    return "\n".join(lines)


def scaling_figure(payload: dict[str, Any]) -> Any:
    """Four panels: time and memory ratio to vanilla against parameters (size sweep) and response length (length
    sweep); each mode one colour, measured solid with dots, predicted dashed; the first reference/scorer variant
    only (the tables have every one). A smoke test draws no measured time."""
    import matplotlib.pyplot as plt

    rows, smoke = payload["rows"], payload.get("smoke_test")
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(modes)}
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    sweeps = (("size", "params", "parameters"), ("length", "response", "response tokens"))
    quantities = (("time_ratio", "time ratio to vanilla"), ("memory_ratio", "step memory ratio"))
    for col, (sweep, x, label) in enumerate(sweeps):
        for row, (key, what) in enumerate(quantities):
            ax = axes[row][col]
            for mode in modes:
                pts = sorted((r[x], r[key], r[key + "_pred"]) for r in rows
                             if r["sweep"] == sweep and r["mode"] == mode and r["reference"] == rows[0]["reference"]
                             and r["scorer"] == rows[0]["scorer"])
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                ax.plot(xs, [p[2] for p in pts], "--", color=colours[mode])
                if not (smoke and key == "time_ratio") and all(p[1] is not None for p in pts):
                    ax.plot(xs, [p[1] for p in pts], "o-", color=colours[mode], label=mode)
            ax.set_xscale("log", base=10 if sweep == "size" else 2)
            ax.set_xlabel(label)
            ax.set_ylabel(what)
            ax.axhline(1.0, color="grey", linewidth=0.6)
    axes[0][0].set_title("size sweep", fontsize=10)
    axes[0][1].set_title("length sweep", fontsize=10)
    handles = [plt.Line2D([], [], color=colours[m], marker="o", label=f"{m} (measured)") for m in modes]
    handles.append(plt.Line2D([], [], color="black", linestyle="--", label="predicted"))
    fig.suptitle("lit-prunedpo scaling: ratio to vanilla" + (" (smoke test: measured time not shown)" if smoke else ""))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def write_png(payload: dict[str, Any], path: Path) -> bool:
    """:func:`scaling_figure` as a PNG; False if matplotlib is missing or there is nothing measured."""
    if not payload.get("rows"):
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = scaling_figure(payload)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def write_report(payload: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``scaling.json``, ``scaling.md`` and (with matplotlib and measured rows) ``scaling.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "scaling.json", "md": out / "scaling.md"}
    paths["json"].write_text(json.dumps(payload, indent=2) + "\n")
    paths["md"].write_text(to_markdown(payload))
    if write_png(payload, out / "scaling.png"):
        paths["png"] = out / "scaling.png"
    return paths
