"""The map's rows under a memory budget, from a hand-made study: the budget, the peaks of the arm and its
references, how vanilla and the pruned arm were fitted, and the GPU flag exactly where a fit accumulates."""

from __future__ import annotations

import pytest

from lit_prunedpo_lab.study.map_auto import auto_row
from lit_prunedpo_lab.study.map_report import cell_rows, map_figure, plot_map, to_markdown
from lit_prunedpo_lab.study.memory import GPU_NOTE
from lit_prunedpo_lab.study.report_markdown import memory_markdown


def _ratio(reference: str) -> dict:
    return {"verdict": "WIN", "value": 0.6, "low": 0.5, "high": 0.8, "interval_text": "0.60x [0.50x-0.80x]",
            "reference": reference}


def _arm(name: str, mode: str, micro: int = 1, fit: str = "as is", memory_fitted: bool = False,
         refs: list | None = None) -> dict:
    return {"arm": name, "mode": mode, "batch_size": 8, "matched": False, "cost_matched": "cost-matched" in name,
            "memory_fitted": memory_fitted, "fit": fit, "micro_batches": micro, "references": refs or ["vanilla@8"],
            "loss_time_ratio": _ratio((refs or ["vanilla@8"])[-1]),
            "accuracy_time_ratio": _ratio((refs or ["vanilla@8"])[-1])}


def _study(vanilla_micro: int, vanilla_fit: str) -> dict:
    fitted = f"vanilla@8 [{vanilla_fit}] (memory-fitted)"
    refs = ["vanilla@3 (cost-matched)", fitted]
    return {
        "task": {"batch_size": 8},
        "calibration": {"cost_matched": {"position-coupled": {"measured_speedup": 3.0, "batch": 3}}},
        "summary": {"arms": [_arm("vanilla@8", "vanilla"), _arm("position-coupled@8", "position-coupled", refs=refs),
                             _arm("vanilla@3 (cost-matched)", "vanilla"),
                             _arm(fitted, "vanilla", vanilla_micro, vanilla_fit, True)]},
        "memory": {"budget_mb": 100.0, "vanilla_fit": vanilla_fit,
                   "peaks": {"vanilla@8": 134.0, "position-coupled@8": 61.0, "vanilla@3 (cost-matched)": 66.6,
                             fitted: 90.0}},
    }


NOISE = {"between": 1.0, "within": {"position-coupled": 0.5}}
CELL = {"name": "near-duplicate-L64-head0.97-B8-mem100MB", "memory_budget_mb": 100.0}


def test_rows_carry_the_budget_the_peaks_and_the_fits():
    (row,) = cell_rows(CELL, _study(2, "accumulation x2"), NOISE, 0.97, ["position-coupled"])
    assert row["memory_budget_mb"] == 100.0 and row["vanilla_fit"] == "accumulation x2" and row["pruned_fit"] == "as is"
    assert row["peaks_mb"] == {"position-coupled@8": 61.0, "vanilla@3 (cost-matched)": 66.6,
                               "vanilla@8 [accumulation x2] (memory-fitted)": 90.0}
    assert row["gpu"] == GPU_NOTE  # the memory-fitted reference accumulates
    (row,) = cell_rows(CELL, _study(1, "chunked scorer"), NOISE, 0.97, ["position-coupled"])
    assert row["gpu"] is None and row["vanilla_fit"] == "chunked scorer"
    md = to_markdown({"command": "c", "study_args": "a", "plan": {"total_min": 1.0, "jobs": 1, "cpu_s": 60.0},
                      "rows": [row]})
    assert ("| 100 MB (position-coupled@8 61, vanilla@3 (cost-matched) 67, vanilla@8 [chunked scorer] (memory-fitted) "
            "90) | vanilla: chunked scorer; position-coupled: as is | no |") in md


def test_rows_without_a_budget_say_none():
    study = _study(1, "chunked scorer")
    del study["memory"]
    (row,) = cell_rows({"name": "x"}, study, NOISE, 0.97, ["position-coupled"])
    assert row["memory_budget_mb"] is None and row["gpu"] is None
    md = to_markdown({"command": "c", "study_args": "a", "plan": {"total_min": 1.0, "jobs": 1, "cpu_s": 60.0},
                      "rows": [row]})
    assert "| none | - | - |" in md


def test_a_budget_over_every_peak_is_said_to_bind_nothing():
    # 1e12 MiB: nothing is over it, so the cell ran as without a budget; the row, map.md and the study's own report say
    # so
    study = _study(1, "as is")
    study["memory"]["budget_mb"] = 1e12
    (row,) = cell_rows({**CELL, "name": "c-mem1e+12MB"}, study, NOISE, 0.97, ["position-coupled"])
    assert row["memory_binds"] is False and row["largest_peak_mb"] == 134.0
    md = to_markdown({"command": "c", "study_args": "a", "plan": {"total_min": 1.0, "jobs": 1, "cpu_s": 60.0},
                      "rows": [row]})
    assert "| 1e+12 MB (position-coupled@8 61, vanilla@3 (cost-matched) 67, " in md and ", **binds nothing**) |" in md
    assert ("Memory budgets that bind nothing (every arm's measured peak is under the budget, so these cells ran as "
            "without it and the memory axis decides nothing there): c-mem1e+12MB (1e+12 MB; largest peak 134.0 "
            "MB).") in md
    record = {**study["memory"], "measure": "peak RSS", "tables": {}, "references": ["vanilla@8"], "over": [],
              "gpu_needed": False, "gpu_note": GPU_NOTE}
    assert ("- **The memory budget of 1e+12 MB binds nothing: no arm's peak step memory is over it (the largest: "
            "vanilla@8, 134.0 MB), so every arm ran as it would without it and the verdicts say nothing about training "
            "under a memory limit**.") in memory_markdown(record, "cpu")
    # a budget that binds says nothing of the kind
    (row,) = cell_rows(CELL, _study(1, "chunked scorer"), NOISE, 0.97, ["position-coupled"])
    assert row["memory_binds"] is True
    md = to_markdown({"command": "c", "study_args": "a", "plan": {"total_min": 1.0, "jobs": 1, "cpu_s": 60.0},
                      "rows": [row]})
    assert "binds nothing" not in md and "bind nothing" not in md


def _timed_study() -> dict:
    """Same-batch vanilla and position-coupled with per-seed times to the loss target (None: not reached)."""
    arm = lambda name, mode, times, batch=8, cost=False: {  # noqa: E731
        "arm": name, "mode": mode, "batch_size": batch, "matched": False, "cost_matched": cost,
        "loss_seed_times": times,
        "steps_in_budget": 100.0}
    return {"task": {"batch_size": 8}, "budget_s": 10.0, "clock": "cpu",
            "summary": {"resamples": 200, "confidence": 0.95, "bootstrap_seed": 0, "arms": [
                arm("vanilla@8", "vanilla", [4.0, 5.0, 6.0]),
                arm("position-coupled@8", "position-coupled", [2.0, 3.0, 9.5]),
                arm("vanilla@3 (cost-matched)", "vanilla", [1.0, 1.0, 1.0], batch=3, cost=True)]}}


CAL = {"reason": "r", "pairs": 8, "draws": 4, "arms": [{}, {}, {}]}  # vanilla + 2 candidates: up to 21 steps of work


def test_auto_row_skips_the_calibration_in_a_run_too_short_to_repay_it():
    # 100 steps in the budget: 21 > 0.02 x 100, so auto trains vanilla with no calibration, exactly vanilla's times
    row = auto_row({"name": "c"}, _timed_study(), {**CAL, "choice": "position-coupled", "calibration_cpu_s": 0.4})
    assert (row["choice"], row["calibrated"], row["calibrated_choice"]) == ("vanilla", False, "position-coupled")
    assert row["calibration_s"] == 0.0 and row["forced_calibration_s"] == 0.4 and row["run_steps"] == 100
    assert row["loss_ratio"] == 1.0 and row["met"] and "calibration skipped" in row["reason"]
    # a long enough run calibrates: 21 <= 0.25 x 100
    assert auto_row({"name": "c"}, _timed_study(), {**CAL, "choice": "position-coupled", "calibration_cpu_s": 0.4},
                    0.25)["calibrated"]


def test_auto_row_adds_the_calibration_to_the_chosen_arm():
    # vanilla chosen: (4 + 5 + 6 + 3 x 0.75) / 15 = 1.15; the cost-matched arm is not what auto runs
    row = auto_row({"name": "c"}, _timed_study(), {**CAL, "choice": "vanilla", "calibration_cpu_s": 0.75}, None)
    assert row["loss_ratio"] == pytest.approx(17.25 / 15) and not row["met"]
    assert row["calibration_share_of_vanilla"] == pytest.approx(0.75 / 5.0)
    # position-coupled chosen: (2.4 + 3.4 + 9.9) / 15 = 1.047, within 1.05
    row = auto_row({"name": "c"}, _timed_study(), {**CAL, "choice": "position-coupled", "calibration_cpu_s": 0.4}, None)
    assert row["loss_ratio"] == pytest.approx(15.7 / 15) and row["met"]
    # a calibration that pushes a seed past the budget (9.5 + 0.6 > 10): that seed missed the target, as in the study
    row = auto_row({"name": "c"}, _timed_study(), {**CAL, "choice": "position-coupled", "calibration_cpu_s": 0.6}, None)
    assert row["loss_ratio"] is None and row["loss_text"].startswith("not reached") and not row["met"]


def test_the_plot_draws_ratios_that_were_not_reached(tmp_path):
    # "not reached" is null in map.json (the study's JSON has no infinity): drawn as an arrow at the edge
    rows = [{"name": "a", "mode": "position-coupled", "loss_ratio": None, "loss_interval": [None, None]},
            {"name": "a", "mode": "antithetic", "loss_ratio": 1.2, "loss_interval": [0.9, None]},
            {"name": "b", "mode": "position-coupled", "loss_ratio": 0.8, "loss_interval": [0.6, 0.95]}]
    auto = [{"name": "a", "loss_ratio": 1.01, "loss_interval": [1.0, 1.02]}]
    assert plot_map({"rows": rows, "auto_rows": auto}, tmp_path / "map.png")
    assert (tmp_path / "map.png").stat().st_size > 0
    # the misses sit in a column of their own, labelled "n.r."; the legend is below the axis, readable
    import matplotlib.pyplot as plt

    fig = map_figure({"rows": rows, "auto_rows": auto})
    (ax,) = fig.axes
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "n.r."
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()][:3] == ["position-coupled", "antithetic",
                                                             "auto (vs same-batch vanilla)"]
    assert legend.get_window_extent().y1 <= ax.get_window_extent().y0 and legend.get_texts()[0].get_fontsize() >= 9
    plt.close(fig)
    with pytest.raises(ValueError, match="no same-batch arm of 'antithetic'"):
        auto_row({"name": "c"}, _timed_study(), {**CAL, "choice": "antithetic", "calibration_cpu_s": 1.0}, None)
