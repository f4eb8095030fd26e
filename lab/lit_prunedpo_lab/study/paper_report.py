"""The paper's claim in its own form, from the records of epoch-matched cells: the table, the frontier, the plot.

A cell (:mod:`lit_prunedpo_lab.study.epochs`) holds one record per (design, seed). Against vanilla at the cell's batch
and epochs, seed by seed (same initial weights, same data):

* **time saved** ``1 - T_design / T_vanilla``, training time summed over the timed steps, on the CPU clock (the
  work done; the wall clock beside it in ``paper.json``);
* **step speedup** ``median step(vanilla) / median step(design)``;
* **peak memory ratio** ``peak(design) / peak(vanilla)``, peak step memory above the step's start;
* held-out **accuracy** and **exact DPO loss** (every position of both whole responses), and their differences.

Each is the mean over seeds with a 95 % percentile-bootstrap interval (:func:`.curves.mean_interval`).
The frontier: every design's mean training time against its mean accuracy (and loss); a design is Pareto-optimal
when no other design of its cell is at most as slow and at least as good, better in one (on the means; the
intervals say how firm that is).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from lit_prunedpo_lab.study.curves import mean_interval
from lit_prunedpo_lab.study.turns import load_summary, load_text

#: What the paper reports for each dimension, and which of our designs it is compared with.
PAPER = {
    "branch": "1.426x step vs concatenated DPO; about 30 % less training time; slight accuracy drop",
    "position": "mainly lower peak memory",
    "sequence": "mainly lower peak memory",
}
DIMENSION = {"branch": "branch", "antithetic": "branch", "position-bernoulli": "position", "position": "position",
             "stratified-coupled": "position", "stratified-coupled-exact-targets": "position",
             "position-coupled": "position", "stratified": "position", "sequence": "sequence"}
PAPER_STEP_SPEEDUP, PAPER_TIME_SAVED = 1.426, 0.30

Triple = tuple[float, float, float]


def _interval(values: Sequence[float]) -> Triple | None:
    values = [v for v in values if v is not None]
    return mean_interval(values) if len(values) >= 2 else None


def by_design(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, Mapping[str, Any]]]:
    """``{design label: {seed: record}}`` (a later record of the same design and seed replaces an earlier one)."""
    table: dict[str, dict[int, Mapping[str, Any]]] = {}
    for record in records:
        table.setdefault(record["design"], {})[int(record["seed"])] = record
    return table


def seed_coverage(cell: Mapping[str, Any]) -> tuple[list[int], dict[str, list[int]]]:
    """The seeds ``cell["records"]`` hold, and for each design of the cell the seeds its command asked for
    (``provenance["seeds"]``) that it has no record of (a cell stopped before they ran)."""
    table = by_design(cell["records"])
    asked = [int(s) for s in cell.get("provenance", {}).get("seeds", [])]
    present = sorted({seed for runs in table.values() for seed in runs})
    missing = {label: [s for s in asked if s not in table.get(label, {})] for label in cell["designs"]}
    return present, {label: seeds for label, seeds in missing.items() if seeds}


def missing_text(missing: Mapping[str, Sequence[int]]) -> str:
    """``seed 2 of every design`` / ``seeds [1, 2] of branch@8; seed 2 of vanilla@8``."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for label, seeds in missing.items():
        groups.setdefault(tuple(seeds), []).append(label)
    return "; ".join(f"seed{'s' if len(seeds) > 1 else ''} {list(seeds) if len(seeds) > 1 else seeds[0]} of "
                     + ", ".join(labels) for seeds, labels in groups.items())


def load_cell(folder: Path) -> dict[str, Any]:
    """``folder``'s ``cell.json`` with its records (of the cell's designs), the seeds present and missing in its
    provenance; a stopped cell's missing seeds and cut-off lines are said on stderr."""
    from lit_prunedpo_lab.study.outputs import read_journal, read_json

    cell = read_json(folder / "cell.json", "rerun the cell (lit-prunedpo-paper cell ... --overwrite)")
    records, bad = read_journal(folder / "records.jsonl")
    if bad:
        print(f"{folder / 'records.jsonl'}: {bad} line(s) cut off (a stopped run) skipped", file=sys.stderr)
    wanted = set(cell["designs"])
    cell["records"] = [r for r in records if r.get("design") in wanted]
    present, missing = seed_coverage(cell)
    cell["provenance"] = {**cell.get("provenance", {}), "seeds": present, "missing": missing}
    if missing:
        print(f"{folder}: no records of {missing_text(missing)} (a stopped cell; the same lit-prunedpo-paper cell "
              "command with --resume runs them): its figures pair only the seeds present", file=sys.stderr)
    return cell


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def compare(design: Mapping[int, Mapping[str, Any]], vanilla: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The paired figures of one design against vanilla over the seeds both have."""
    seeds = sorted(set(design) & set(vanilla))
    d, v = [design[s] for s in seeds], [vanilla[s] for s in seeds]
    per_seed = {
        "time_ratio": [_ratio(a["train_cpu_s"], b["train_cpu_s"]) for a, b in zip(d, v)],
        "wall_ratio": [_ratio(a["train_wall_s"], b["train_wall_s"]) for a, b in zip(d, v)],
        "step_speedup": [_ratio(b["median_step_cpu_s"], a["median_step_cpu_s"]) for a, b in zip(d, v)],
        "memory_ratio": [_ratio(a.get("peak_step_mb"), b.get("peak_step_mb")) for a, b in zip(d, v)],
        "accuracy": [a["final_accuracy"] for a in d],
        "loss": [a["final_loss"] for a in d],
        "accuracy_change": [a["final_accuracy"] - b["final_accuracy"] for a, b in zip(d, v)],
        "loss_change": [a["final_loss"] - b["final_loss"] for a, b in zip(d, v)],
        "train_cpu_s": [a["train_cpu_s"] for a in d],
    }
    out: dict[str, Any] = {"seeds": seeds, "per_seed": per_seed}
    out.update({name: _interval(values) for name, values in per_seed.items()})
    ratio = out["time_ratio"]
    out["time_saved"] = None if ratio is None else (1 - ratio[0], 1 - ratio[2], 1 - ratio[1])
    return out


def pareto(points: Mapping[str, tuple[float, float]], higher_is_better: bool) -> set[str]:
    """The labels of ``points`` (label -> (time, quality)) that no other point dominates."""
    sign = 1 if higher_is_better else -1
    front = set()
    for name, (t, q) in points.items():
        dominated = any(t2 <= t and sign * q2 >= sign * q and (t2 < t or sign * q2 > sign * q)
                        for other, (t2, q2) in points.items() if other != name)
        if not dominated:
            front.add(name)
    return front


def summarise_cell(cell: Mapping[str, Any]) -> dict[str, Any]:
    """Every design of ``cell`` against its vanilla, and the cell's Pareto-optimal designs."""
    designs = by_design(cell["records"])
    vanilla_label = cell["vanilla"]
    if vanilla_label not in designs:
        raise ValueError(f"cell {cell['name']}: no record of its vanilla design {vanilla_label!r}")
    rows = {label: compare(designs[label], designs[vanilla_label]) for label in cell["designs"] if label in designs}
    times = {label: row["train_cpu_s"][0] for label, row in rows.items() if row["train_cpu_s"]}
    accuracy = {label: (times[label], rows[label]["accuracy"][0]) for label in times}
    loss = {label: (times[label], rows[label]["loss"][0]) for label in times}
    return {"name": cell["name"], "task": cell["task"], "vanilla": vanilla_label, "rows": rows,
            "pareto_accuracy": sorted(pareto(accuracy, True), key=times.get),
            "pareto_loss": sorted(pareto(loss, False), key=times.get), "provenance": cell.get("provenance", {}),
            "load": load_summary(cell["records"], _threads(cell.get("provenance", {})))}


def _threads(provenance: Mapping[str, Any]) -> int | None:
    found = re.search(r"(\d+) torch thread", str(provenance.get("machine", "")))
    return int(found.group(1)) if found else None


def format_interval(triple: Triple | None, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    if triple is None:
        return "n/a"
    mean, low, high = (x * scale for x in triple)
    return f"{mean:{fmt}}{suffix} [{low:{fmt}}, {high:{fmt}}]"


def _direction(triple: Triple | None, at: float) -> str:
    """Where ``at`` lies against the interval: ``"below"`` (interval below it), ``"above"``, ``"within"``."""
    if triple is None:
        return "unknown"
    return "below" if triple[2] < at else "above" if triple[1] > at else "within"


def sentence(mode: str, row: Mapping[str, Any]) -> str:
    """One sentence: where this row agrees with the paper's figure for its dimension and where not."""
    dimension = DIMENSION.get(mode)
    acc = row["accuracy_change"]
    acc_words = {"below": "an accuracy drop", "above": "an accuracy gain", "within": "no detectable accuracy change",
                 "unknown": "accuracy change unknown"}[_direction(acc, 0.0)]
    if dimension == "branch":
        step = {"below": "below", "above": "above", "within": "in line with",
                "unknown": "not comparable to"}[_direction(row["step_speedup"], PAPER_STEP_SPEEDUP)]
        saved = {"below": "below", "above": "above", "within": "in line with",
                 "unknown": "not comparable to"}[_direction(row["time_saved"], PAPER_TIME_SAVED)]
        return (f"Step speedup {step} the paper's 1.426x; time saved {saved} its ~30 %; {acc_words} "
                f"(the paper: a slight drop).")
    if dimension in ("position", "sequence"):
        memory = {"below": "lower peak memory, as the paper says", "above": "higher peak memory, unlike the paper",
                  "within": "no detectable change in peak memory, unlike the paper's 'mainly lower peak memory'",
                  "unknown": "peak memory not measured here"}[_direction(row["memory_ratio"], 1.0)]
        return f"{memory[0].upper()}{memory[1:]}; {acc_words}."
    return f"The paper gives no figure for this design; {acc_words}."


def table_markdown(cells: Sequence[Mapping[str, Any]], modes: Sequence[str]) -> list[str]:
    lines = ["| cell | design | time saved | step speedup | peak memory | accuracy (vs vanilla) | exact loss (vs "
             "vanilla) | paper | where we agree, where not |", "|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        batch = cell["vanilla"].split("@")[1]  # the table's designs run at vanilla's batch and epochs
        for mode in modes:
            label = f"{mode}@{batch}"
            if label not in cell["rows"]:
                continue
            row, vanilla = cell["rows"][label], label == cell["vanilla"]
            paper = PAPER.get(DIMENSION.get(mode, ""), "" if vanilla else "not reported")
            lines.append(" | ".join([
                f"| {cell['name']}", f"`{label}`",
                "reference" if vanilla else format_interval(row["time_saved"], ".0f", 100, " %"),
                "1" if vanilla else format_interval(row["step_speedup"], ".2f", suffix="x"),
                "1" if vanilla else format_interval(row["memory_ratio"], ".2f", suffix="x"),
                format_interval(row["accuracy"], ".3f")
                + ("" if vanilla else f" ({format_interval(row['accuracy_change'], '+.3f')})"),
                format_interval(row["loss"], ".4f") + ("" if vanilla
                                                       else f" ({format_interval(row['loss_change'], '+.4f')})"),
                paper, "" if vanilla else sentence(mode, row)]) + " |")
    return lines


def pareto_markdown(cell: Mapping[str, Any]) -> list[str]:
    lines = [f"#### {cell['name']}", "",
             "| design | training time (CPU-s) | accuracy | exact loss | Pareto-optimal |", "|---|---|---|---|---|"]
    rows = sorted(cell["rows"].items(), key=lambda item: item[1]["train_cpu_s"][0] if item[1]["train_cpu_s"] else 0)
    for label, row in rows:
        marks = [name for name, key in (("accuracy", "pareto_accuracy"), ("loss", "pareto_loss")) if label in cell[key]]
        lines.append(f"| `{label}` | {format_interval(row['train_cpu_s'], '.1f')} | "
                     f"{format_interval(row['accuracy'], '.3f')} | {format_interval(row['loss'], '.4f')} | "
                     f"{', '.join(marks) or '-'} |")
    return lines + [""]


def to_markdown(summary: Mapping[str, Any]) -> str:
    cells = summary["cells"]
    lines = ["# The paper's claim, epoch-matched", "",
             "Generated by `lit-prunedpo-paper report`; each cell's command, commit, date and machine are listed "
             "at the end. Intervals: 95 % bootstrap over seeds; ratios paired by seed against vanilla; time on "
             "the CPU clock (the work each run did).", "",
             "## Epoch-matched table", "", *table_markdown(cells, summary["table_modes"]), "",
             "## Pareto frontier (accuracy and exact loss against training time)", ""]
    for cell in cells:
        lines += pareto_markdown(cell)
    lines += ["## Provenance", ""]
    for cell in cells:
        p = cell["provenance"]
        missing = f" (missing: {missing_text(p['missing'])}; a stopped cell)" if p.get("missing") else ""
        lines.append(f"- **{cell['name']}**: `{p.get('command', '?')}`; commit {p.get('commit', '?')}, "
                     f"{p.get('date', '?')}, {p.get('machine', '?')}; seeds {p.get('seeds', '?')}{missing}; "
                     f"{load_text(cell.get('load'))}")
    return "\n".join(lines) + "\n"


def figure(summary: Mapping[str, Any]) -> Any:
    """Accuracy (top) and exact loss (bottom) against training time, one column per cell; vanilla's designs in
    black, Pareto-optimal designs ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary["cells"]
    fig, axes = plt.subplots(2, len(cells), figsize=(5.2 * len(cells), 8.4), squeeze=False)
    for column, cell in enumerate(cells):
        for row_index, (key, front, name) in enumerate((("accuracy", "pareto_accuracy", "held-out accuracy"),
                                                        ("loss", "pareto_loss", "held-out exact DPO loss"))):
            ax = axes[row_index][column]
            for label, row in cell["rows"].items():
                if row["train_cpu_s"] is None or row[key] is None:
                    continue
                t, (q, low, high) = row["train_cpu_s"], row[key]
                vanilla = label.startswith("vanilla")
                ax.errorbar(t[0], q, xerr=[[t[0] - t[1]], [t[2] - t[0]]], yerr=[[q - low], [high - q]], fmt="o",
                            color="black" if vanilla else "tab:blue", ms=4, lw=0.8, capsize=2)
                if label in cell[front]:
                    ax.plot(t[0], q, "o", ms=11, mfc="none", mec="tab:red", mew=1.3)
                ax.annotate(label.replace("stratified-coupled", "strat-c").replace("min_fraction", "f")
                            .replace("chosen_probability", "q"), (t[0], q), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
            ax.set_xlabel("training time per run (CPU-s)")
            ax.set_ylabel(name)
            ax.set_title(cell["name"], fontsize=9)
            ax.grid(alpha=0.3)
    fig.suptitle("Epoch-matched designs: vanilla's in black, Pareto-optimal ringed (means, 95 % intervals over seeds)",
                 fontsize=9)
    fig.tight_layout()
    return fig
