"""Write a benchmark payload as ``bench.json``, ``bench.md`` (a markdown table) and ``bench.png`` (a chart).

The PNG needs matplotlib (the ``bench`` extra); without it the JSON and markdown are still written and the
chart is skipped with a message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

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
    ("speedup_vs_peer", "vs peer", lambda v: f"{v:.2f}x"),
)


def to_markdown(payload: dict[str, Any]) -> str:
    """A heading with the context lines and one table row per configuration."""
    lines = [
        f"# lit-prunedpo benchmark: preset `{payload['preset']}`",
        "",
        f"- device: {payload['device']} ({payload.get('device_name', '?')}), torch {payload.get('torch', '?')}, "
        f"parameters in {payload.get('dtype', 'float32')}",
        (
            f"- {payload.get('steps', '?')} measured steps per configuration after {payload.get('warmup', '?')} "
            "warm-up round(s), configurations alternating on the same weights and batches"
        ),
        f"- memory: {payload.get('memory_measure', '?')}; 'step mem' is the peak above the step's starting point",
        f"- LM head share of a vanilla forward (cost model): {payload.get('head_share', float('nan')):.1%}",
        (
            "- speedup: median step time of `vanilla` with the same reference and scorer (and the `padded` prompt "
            "when measured, else `shared`) over this configuration's; "
            "ideal: FLOP ratio from the cost model on the executed shapes; efficiency = speedup / ideal; "
            "'speedup (sums)': ratio of total step times over the same batches, the like-for-like counterpart "
            "of the ideal (which sums FLOPs over the batches)"
        ),
        "",
        "| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for row in payload["results"]:
        cells = [fmt(row[key]) if row.get(key) is not None else "n/a" for key, _, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    peer = payload.get("peer")
    if peer:
        memory = peer.get("peak_step_memory_mb")
        lines += ["", (
            f"Peer `{peer['name']}` (DPOTrainer.compute_loss with precomputed reference log-probs, backward, AdamW; same "
            f"weights, tokens and batches): median step {peer['step_time_s']:.3f} s, "
            f"step memory {'n/a' if memory is None else f'{memory:.0f} MiB'}, {peer['tokens_executed']:.0f} tokens "
            "per step (its one forward); 'vs peer' = its median step time over each configuration's."
        )]
    if payload.get("command"):
        lines += ["", f"Command: `{payload['command']}`"]
    return "\n".join(lines) + "\n"


def write_png(payload: dict[str, Any], path: Path) -> bool:
    """Speedup (measured and ideal) and peak memory per configuration; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = payload["results"]
    labels = [f"{r['mode']}\n{r['reference']}/{r['scorer']}/{r.get('prompt', 'shared')}" for r in rows]
    x = list(range(len(rows)))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(6.0, 0.9 * len(rows) + 2), 7), sharex=True)
    w = 0.4
    ax1.bar([i - w / 2 for i in x], [r["speedup"] or 0.0 for r in rows], w, label="measured")
    ax1.bar([i + w / 2 for i in x], [r["ideal_speedup"] for r in rows], w, label="ideal (FLOPs)", alpha=0.6)
    ax1.axhline(1.0, color="grey", linewidth=0.8)
    ax1.set_ylabel("speedup vs vanilla")
    ax1.legend()
    ax1.set_title(f"lit-prunedpo bench: {payload['preset']} on {payload['device']}")
    ax2.bar(x, [r["peak_memory_mb"] or 0.0 for r in rows], 0.6, label="peak")
    ax2.bar(x, [r.get("peak_step_memory_mb") or 0.0 for r in rows], 0.3, label="above step start")
    ax2.set_ylabel("peak memory (MiB)")
    ax2.legend()
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
