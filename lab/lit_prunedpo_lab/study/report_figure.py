"""``study.png``: held-out loss and accuracy against the training clock and against steps, mean over seeds with the
min-max band, one colour per arm and one line style per kind of batch (:func:`study_figure`; needs matplotlib, a
dependency of the lab). It renders from a saved ``study.json`` too (:func:`plot`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lit_prunedpo_lab.study.curves import mean_curve
from lit_prunedpo_lab.study.outputs import atomic_path


#: Line style of an arm by its batch: the task's, enlarged to a vanilla step's cost, shrunk to a pruned step's, or
#: vanilla at the task's batch run its fastest exact way under a memory budget.
ARM_STYLES = {"same batch": "-", "compute-matched": "--", "cost-matched": ":", "memory-fitted": "-."}


def arm_kind(run: dict[str, Any]) -> str:
    """Which batch an arm runs: a key of :data:`ARM_STYLES`."""
    if run.get("matched"):
        return "compute-matched"
    if run.get("cost_matched"):
        return "cost-matched"
    return "memory-fitted" if run.get("memory_fitted") else "same batch"


def plot(payload: dict[str, Any], path: Path) -> bool:
    """Write :func:`study_figure` to ``path``; False (and nothing written) without matplotlib. Renders from a
    saved report too: ``plot(json.loads(Path("study.json").read_text()), Path("study.png"))``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = study_figure(payload)
    try:
        with atomic_path(path) as tmp:  # whole or absent
            fig.savefig(tmp, dpi=110, bbox_inches="tight")  # "tight" keeps the legend below the panels in the file
    finally:
        plt.close(fig)
    return True


def _plain_log_labels(ax: Any) -> None:
    """Label a log y axis with plain decimals (0.3, not 3 x 10^-1), the in-between ticks too: all but 7 and 9 when
    the axis spans little more than a decade, 2 and 5 up to 2.6 decades, 3 up to 4, none past that."""
    import matplotlib.ticker

    def label(value: float, _: Any) -> str:
        return f"{value:g}"

    def minor(value: float, _: Any) -> str:
        low, high = ax.get_ylim()
        decades = math.log10(high / low) if low > 0 and high > low else 3.0
        digit = round(value / 10 ** math.floor(math.log10(value) + 1e-9)) if value > 0 else 0
        shown = (2, 3, 4, 5, 6, 8) if decades <= 1.2 else (2, 5) if decades <= 2.6 else (3,) if decades <= 4 else ()
        return f"{value:g}" if digit in shown else ""

    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(label))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor))


def study_figure(payload: dict[str, Any]) -> Any:
    """The four panels as a matplotlib figure: held-out loss (top; a log axis with plain labels when it spans a
    factor of 4 or more) and accuracy (bottom), against the training clock (left) and against steps (right), each
    row on one y axis; one colour per arm, one line style per kind of batch (:data:`ARM_STYLES`), one legend of the
    arms' names below the panels; the accuracy panels span the measured values (a title says so when every arm has
    saturated them)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    clock = payload["clock"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey="row")
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for run in payload["runs"]:
        by_arm.setdefault(run["arm"], []).append(run)
    palette = plt.get_cmap("tab10" if len(by_arm) <= 10 else "tab20")
    colour = {name: palette(i % palette.N) for i, name in enumerate(by_arm)}
    accuracy_ends: list[float] = []
    losses = [p["loss"] for r in payload["runs"] for p in r["points"]]
    for name, runs in by_arm.items():
        style = dict(color=colour[name], linestyle=ARM_STYLES[arm_kind(runs[0])], linewidth=1.8)
        for col, (grid, xkey, xlabel) in enumerate(((("time", f"{clock}_s", f"training {clock.upper()} seconds")),
                                                    ("steps", "step", "steps"))):
            pts = [[p for p in r["points"] for g in p["grids"] if g == grid] for r in runs]
            xs = mean_curve([[p[xkey] for p in ps] for ps in pts])
            for row, what in enumerate(("loss", "accuracy")):
                ys = [[p[what] for p in ps] for ps in pts]
                ax = axes[row][col]
                mean = mean_curve(ys)
                ax.plot(xs, mean, label=name, **style)
                ax.fill_between(xs, [min(v) for v in zip(*ys)], [max(v) for v in zip(*ys)], alpha=0.1,
                                color=style["color"], linewidth=0)
                ax.set_xlabel(xlabel, fontsize=10)
                if what == "accuracy":
                    accuracy_ends.append(mean[-1])
    for row, what in enumerate(("loss", "accuracy")):
        axes[row][0].set_ylabel(f"held-out {what} (exact)", fontsize=10)
        for ax in axes[row]:
            ax.grid(True, which="major", alpha=0.3)
    if losses and min(losses) > 0 and max(losses) / min(losses) >= 4:  # a loss falling by decades: a log axis
        axes[0][0].set_yscale("log")  # the row shares its y axis
        _plain_log_labels(axes[0][0])
    axes[0][0].set_title(f"against training {clock.upper()} time", fontsize=10)
    axes[0][1].set_title("against steps", fontsize=10)
    if accuracy_ends and min(accuracy_ends) >= 0.995:
        for ax in axes[1]:
            ax.set_title("every arm ends at accuracy >= 0.995: the loss panels tell the arms apart", fontsize=9)
    handles = [Line2D([], [], color=colour[name], linestyle=ARM_STYLES[arm_kind(runs[0])], linewidth=1.8, label=name)
               for name, runs in by_arm.items()]
    fig.suptitle(f"{payload['task']['name']}: held-out loss and accuracy, mean over {len(payload['seeds'])} seeds "
                 "(band: min-max over seeds)", fontsize=12)
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 4),
               fontsize=10, frameon=False, handlelength=3)
    return fig
