"""Write a benchmark payload as ``bench.json``, ``bench.md`` (a markdown table) and ``bench.png`` (a chart).

The PNG needs matplotlib (the ``bench`` extra); without it the JSON and markdown are still written and the
chart is skipped with a message. A smoke-test preset's payload (``preset_config.smoke_test``, the ``small``
preset) states no measured speedups in the markdown or the chart: its tiny model and few steps time overheads
and noise, not pruning (two runs of ``--preset small`` gave 0.53x-1.59x for the same configurations). The JSON
keeps every number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from lit_prunedpo_lab.bench.load import under_load
from lit_prunedpo_lab.bench.rounds import baseline_prompt
from lit_prunedpo.intervals import paired_ratio_interval

COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("mode", "mode", str),
    ("reference", "reference", str),
    ("scorer", "scorer", str),
    ("prompt", "prompt", str),
    ("step_time_s", "median step (s)", lambda v: f"{v:.3f}"),
    ("step_time_p90_s", "p90 step (s)", lambda v: f"{v:.3f}"),
    ("peak_memory_mb", "peak mem (MiB)", lambda v: f"{v:.0f}"),
    ("peak_step_memory_mb", "step mem (MiB)", lambda v: f"{v:.0f}"),
    ("tokens_executed", "tokens", lambda v: f"{v:.0f}"),
    ("positions_scored", "positions", lambda v: f"{v:.0f}"),
    ("ideal_speedup", "ideal", lambda v: f"{v:.2f}x"),
    ("speedup", "speedup", lambda v: f"{v:.2f}x"),
    ("efficiency", "efficiency", lambda v: f"{v:.2f}"),
    ("speedup_total_time", "speedup (sums)", lambda v: f"{v:.2f}x"),
    ("flops", "GFLOP/step", lambda v: f"{v / 1e9:.3g}"),
    ("achieved_flops_per_s", "GFLOP/s", lambda v: f"{v / 1e9:.3g}"),
    ("utilisation", "utilisation", lambda v: f"{v:.1%}"),
)


MEASURED_SPEEDUPS = ("speedup", "efficiency", "speedup_total_time", "speedup_vs_peer")


def _above_start_only(payload: dict[str, Any]) -> bool:
    """Whether the payload's memory measure reads the step's peak above its start only (the CPU tensor meter)."""
    return "tensor storage" in str(payload.get("memory_measure", ""))


def _is_measured_speedup(key: str) -> bool:
    return key in MEASURED_SPEEDUPS or key.startswith("speedup_vs_")


def peers_of(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The payload's peer rows: ``peers``, or a payload of a single peer's ``peer``."""
    if payload.get("peers") is not None:
        return list(payload["peers"])
    return [payload["peer"]] if payload.get("peer") else []


def columns(payload: dict[str, Any]) -> list[tuple[str, str, Callable[[Any], str]]]:
    """:data:`COLUMNS` and a ``vs <peer>`` column per peer (``vs peer`` for a payload of a single peer's)."""
    rows = payload["results"]
    out = list(COLUMNS)
    for peer in peers_of(payload):
        key = f"speedup_vs_{peer['name']}"
        if not any(key in row for row in rows):
            key = "speedup_vs_peer"
        out.append((key, f"vs {peer['name'] if key != 'speedup_vs_peer' else 'peer'}", lambda v: f"{v:.2f}x"))
    return out


def is_smoke_test(payload: dict[str, Any]) -> bool:
    """Whether the payload's preset is a smoke test, whose measured speedups mean nothing."""
    return bool((payload.get("preset_config") or {}).get("smoke_test"))


def to_markdown(payload: dict[str, Any]) -> str:
    """A heading with the context lines and one table row per configuration (a smoke test's measured speedups
    are written as "-")."""
    smoke = is_smoke_test(payload)
    lines = [
        f"# lit-prunedpo benchmark: {subject(payload)}",
        "",
        *identity_lines(payload),
        f"- device: {payload['device']} ({payload.get('device_name', '?')}), torch {payload.get('torch', '?')}, "
        f"{precision_text(payload)}",
        (
            f"- {payload.get('steps', '?')} measured steps per configuration after {payload.get('warmup', '?')} "
            "warm-up round(s), configurations alternating on the same weights and batches"
        ),
        f"- memory: {payload.get('memory_measure', '?')}; 'step mem' is the peak above the step's starting point"
        + ("; 'peak mem' (the process's) is not part of this measure" if _above_start_only(payload) else ""),
        f"- LM head share of a vanilla forward (cost model): {payload.get('head_share', float('nan')):.1%}",
        (
            "- speedup: median step time of `vanilla` with the same reference and scorer (and the `padded` prompt "
            "when measured, else `shared`) over this configuration's; "
            "ideal: FLOP ratio from the cost model on the executed shapes; efficiency = speedup / ideal; "
            "'speedup (sums)': ratio of total step times over the same batches, the like-for-like counterpart "
            "of the ideal (which sums FLOPs over the batches)"
        ),
        *([(
            "- **smoke test**: this preset checks that every configuration runs; its model is too small and its "
            "steps too few for the measured speedups to mean anything, so none are stated (the ideal, from the cost "
            "model, is exact). Measure with `--preset quickstart` or larger."
        )] if smoke else []),
        *peak_lines(payload),
        *load_lines(payload),
        "",
        *table_lines(payload, smoke),
        *([] if smoke else interval_lines(payload)),
        *peer_lines(payload),
    ]
    if payload.get("command"):
        lines += ["", f"Command: `{payload['command']}`"]
    return "\n".join(lines) + "\n"


def precision_text(payload: dict[str, Any]) -> str:
    """e.g. ``precision bf16-mixed (parameters in float32, every step's forward under bfloat16 autocast)``;
    ``parameters in float32`` for a payload from before ``--precision``."""
    weights = f"parameters in {payload.get('dtype', 'float32')}"
    if "precision" not in payload:
        return weights
    autocast = payload.get("autocast_dtype")
    how = f"{weights}, every step's forward under {autocast} autocast" if autocast else weights
    peers = "; TRL peers alike" if payload.get("peers") else ""
    return f"precision {payload['precision']} ({how}{peers})"


def load_lines(payload: dict[str, Any]) -> list[str]:
    """The load the rounds ran under, and whether it marks the timings as taken under load (none for a payload
    from before the bench recorded it)."""
    load = payload.get("load")
    if not load:
        return []
    mean, top, ratio = load.get("loadavg_mean"), load.get("loadavg_max"), load.get("wall_per_cpu")
    seen = (f"load average {mean:.2f} (max {top:.2f})" if mean is not None else "load average not readable")
    line = (f"- load: {seen} beside this process's {load.get('torch_threads')} torch thread(s) on {load.get('cpus')}"
            f" CPUs" + (f", wall/CPU {ratio:.2f}" if ratio is not None else ""))
    why = under_load(load)
    return [line + (f"; **taken under load** ({why}): absolute times move with it, ratios less so" if why else "")]


def table_lines(payload: dict[str, Any], smoke: bool) -> list[str]:
    """The results' table: a row per configuration (a smoke test's measured speedups written "-")."""
    cols = columns(payload)
    lines = ["| " + " | ".join(title for _, title, _ in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in payload["results"]:
        cells = [
            "-" if smoke and _is_measured_speedup(key) else fmt(row[key]) if row.get(key) is not None else "n/a"
            for key, _, fmt in cols
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def interval_lines(payload: dict[str, Any], confidence: float = 0.95) -> list[str]:
    """Each measured ratio with its interval: a percentile bootstrap over the measured rounds (2000 resamples,
    seed 0), drawing whole rounds, since every configuration and peer ran on each round's batch
    (:func:`~lit_prunedpo.intervals.paired_ratio_interval`). Nothing for fewer than 3 rounds or a payload from
    before the rounds' step times were kept."""
    rows, peers = payload["results"], peers_of(payload)
    rounds = {len(r.get("step_times_s") or ()) for r in [*rows, *peers]}
    if len(rounds) != 1 or min(rounds) < 3:
        return []
    baseline = baseline_prompt([r["prompt"] for r in rows])

    def cell(numerator: dict[str, Any] | None, denominator: dict[str, Any]) -> str:
        if numerator is None or numerator is denominator:
            return "-"
        low, high = paired_ratio_interval(numerator["step_times_s"], denominator["step_times_s"], confidence=confidence)
        ratio = numerator["step_time_s"] / denominator["step_time_s"]
        return f"{ratio:.2f}x [{low:.2f}x, {high:.2f}x]"

    def base(row: dict[str, Any]) -> dict[str, Any] | None:
        return next((b for b in rows if b["mode"] == "vanilla" and b["prompt"] == baseline
                     and (b["reference"], b["scorer"]) == (row["reference"], row["scorer"])), None)

    titles = ["speedup", *(f"vs {p['name']}" for p in peers)]
    lines = ["", f"Ratios with {confidence * 100:g} % intervals over the {rounds.pop()} rounds (percentile bootstrap "
             "drawing whole rounds: each round ran every configuration on the same batch):", "",
             "| mode | reference | scorer | prompt | " + " | ".join(titles) + " |",
             "|" + "|".join("---" for _ in range(4 + len(titles))) + "|"]
    for row in rows:
        cells = [cell(base(row), row), *(cell(p, row) for p in peers)]
        lines.append(f"| {row['mode']} | {row['reference']} | {row['scorer']} | {row['prompt']} | "
                     + " | ".join(cells) + " |")
    return lines


def peak_lines(payload: dict[str, Any]) -> list[str]:
    """How the peak the utilisations divide by was measured (nothing for a payload without one)."""
    peak = payload.get("peak_measure")
    if not peak:
        return []
    tokens, hidden, inner = peak["shape"]
    lines = [
        f"- utilisation: achieved FLOP/s (the cost model's FLOPs per step, pruned work excluded, over the median step "
        f"time) over a peak of {peak['flops_per_s'] / 1e9:.3g} GFLOP/s measured in this run: the median of "
        f"{len(peak['times_s'])} [{tokens} x {hidden}] @ [{hidden} x {inner}] {peak['dtype']} matmuls on "
        f"{peak['device']}, {peak['threads']} torch thread(s)"
    ]
    readings = peak.get("readings_flops_per_s")
    if readings:
        before, after = (r / 1e9 for r in readings)
        lines[0] += f", the higher of the readings before ({before:.3g}) and after ({after:.3g}) the rounds"
        if min(before, after) < 0.8 * max(before, after):
            lines.append("- the two peak readings differ by more than 20 %: the machine's load changed during the run; "
                         "read its utilisations as approximate")
    return lines


def peer_lines(payload: dict[str, Any]) -> list[str]:
    """A paragraph per peer: its reference, time, memory, tokens and utilisation."""
    lines = []
    for peer in peers_of(payload):
        memory = peer.get("peak_step_memory_mb")
        reference = peer.get("reference", "a precomputed reference")
        ref_tokens = peer.get("reference_tokens_executed") or 0
        in_reference = f" and {ref_tokens:.0f} in its reference forward" if ref_tokens else ""
        rate = (f", {peer['flops'] / 1e9:.3g} GFLOP per step, {peer['achieved_flops_per_s'] / 1e9:.3g} GFLOP/s"
                + (f" ({peer['utilisation']:.1%} of the peak)" if peer.get("utilisation") is not None else "")
                if peer.get("flops") is not None else "")
        title = "peer" if not any(f"speedup_vs_{peer['name']}" in row for row in payload["results"]) else peer["name"]
        lines += ["", (
            f"Peer `{peer['name']}` (TRL DPOTrainer.compute_loss with {reference}, backward, AdamW; same weights, "
            f"tokens and batches): median step {peer['step_time_s']:.3f} s, "
            f"step memory {'n/a' if memory is None else f'{memory:.0f} MiB'}, {peer['tokens_executed']:.0f} tokens "
            f"per step in its policy forward{in_reference} (padding included){rate}; 'vs {title}' = its median step "
            "time over each configuration's."
        )]
    return lines


def subject(payload: dict[str, Any]) -> str:
    """What was measured, for titles: ``preset `small` ``, or ``model `X` `` (and ``on `data.jsonl` ``)."""
    model = payload.get("model") or {}
    if model.get("kind", "preset") == "preset":
        return f"preset `{payload['preset']}`"
    name = str(model.get("name_or_path", model.get("kind")))
    data = payload.get("data")
    return f"model `{Path(name).name if model.get('kind') != 'hub' else name}`" + (
        f" on `{Path(data['path']).name}`" if data else "")


def identity_lines(payload: dict[str, Any]) -> list[str]:
    """The model and the data measured, with what identifies them (``--model``, ``--data``); nothing for a preset."""
    model, data = payload.get("model") or {}, payload.get("data")
    if model.get("kind", "preset") == "preset":
        return []
    file = f", file sha256 `{model['file_sha256']}`" if model.get("file_sha256") else ""
    lines = [
        f"- model: `{model.get('name_or_path')}` ({model.get('kind')}{file}): {model.get('class')}, "
        f"{model.get('parameters', 0) / 1e6:.1f}M parameters in {model.get('dtype')}, layout "
        f"{payload.get('layout', '?')}; weights sha256 `{model.get('weights_sha256')}`",
    ]
    if data:
        options = ", ".join(f"{k}={v}" for k, v in data.get("options", {}).items())
        lines.append(
            f"- data: `{data['path']}` (sha256 `{data.get('sha256')}`, {data.get('format')}, {data.get('train_pairs')} "
            f"training pairs), tokenizer `{data['tokenizer']}` (hash {data.get('tokenizer_hash')}), max_length "
            f"{data['max_length']}, max_prompt_length {data['max_prompt_length']}, {data['batch_size']} pairs per "
            f"batch, seed {data['seed']}" + (f", options {options}" if options else "")
            + "; the data module's first training batches, one per round")
    else:
        lines.append("- data: random tokens with HH-RLHF's prompt and response lengths (no --data)")
    return lines


HATCHES = ("", "//", "..", "xx", "\\\\", "oo", "--", "++")


def bench_figure(payload: dict[str, Any]) -> Any:
    """The chart: configurations grouped by mode, one colour per mode and one hatch per variant (reference /
    scorer / prompt); top, the measured speedup as bars and the cost model's ideal as a black marker on each;
    bottom, each step's peak memory above the step's start (the process's total peak is mostly what it holds
    anyway, weights and allocator caches, and drawn as bars looks flat: its range is in the panel's title).
    Legends sit outside the axes.
    A smoke test draws the ideal only."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = payload["results"]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    variants = list(dict.fromkeys(_variant(r) for r in rows))
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(modes)}
    hatches = {v: HATCHES[i % len(HATCHES)] for i, v in enumerate(variants)}
    width = 0.8 / len(variants)
    where = {(m, v): i + (j - (len(variants) - 1) / 2) * width for i, m in enumerate(modes) for j,
             v in enumerate(variants)}
    smoke = is_smoke_test(payload)

    fig, (speed, memory) = plt.subplots(2, 1, figsize=(max(6.0, 1.2 * len(modes) * max(1, len(variants)) ** 0.5 + 3),
                                                       7),
                                        sharex=True)
    for r in rows:
        x, style = where[r["mode"], _variant(r)], dict(color=colours[r["mode"]], hatch=hatches[_variant(r)],
                                                       edgecolor="black", linewidth=0.5)
        if not smoke and r.get("speedup") is not None:
            speed.bar(x, r["speedup"], width, **style)
        speed.plot([x], [r["ideal_speedup"]], marker="_" if not smoke else "o", markersize=14 if not smoke else 6,
                   markeredgewidth=2 if not smoke else 0.8, markeredgecolor="black",
                   color="black" if not smoke else colours[r["mode"]], linestyle="none")
        step = r.get("peak_step_memory_mb")
        if step is not None:
            memory.bar(x, step, width, **style)
    speed.axhline(1.0, color="grey", linewidth=0.8)
    speed.set_ylabel("speedup vs vanilla" + (" (ideal only)" if smoke else ""))
    peaks = [r["peak_memory_mb"] for r in rows if r.get("peak_memory_mb") is not None]
    what = payload["preset"] if not identity_lines(payload) else subject(payload).replace("`", "")
    title = f"lit-prunedpo bench: {what} on {payload['device']}"
    if smoke:
        title += "\nsmoke test: measured speedups not shown"
    speed.set_title(title)
    memory.set_ylabel("step peak above start (MiB)")
    if peaks:
        memory.set_title(f"process peak {min(peaks):.0f}-{max(peaks):.0f} MiB ({payload.get('memory_measure', '')})",
                         fontsize=8)
    memory.set_xticks(range(len(modes)))
    memory.set_xticklabels(modes)
    ideal = plt.Line2D([], [], marker="_" if not smoke else "o", markersize=12 if not smoke else 6,
                       markeredgewidth=2 if not smoke else 0.8, color="black" if not smoke else "white",
                       markeredgecolor="black", linestyle="none", label="ideal (FLOPs)")
    speed.legend(handles=[Patch(facecolor=colours[m], edgecolor="black", label=m) for m in modes] + [ideal],
                 title="mode", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    memory.legend(handles=[Patch(facecolor="white", edgecolor="black", hatch=hatches[v], label=v) for v in variants],
                  title="reference/scorer/prompt", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def _variant(row: dict[str, Any]) -> str:
    return f"{row['reference']}/{row['scorer']}/{row.get('prompt', 'shared')}"


def write_png(payload: dict[str, Any], path: Path) -> bool:
    """:func:`bench_figure` as a PNG; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = bench_figure(payload)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight" keeps the legends outside the axes in the file
    plt.close(fig)
    return True


def write_report(payload: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``bench.json``, ``bench.md`` and (with matplotlib) ``bench.png`` under ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "md": out / "bench.md"}
    paths["json"].write_text(json.dumps(payload, indent=2) + "\n")
    paths["md"].write_text(to_markdown(payload))
    png = out / "bench.png"
    if write_png(payload, png):
        paths["png"] = png
    return paths
