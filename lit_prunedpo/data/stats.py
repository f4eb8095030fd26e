"""Length and drop statistics of a tokenized split, and their one-paragraph log form."""

from __future__ import annotations

from typing import Any

import numpy as np


def summarize(lengths: np.ndarray) -> dict[str, float]:
    """Mean, median, 95th percentile and max of token counts (zeros when there are none)."""
    if lengths.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    return {
        "mean": float(lengths.mean()),
        "p50": float(np.percentile(lengths, 50)),
        "p95": float(np.percentile(lengths, 95)),
        "max": float(lengths.max()),
    }


def format_stats(stats: dict[str, Any]) -> str:
    """Render :attr:`PreferenceDataModule.stats` as a few log lines."""
    lines = [f"preference data from {stats['source']} (format: {stats['format']})"]
    for split in ("train", "val"):
        s = stats.get(split)
        if not s:
            continue
        p, r = s["prompt_tokens"], s["response_tokens"]
        bad = ", ".join(f"{k}={v}" for k, v in s["bad_rows"].items() if v) or "none"
        lines.append(
            f"  {split}: {s['pairs']} pairs of {s['rows']} rows | prompt tokens mean {p['mean']:.1f} "
            f"p50 {p['p50']:.0f} p95 {p['p95']:.0f} max {p['max']:.0f} | response tokens mean {r['mean']:.1f} "
            f"p50 {r['p50']:.0f} p95 {r['p95']:.0f} max {r['max']:.0f} | truncated prompts "
            f"{s['truncated_prompts']}, responses {s['truncated_responses']} | dropped (empty response) "
            f"{s['dropped_empty_response']} | bad rows skipped: {bad}"
        )
    return "\n".join(lines)
