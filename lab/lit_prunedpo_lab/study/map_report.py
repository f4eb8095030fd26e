"""The regime map's outputs: one row per (cell, mode) from the cell's ``study.json`` and noise measurement, and
one ``auto`` row per cell (:mod:`lit_prunedpo_lab.study.map_auto`), written to ``map.json`` and ``map.md``.

A row holds the pruned arm's (the cell's batch) verdict, time ratio and bootstrap interval against the better
vanilla on the loss and the accuracy target (:mod:`lit_prunedpo_lab.study.curves`), the calibrated cost ratio
``k`` (vanilla step / pruned step at the cell's batch, from the fitted vanilla line; the cost-matched
batch beside it), the LM head's share of a vanilla step (cost model), and the noise model
(:mod:`lit_prunedpo_lab.study.noise`): ``between``, the mode's ``within``, the budget ``(k - 1) between``, the
prediction and whether the measured loss verdict agrees. Under a memory budget, also: the budget, every arm's
measured peak step memory, how vanilla (and the pruned arm, if it was over) was fitted, and ``gpu``: the
verdict leans on gradient accumulation (the pruned arm's fit or a reference's), nearly free on the CPU but not
on a GPU, so it is a CPU verdict that a GPU must confirm (:data:`lit_prunedpo_lab.study.memory.GPU_NOTE`). A budget
over every arm's peak binds nothing (``memory_binds`` false): the row and a line of ``map.md`` say that the memory
axis decides nothing in that cell. The files are written whole (:mod:`lit_prunedpo_lab.study.outputs`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from lit_prunedpo.callbacks import DEFAULT_MAX_SHARE
from lit_prunedpo_lab.study.memory import GPU_NOTE, budget_binds, largest_peak
from lit_prunedpo_lab.study.noise import agreement, predict
from lit_prunedpo_lab.study.outputs import atomic_path, write_atomic


def cell_rows(cell: Mapping[str, Any], study: Mapping[str, Any], noise: Mapping[str, Any], head_share: float,
              modes: Sequence[str]) -> list[dict[str, Any]]:
    """One row per pruned mode of a finished cell.

    Raises:
        ValueError: if the study has no same-batch arm or no calibration for a mode.
    """
    batch = study["task"]["batch_size"]
    arms = {(r["mode"], r["batch_size"], r["matched"], r["cost_matched"]): r for r in study["summary"]["arms"]
            if not r.get("memory_fitted")}
    by_name = {r["arm"]: r for r in study["summary"]["arms"]}
    memory = study.get("memory")
    rows = []
    for mode in modes:
        arm = arms.get((mode, batch, False, False))
        calibration = study.get("calibration", {}).get("cost_matched", {}).get(mode)
        if arm is None or calibration is None:
            raise ValueError(f"cell {cell['name']}: the study has no {mode}@{batch} arm or no calibration for it")
        k = calibration["measured_speedup"]
        between, within = noise["between"], noise["within"][mode]
        prediction = predict(between, within, k)
        loss, accuracy = arm["loss_time_ratio"], arm["accuracy_time_ratio"]
        rows.append({
            **cell, "mode": mode, "arm": arm["arm"], "head_share": head_share, "k": k,
            "cost_matched_batch": calibration["batch"], "loss_verdict": loss["verdict"], "loss_ratio": loss["value"],
            "loss_interval": [loss["low"], loss["high"]], "loss_text": loss["interval_text"],
            "loss_reference": loss["reference"],
            "accuracy_verdict": accuracy["verdict"], "accuracy_text": accuracy["interval_text"],
            "accuracy_reference": accuracy["reference"], "between": between, "within": within,
            "variance_budget": (k - 1.0) * between, "prediction": prediction,
            "agreement": agreement(prediction, loss["verdict"]),
            **_memory_columns(memory, arm, by_name),
        })
    return rows


def _memory_columns(memory: Mapping[str, Any] | None, arm: Mapping[str, Any],
                    by_name: Mapping[str, Any]) -> dict[str, Any]:
    if memory is None:
        return {"memory_budget_mb": None, "peaks_mb": None, "vanilla_fit": None, "pruned_fit": None, "gpu": None,
                "memory_binds": None, "largest_peak_mb": None}
    involved = [arm, *(by_name[n] for n in arm["references"] if n in by_name)]
    gpu = any(r.get("micro_batches", 1) > 1 for r in involved)
    peaks = {n: memory["peaks"][n] for n in [arm["arm"], *arm["references"]] if n in memory["peaks"]}
    return {"memory_budget_mb": memory["budget_mb"], "peaks_mb": peaks,
            "vanilla_fit": memory["vanilla_fit"], "pruned_fit": arm.get("fit", "as is"),
            "gpu": GPU_NOTE if gpu else None,
            "memory_binds": budget_binds(memory), "largest_peak_mb": (largest_peak(memory) or (None, None))[1]}


def _memory_text(r: Mapping[str, Any]) -> str:
    if r.get("memory_budget_mb") is None:
        return "none | - | - |"
    peaks = ", ".join(f"{n} {p:.0f}" for n, p in r["peaks_mb"].items())
    binds = "" if r.get("memory_binds", True) is not False else ", **binds nothing**"
    return (f"{r['memory_budget_mb']:g} MB ({peaks}{binds}) | vanilla: {r['vanilla_fit']}; {r['mode']}: "
            f"{r['pruned_fit']} | {r['gpu'] or 'no'} |")


def _auto_lines(auto: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ``## auto`` section of ``map.md``: one row per cell on what ``AutoPruning`` does (nothing without rows)."""
    if not auto:
        return []
    met = sum(r["met"] for r in auto)
    lines = ["", "## auto", "",
             "What the `AutoPruning` callback (its defaults, on the cell's first vanilla batch at the initial "
             "weights) does in each cell, and its time to the loss target against same-batch vanilla, the "
             "calibration's seconds added to every seed when it runs (it is skipped when its work exceeds "
             f"`max_share` {DEFAULT_MAX_SHARE:g} of the run's steps: here vanilla's steps in the budget). Target: "
             f"at most 1.05x in every cell; met in {met} of {len(auto)}. The calibration was also run in every "
             "cell regardless (forced), to show what it picks and what it costs.", "",
             "| cell | auto | loss time vs vanilla [interval] | <= 1.05 | forced calibration: pick, CPU-s (share "
             "of vanilla's time to target) | why |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in auto:
        share = "-" if r["calibration_share_of_vanilla"] is None else f"{r['calibration_share_of_vanilla']:.0%}"
        run = (f"{r['choice']} (calibrated)" if r["calibrated"]
               else f"{r['choice']} (skipped, {r['run_steps']} steps)")
        lines.append(f"| {r['name']} | {run} | {r['loss_text']} | {'yes' if r['met'] else '**no**'} | "
                     f"{r['calibrated_choice']}, {r['forced_calibration_s']:.2f} ({share}) | {r['reason']} |")
    return lines


def to_markdown(payload: Mapping[str, Any]) -> str:
    """``map.md``: the settings, one table row per (cell, mode), one line per row on the noise model's prediction."""
    rows = payload["rows"]
    lines = [
        "# Regime map", "",
        f"Command: `{payload['command']}`", "",
        "Per cell: the study protocol (`lit-prunedpo-study`, its report under `cells/<cell>/`) with "
        f"{payload['study_args']}; planned {payload['plan']['total_min']:.1f} min on {payload['plan']['jobs']} cores "
        f"({payload['plan']['cpu_s'] / 60:.1f} CPU-min); the {payload.get('cells_done', 0)} finished cells took "
        f"{payload.get('elapsed_min', float('nan')):.1f} CPU-min, {payload.get('elapsed_wall_min', float('nan')):.1f} "
        "min of wall time. Verdicts on the loss target against the better vanilla (same batch or cost-matched), with "
        "the 95 % bootstrap interval over seeds. k: calibrated cost ratio, vanilla step / pruned step at the cell's "
        "batch. Noise model at the initial weights: between = trace of the per-pair gradient covariance, within = the "
        "mode's extra within-pair variance; prediction: prune better iff within < (k - 1) between. "
        "Memory budget: a cap on each arm's measured peak step memory (MB above the step's start; the peaks of the arm "
        "and its references in brackets); an arm over it runs its fastest exact fit, and the reference is the better "
        f"vanilla that fits. GPU: '{GPU_NOTE}' where a fit uses gradient accumulation (nearly free on the CPU only).",
        "",
        "| cell | mode | head share | k (batch) | loss verdict | loss ratio [interval] | accuracy verdict | between | "
        "within | (k-1) between | prediction | memory budget (peaks, MB) | fitted | GPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['mode']} | {r['head_share']:.3f} | {r['k']:.2f} ({r['cost_matched_batch']}) | "
            f"**{r['loss_verdict']}** | {r['loss_text']} vs {r['loss_reference']} | {r['accuracy_verdict']} "
            f"{r['accuracy_text']} | {r['between']:.4g} | {r['within']:.4g} | {r['variance_budget']:.4g} | "
            f"{r['prediction']} | {_memory_text(r)}")
    loose = {r["name"]: r for r in rows if r.get("memory_binds") is False}
    if loose:
        lines += ["", "Memory budgets that bind nothing (every arm's measured peak is under the budget, so these "
                  "cells ran as without it and the memory axis decides nothing there): "
                  + ", ".join(f"{n} ({r['memory_budget_mb']:g} MB; "
                              + ("no peak measured)" if r["largest_peak_mb"] is None
                                 else f"largest peak {r['largest_peak_mb']:.1f} MB)")
                              for n, r in loose.items())
                  + "."]
    lines += ["", "Noise model against the measurement (loss verdict):", ""]
    lines += [f"- {r['name']}, {r['mode']}: predicted {r['prediction']}; measured {r['loss_verdict']}: {r['agreement']}"
              for r in rows]
    lines += _auto_lines(payload.get("auto_rows") or [])
    missing = payload.get("unfinished") or []
    if missing:
        lines += ["", f"Not finished: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def write_map(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """Write ``map.json``, ``map.md`` and (with matplotlib) ``map.png`` under ``out``, each whole; returns the paths
    written.

    Raises:
        OutputError: naming the file that could not be written (a full disk: ``disk full``).
    """
    paths = [out / "map.json", out / "map.md"]
    write_atomic(paths[0], json.dumps(payload, indent=1))
    write_atomic(paths[1], to_markdown(payload))
    if payload["rows"] and plot_map(payload, out / "map.png"):
        paths.append(out / "map.png")
    return paths


def plot_map(payload: Mapping[str, Any], path: Path) -> bool:
    """Write :func:`map_figure` to ``path`` (``map.png``); False (nothing written) without matplotlib. Renders from a
    saved map too: ``plot_map(json.loads(Path("map.json").read_text()), Path("map.png"))``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = map_figure(payload)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")  # "tight" keeps the legend below the axis in the file
    finally:
        plt.close(fig)
    return True


def map_figure(payload: Mapping[str, Any]) -> Any:
    """The map as a matplotlib figure: per cell (one shaded band each), each mode's time to the loss target as a ratio
    to the better vanilla (and ``auto``'s to same-batch vanilla) with its 95 % interval, on a log axis with lines at
    1 (no gain) and 0.7 (the map's target) and the side where pruning is faster shaded; an arm that missed the
    target on some seed (ratio inf) is drawn in a column of its own right of the axis, "n.r.", its interval's finite
    lower end joined to it. The legend sits below the axis."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    series = _series(payload)
    cells = list(dict.fromkeys(r["name"] for r in payload["rows"]))
    finite = [v for s in series.values() for t in s.values() for v in t if math.isfinite(v) and v > 0]
    lo, hi = min(finite + [0.5]) / 1.2, max(finite + [2.0]) * 1.2
    missed_x = hi * 1.3  # the "n.r." column, right of the measured range
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(cells) + 1.8))
    for i in range(0, len(cells), 2):
        ax.axhspan(len(cells) - 1 - i - 0.5, len(cells) - 1 - i + 0.5, color="0.93", zorder=0, linewidth=0)
    ax.axvspan(lo, 1.0, color="tab:green", alpha=0.06, zorder=0, linewidth=0)
    step = 0.6 / max(1, len(series))
    offsets = [step * ((len(series) - 1) / 2 - i) for i in range(len(series))]  # the first series on top
    handles = [_draw_series(ax, name, values, cells, dy, marker, hi, missed_x)
               for (name, values), dy, marker in zip(series.items(), offsets, "osD^v<>")]
    _format_axes(ax, cells, lo, hi, missed_x)
    handles += [Line2D([], [], color="black", lw=1.0, label="1x: no gain"),
                Line2D([], [], color="grey", lw=1.0, ls="--", label="0.7x: the target")]
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 5), fontsize=10,
               frameon=False)
    return fig


def _series(payload: Mapping[str, Any]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per mode (and ``auto``), per cell: the loss time ratio and its interval, "not reached" as infinity."""
    def triple(r: Mapping[str, Any]) -> tuple[float, float, float]:  # "not reached" is None in the study's JSON
        return tuple(math.inf if v is None else float(v) for v in (r["loss_ratio"], *r["loss_interval"]))  # type: ignore[return-value]

    series: dict[str, dict[str, tuple[float, float, float]]] = {}
    for r in payload["rows"]:
        series.setdefault(r["mode"], {})[r["name"]] = triple(r)
    for r in payload.get("auto_rows") or []:
        series.setdefault("auto (vs same-batch vanilla)", {})[r["name"]] = triple(r)
    return series


def _draw_series(ax: Any, name: str, values: Mapping[str, tuple[float, float, float]], cells: Sequence[str], dy: float,
                 marker: str, hi: float, missed_x: float) -> Any:
    """One series' ratios with their intervals, each cell's row shifted by ``dy``; a ratio not reached drawn at
    ``missed_x``, joined to its interval's finite lower end. Returns the series' legend handle."""
    from matplotlib.lines import Line2D

    ys, xs, lows, highs, missed, missed_lows = [], [], [], [], [], []
    for i, cell in enumerate(cells):
        if cell not in values:
            continue
        value, low, high = values[cell]
        y = len(cells) - 1 - i + dy
        if not math.isfinite(value):
            missed.append(y)
            missed_lows.append(low)
            continue
        ys.append(y)
        xs.append(value)
        lows.append(value - low if math.isfinite(low) else 0.0)
        highs.append(min(high, hi) - value if math.isfinite(high) else missed_x - value)
    line = ax.errorbar(xs, ys, xerr=[lows, highs], fmt=marker, markersize=7, capsize=3, zorder=3)
    colour = line[0].get_color()
    for y, low in zip(missed, missed_lows):
        if math.isfinite(low):  # the interval reaches from a measured ratio to "not reached"
            ax.plot([low, missed_x], [y, y], color=colour, lw=1.2, zorder=2)
            ax.plot([low], [y], "|", color=colour, markersize=7, zorder=2)
    if missed:
        ax.plot([missed_x] * len(missed), missed, ">", color=colour, markersize=8, zorder=3)
    return Line2D([], [], color=colour, marker=marker, markersize=7, linestyle="-", label=name)


def _format_axes(ax: Any, cells: Sequence[str], lo: float, hi: float, missed_x: float) -> None:
    """The reference lines (1x, 0.7x, the edge of the measured range), the log axis with its "n.r." column, the cell
    names, the labels and the title."""
    import matplotlib.ticker

    ax.axvline(1.0, color="black", lw=1.0, zorder=1)
    ax.axvline(0.7, color="grey", lw=1.0, ls="--", zorder=1)
    ax.axvline(hi * 1.1, color="0.6", lw=0.8, ls=":", zorder=1)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi * 1.6)
    ax.set_ylim(-0.5, len(cells) - 0.5)
    ax.set_yticks(range(len(cells)), list(reversed(cells)), fontsize=9)
    ax.xaxis.set_major_formatter(
        matplotlib.ticker.FuncFormatter(lambda v, _: "n.r." if math.isclose(v, missed_x) else f"{v:g}x"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks([t for t in (0.25, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0) if lo <= t <= hi] + [missed_x])
    ax.tick_params(axis="x", labelsize=10)
    ax.set_xlabel("time to the loss target / the better vanilla's (log scale)\n"
                  "left of 1x: pruning faster; n.r.: target not reached on some seed", fontsize=10)
    ax.set_title("Regime map: time to the loss target per cell and mode, 95 % intervals", fontsize=12)
