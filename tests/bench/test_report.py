"""The benchmark's report: the chart's structure (one colour per mode, one hatch per variant, legends outside the
axes, a memory panel of step peaks) and a smoke test's reports stating no measured speedup."""

from __future__ import annotations

import re

import pytest

from lit_prunedpo.bench.presets import get_preset
from lit_prunedpo.bench.report import to_markdown, write_png

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from lit_prunedpo.bench.report import bench_figure  # noqa: E402

MODES = ("vanilla", "branch", "all")
VARIANTS = (("online", "plain"), ("cached", "chunked"))


def payload(smoke: bool = False) -> dict:
    rows = []
    for i, mode in enumerate(MODES):
        for j, (reference, scorer) in enumerate(VARIANTS):
            speedup = 1.0 if mode == "vanilla" else 1.2 + 0.3 * i + 0.1 * j
            rows.append(dict(
                mode=mode, reference=reference, scorer=scorer, prompt="shared", step_time_s=0.1, step_time_p90_s=0.12,
                peak_memory_mb=900.0 + i, peak_step_memory_mb=100.0 * (3 - i) + 10 * j, tokens_executed=100,
                positions_scored=50, ideal_speedup=speedup + 0.05, speedup=speedup,
                efficiency=speedup / (speedup + 0.05),
                speedup_total_time=speedup, speedup_vs_peer=None,
            ))
    return {"preset": "test", "device": "cpu", "results": rows, "preset_config": {"smoke_test": smoke}}


def bars(ax):
    return [p for p in ax.patches if p.get_height() > 0]


def test_chart_has_one_colour_per_mode_one_hatch_per_variant_and_legends_outside():
    fig = bench_figure(payload())
    speed, memory = fig.axes
    assert len(bars(speed)) == len(bars(memory)) == len(MODES) * len(VARIANTS)
    for ax in (speed, memory):
        assert len({p.get_facecolor() for p in bars(ax)}) == len(MODES)
        assert len({p.get_hatch() for p in bars(ax)}) == len(VARIANTS)
    # the memory panel shows the step peaks (not the flat process peak)
    assert sorted(p.get_height() for p in bars(memory)) == sorted(r["peak_step_memory_mb"]
                                                                  for r in payload()["results"])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in (speed, memory):
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # right of the axes
    assert {t.get_text() for t in speed.get_legend().get_texts()} >= set(MODES)
    assert [tick.get_text() for tick in memory.get_xticklabels()] == list(MODES)


def test_smoke_test_chart_and_table_state_no_measured_speedup(tmp_path):
    fig = bench_figure(payload(smoke=True))
    assert not bars(fig.axes[0])  # no measured speedup bars; the ideal marks only
    assert "smoke test" in fig.axes[0].get_title()
    table = to_markdown(payload(smoke=True))
    assert "smoke test" in table
    rows = [line for line in table.splitlines() if line.startswith("| branch")]
    assert len(rows) == len(VARIANTS)
    for row in rows:  # only the ideal column carries an "x"; a measured run states its speedups
        assert len(re.findall(r"[0-9.]+x", row)) == 1
    measured = [line for line in to_markdown(payload()).splitlines() if line.startswith("| branch")]
    assert all(len(re.findall(r"[0-9.]+x", row)) == 3 for row in measured)
    assert write_png(payload(smoke=True), tmp_path / "bench.png") and (tmp_path / "bench.png").stat().st_size > 0


def test_small_preset_is_a_smoke_test_and_others_are_not():
    assert get_preset("small").smoke_test
    assert not get_preset("quickstart").smoke_test and not get_preset("medium").smoke_test
