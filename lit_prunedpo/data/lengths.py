"""Length and drop statistics of a tokenized split, their one-paragraph log form, and the warning a large share of
cut prompts or responses gets (the stats line alone shows lengths after the cut, which hide how long the data is)."""

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


#: Above this share of pairs with a cut prompt (or a cut response), the cut is a warning naming the option to raise.
TRUNCATION_WARN_SHARE = 0.2


def truncation_warnings(
    source: str,
    prompt_cut: np.ndarray,
    prompt_length: np.ndarray,
    response_cut: np.ndarray,
    response_length: np.ndarray,
    *,
    max_length: int,
    max_prompt_length: int,
    truncation: str = "keep_start",
) -> list[str]:
    """Messages for prompts or responses cut in more than :data:`TRUNCATION_WARN_SHARE` of the pairs.

    Args:
        source: how the data is named in messages.
        prompt_cut: per pair, whether its prompt was cut.
        prompt_length: per pair, its prompt's tokens before the cut.
        response_cut: per pair, whether a response was cut.
        response_length: per pair, its longer response's tokens before the cut.
        max_length: the limit of prompt + one response.
        max_prompt_length: the limit of the prompt.
        truncation: the truncation mode (``keep_end`` also cuts prompts to fit ``max_length``).

    Returns:
        Zero, one or two messages, each saying how many pairs were cut, the lengths before the cut (median, max)
        and which option to raise.
    """
    pairs = int(prompt_cut.size)
    messages = []
    cases = (
        (prompt_cut, prompt_length, "prompt", f"cut to max_prompt_length {max_prompt_length}"
         + (f" or, under truncation keep_end, to fit max_length {max_length} with the longer response"
            if truncation == "keep_end" else ""),
         "raise data.init_args.max_prompt_length (it must stay below max_length: raise that too if needed)"
         if truncation != "keep_end" else
         "raise data.init_args.max_length, and max_prompt_length where the prompts pass it"),
        (response_cut, response_length, "longer response",
         f"cut to fit max_length {max_length} together with its prompt",
         "raise data.init_args.max_length"),
    )
    for cut, length, what, how, advice in cases:
        count = int(np.count_nonzero(cut))
        if pairs == 0 or count <= TRUNCATION_WARN_SHARE * pairs:
            continue
        messages.append(
            f"{source}: {count} of {pairs} pairs ({100 * count / pairs:.0f}%) had their {what} {how}; "
            f"{what} lengths before the cut: median {np.median(length):.0f}, max {int(length.max())} tokens; "
            f"{advice} to keep more of it"
        )
    return messages
