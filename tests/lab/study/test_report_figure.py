"""study.png: one colour per arm, one line style per kind of batch, one legend of the arms below the panels, loss
on a log axis with plain labels when it falls by decades (report_figure.study_figure), on hand-made
runs."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from lit_prunedpo_lab.study.report_figure import ARM_STYLES, plot, study_figure  # noqa: E402


def _run(arm: str, mode: str, seed: int, accuracy: float, **kind: bool) -> dict:
    points = [{"grids": ["time", "steps"], "cpu_s": t, "step": 10 * t, "loss": 0.7 - 0.1 * t - 0.01 * seed,
               "accuracy": min(1.0, accuracy + 0.05 * t)} for t in range(4)]
    return {"arm": arm, "mode": mode, "seed": seed, "points": points, **kind}


def _payload(accuracy: float = 0.5, decades: bool = False) -> dict:
    arms = [("vanilla@16", "vanilla", {}), ("vanilla@5 (cost-matched)", "vanilla", {"cost_matched": True}),
            ("vanilla@4 (cost-matched)", "vanilla", {"cost_matched": True}),
            ("vanilla@16 [chunked scorer] (memory-fitted)", "vanilla", {"memory_fitted": True}),
            ("position@16", "position", {}), ("position@46 (matched)", "position", {"matched": True}),
            ("branch@16", "branch", {})]
    runs = [_run(arm, mode, seed, accuracy, **kind) for arm, mode, kind in arms for seed in (0, 1)]
    if decades:
        for run in runs:
            for p in run["points"]:
                p["loss"] = 0.7 * 10 ** -p["cpu_s"]
    return {"clock": "cpu", "runs": runs, "seeds": [0, 1], "task": {"name": "hand-made"}}


def test_one_colour_per_arm_one_style_per_batch_and_the_legend_below():
    fig = study_figure(_payload())
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert len(lines) == 7
    colours = {name: to_hex(line.get_color()) for name, line in lines.items()}
    assert len(set(colours.values())) == 7  # two cost-matched vanillas are told apart
    styles = {name: line.get_linestyle() for name, line in lines.items()}
    assert styles["vanilla@16"] == styles["position@16"] == styles["branch@16"] == ARM_STYLES["same batch"] == "-"
    assert styles["vanilla@5 (cost-matched)"] == styles["vanilla@4 (cost-matched)"] == ":"
    assert styles["position@46 (matched)"] == "--" and styles["vanilla@16 [chunked scorer] (memory-fitted)"] == "-."
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == list(lines)
    legend_colours = [to_hex(h.get_color()) for h in legend.legend_handles]
    assert legend_colours == [colours[name] for name in lines]
    fig.canvas.draw()
    below_panels = min(a.get_position().y0 for a in fig.axes)
    assert legend.get_window_extent().transformed(fig.transFigure.inverted()).y1 <= below_panels
    assert ax.get_yscale() == "linear"  # a loss that does not fall by decades stays on a linear axis
    assert not fig.axes[2].get_title()  # accuracy not saturated: no note
    plt.close(fig)


def test_a_loss_falling_by_decades_is_on_a_log_axis_with_plain_labels():
    fig = study_figure(_payload(decades=True))
    ax = fig.axes[0]
    assert ax.get_yscale() == fig.axes[1].get_yscale() == "log"
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "0.01" in labels and "0.1" in labels and not any("10^" in t or "times" in t for t in labels)
    plt.close(fig)


def test_saturated_accuracy_panels_say_so(tmp_path):
    fig = study_figure(_payload(accuracy=1.0))
    assert "accuracy >= 0.995" in fig.axes[2].get_title() and "accuracy >= 0.995" in fig.axes[3].get_title()
    plt.close(fig)
    assert plot(_payload(), tmp_path / "study.png") and (tmp_path / "study.png").stat().st_size > 0
