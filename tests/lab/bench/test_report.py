"""The benchmark's report: the chart's structure (one colour per mode, one hatch per variant, legends outside the
axes, a memory panel of step peaks), a smoke test's reports stating no measured speedup, the ratios' intervals
over paired rounds, and every published bench page equal to its record rendered."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from helpers import REPO
from lit_prunedpo_lab.bench.presets import get_preset
from lit_prunedpo_lab.bench.report import interval_lines, to_markdown, write_png

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from lit_prunedpo_lab.bench.report import bench_figure  # noqa: E402

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


def rounds_payload(rounds: int) -> dict:
    """Rounds whose load moves every configuration of a round together (a factor of up to 3x between rounds):
    branch is 1.5x faster than vanilla and TRL 3x slower in every round, `all` is noisy around 1.2x."""
    load = [1.0 + (i * 7 % 5) / 2 for i in range(rounds)]
    noise = [1.0 + 0.1 * ((i * 3 % 4) - 1.5) for i in range(rounds)]
    times = {"vanilla": load, "branch": [t / 1.5 for t in load], "all": [t / 1.2 * e for t, e in zip(load, noise)]}
    rows = [dict(mode=m, reference="online", scorer="plain", prompt="shared", step_times_s=ts,
                 step_time_s=statistics.median(ts)) for m, ts in times.items()]
    trl = [3 * t for t in load]
    return {"results": rows, "peers": [{"name": "trl", "step_times_s": trl, "step_time_s": statistics.median(trl)}]}


def test_the_ratios_get_intervals_over_whole_rounds():
    lines = interval_lines(rounds_payload(8))
    assert "95 % intervals over the 8 rounds" in lines[1]
    table = {line.split(" | ")[0].strip("| "): line.split(" | ")[4:] for line in lines if line.startswith("| ")}
    # a load shared by the round cancels in the paired ratio: no width however much the rounds differ
    assert table["vanilla"] == ["-", "3.00x [3.00x, 3.00x] |"]
    assert table["branch"][0] == "1.50x [1.50x, 1.50x]"
    low, high = (float(v) for v in re.findall(r"\[([0-9.]+)x, ([0-9.]+)x\]", table["all"][0])[0])
    assert low < 1.2 < high and high - low > 0.05


def test_no_intervals_from_too_few_rounds_or_rounds_not_kept():
    assert interval_lines(rounds_payload(2)) == []
    assert interval_lines(payload()) == []  # a payload from before the rounds' step times were kept
    assert "Ratios with 95 % intervals" not in to_markdown(payload())


@pytest.mark.parametrize("record", sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("docs/**/bench.json")
                                          if "results" in json.loads(p.read_text())))
def test_every_published_bench_page_is_its_record_rendered(record):
    # a page edited by hand, or rendered by an older report, would say what its record does not
    payload = json.loads((REPO / record).read_text())
    assert (REPO / record).with_name("bench.md").read_text() == to_markdown(payload)
