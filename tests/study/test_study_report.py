"""study.png: one colour per mode, one line style per kind of batch, the legend outside the panels
(lit_prunedpo.study.report.study_figure), on hand-made runs."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from lit_prunedpo.study.report import ARM_STYLES, plot, study_figure  # noqa: E402


def _run(arm: str, mode: str, seed: int, accuracy: float, **kind: bool) -> dict:
    points = [{"grids": ["time", "steps"], "cpu_s": t, "step": 10 * t, "loss": 0.7 - 0.1 * t - 0.01 * seed,
               "accuracy": min(1.0, accuracy + 0.05 * t)} for t in range(4)]
    return {"arm": arm, "mode": mode, "seed": seed, "points": points, **kind}


def _payload(accuracy: float = 0.5) -> dict:
    arms = [("vanilla@16", "vanilla", {}), ("vanilla@5 (cost-matched)", "vanilla", {"cost_matched": True}),
            ("position@16", "position", {}), ("position@46 (matched)", "position", {"matched": True}),
            ("branch@16", "branch", {})]
    runs = [_run(arm, mode, seed, accuracy, **kind) for arm, mode, kind in arms for seed in (0, 1)]
    return {"clock": "cpu", "runs": runs, "seeds": [0, 1], "task": {"name": "hand-made"}}


def test_one_colour_per_mode_one_style_per_batch_and_the_legend_outside():
    fig = study_figure(_payload())
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert len(lines) == 5
    colours = {name: to_hex(line.get_color()) for name, line in lines.items()}
    assert colours["vanilla@16"] == colours["vanilla@5 (cost-matched)"] != colours["position@16"]
    assert colours["position@16"] == colours["position@46 (matched)"] != colours["branch@16"]
    assert len(set(colours.values())) == 3  # three modes
    styles = {name: line.get_linestyle() for name, line in lines.items()}
    assert styles["vanilla@16"] == styles["position@16"] == "-"
    assert styles["vanilla@5 (cost-matched)"] == ":" and styles["position@46 (matched)"] == "--"
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["vanilla", "branch", "position", *ARM_STYLES]
    fig.canvas.draw()
    right_of_panels = max(a.get_position().x1 for a in fig.axes)
    assert legend.get_window_extent().transformed(fig.transFigure.inverted()).x0 >= right_of_panels
    assert not fig.axes[2].get_title()  # accuracy not saturated: no note
    plt.close(fig)


def test_saturated_accuracy_panels_say_so(tmp_path):
    fig = study_figure(_payload(accuracy=1.0))
    assert "accuracy >= 0.995" in fig.axes[2].get_title() and "accuracy >= 0.995" in fig.axes[3].get_title()
    plt.close(fig)
    assert plot(_payload(), tmp_path / "study.png") and (tmp_path / "study.png").stat().st_size > 0
