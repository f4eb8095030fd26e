"""The regime map's outputs: one row per (cell, mode) from the cell's ``study.json`` and noise measurement,
written to ``map.json`` and ``map.md``.

A row holds the pruned arm's (the cell's batch) verdict, time ratio and bootstrap interval against the better
vanilla on the loss and the accuracy target (:mod:`lit_prunedpo.study.curves`), the calibrated cost ratio
``k`` (vanilla step / pruned step at the cell's batch, from the fitted vanilla line; the cost-matched
batch beside it), the LM head's share of a vanilla step (cost model), and the noise model
(:mod:`lit_prunedpo.study.noise`): ``between``, the mode's ``within``, the budget ``(k - 1) between``, the
prediction and whether the measured loss verdict agrees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from lit_prunedpo.study.noise import agreement, predict


def cell_rows(cell: Mapping[str, Any], study: Mapping[str, Any], noise: Mapping[str, Any], head_share: float,
              modes: Sequence[str]) -> list[dict[str, Any]]:
    """One row per pruned mode of a finished cell.

    Raises:
        ValueError: if the study has no same-batch arm or no calibration for a mode.
    """
    batch = study["task"]["batch_size"]
    arms = {(r["mode"], r["batch_size"], r["matched"], r["cost_matched"]): r for r in study["summary"]["arms"]}
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
            "loss_interval": [loss["low"], loss["high"]], "loss_text": loss["interval_text"], "loss_reference": loss["reference"],
            "accuracy_verdict": accuracy["verdict"], "accuracy_text": accuracy["interval_text"],
            "accuracy_reference": accuracy["reference"], "between": between, "within": within,
            "variance_budget": (k - 1.0) * between, "prediction": prediction,
            "agreement": agreement(prediction, loss["verdict"]),
        })
    return rows


def to_markdown(payload: Mapping[str, Any]) -> str:
    """``map.md``: the settings, one table row per (cell, mode), one line per row on the noise model's prediction."""
    rows = payload["rows"]
    lines = [
        "# Regime map", "",
        f"Command: `{payload['command']}`", "",
        f"Per cell: the study protocol (`lit-prunedpo-study`, its report under `cells/<cell>/`) with {payload['study_args']}; "
        f"planned {payload['plan']['total_min']:.1f} min on {payload['plan']['jobs']} cores ({payload['plan']['cpu_s'] / 60:.1f} CPU-min); "
        f"the {payload.get('cells_done', 0)} finished cells took {payload.get('elapsed_min', float('nan')):.1f} CPU-min, "
        f"{payload.get('elapsed_wall_min', float('nan')):.1f} min of wall time. "
        "Verdicts on the loss target against the better vanilla (same batch or cost-matched), with the "
        "95 % bootstrap interval over seeds. k: calibrated cost ratio, vanilla step / pruned step at the cell's batch. "
        "Noise model at the initial weights: between = trace of the per-pair gradient covariance, within = the "
        "mode's extra within-pair variance; prediction: prune better iff within < (k - 1) between.", "",
        "| cell | mode | head share | k (batch) | loss verdict | loss ratio [interval] | accuracy verdict | between | "
        "within | (k-1) between | prediction |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['mode']} | {r['head_share']:.3f} | {r['k']:.2f} ({r['cost_matched_batch']}) | "
            f"**{r['loss_verdict']}** | {r['loss_text']} vs {r['loss_reference']} | {r['accuracy_verdict']} {r['accuracy_text']} | "
            f"{r['between']:.4g} | {r['within']:.4g} | {r['variance_budget']:.4g} | {r['prediction']} |")
    lines += ["", "Noise model against the measurement (loss verdict):", ""]
    lines += [f"- {r['name']}, {r['mode']}: predicted {r['prediction']}; measured {r['loss_verdict']}: {r['agreement']}"
              for r in rows]
    missing = payload.get("unfinished") or []
    if missing:
        lines += ["", f"Not finished: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def write_map(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """Write ``map.json`` and ``map.md`` under ``out``; returns the paths."""
    paths = [out / "map.json", out / "map.md"]
    paths[0].write_text(json.dumps(payload, indent=1))
    paths[1].write_text(to_markdown(payload))
    return paths
