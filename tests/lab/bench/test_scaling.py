"""The scaling command: its smoke test end to end (files, rows, no speedups stated), its argument checks, the error
summary and report on given numbers, and ``lab/scripts/gpu-scaling``'s flags (parsed here; its dry run in a
subprocess)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from helpers import REPO

from lit_prunedpo_lab.bench.presets import MODES
from lit_prunedpo_lab.bench.rounds import Config
from lit_prunedpo_lab.bench.scaling import SIZES, Point, Settings, error_summary, parse_size, point_rows, rel_error
from lit_prunedpo_lab.bench.scaling_cli import build_parser, main, settings_from
from lit_prunedpo_lab.bench.scaling_report import to_markdown

SCRIPT = REPO / "lab" / "scripts" / "gpu-scaling"


@pytest.mark.slow  # a benchmark run (about 10 s on one core)
def test_quick_run_writes_the_report_and_states_no_speedups(tmp_path, capsys):
    assert main(["--quick", "--out", str(tmp_path), "--quiet", "--real-shapes", "Qwen2.5-0.5B"]) == 0
    payload = json.loads((tmp_path / "scaling.json").read_text())
    rows = payload["rows"]
    assert payload["smoke_test"] and payload["settings"]["sizes"] == ["2xs", "xs"]
    assert sorted({(r["sweep"], r["size"], r["response"]) for r in rows}) == [
        ("length", "2xs", 16), ("length", "2xs", 32), ("size", "2xs", 16), ("size", "xs", 16)]
    assert [r["mode"] for r in rows[:len(MODES)]] == list(MODES)
    for r in rows:
        assert r["step_time_s"] > 0 and r["time_ratio_pred"] > 0 and r["memory_pred_mb"] > 0
        assert r["load"]["torch_threads"] == torch.get_num_threads() and r["load"]["wall_per_cpu"] > 0
        assert r["time_error"] == pytest.approx(r["time_ratio"] / r["time_ratio_pred"] - 1)
        if r["mode"] == "vanilla":
            assert r["time_ratio"] == r["time_ratio_pred"] == r["memory_ratio_pred"] == 1.0
    c = payload["context"]
    assert c["command"].startswith("lit-prunedpo-bench-scaling --quick") and c["commit"] and c["date"]
    assert c["torch"] == torch.__version__ and c["cpu_count"] == os.cpu_count()
    assert {r["shape"] for r in payload["real_shapes"]["rows"]} == {"Qwen2.5-0.5B"}
    md = (tmp_path / "scaling.md").read_text()
    assert "**smoke test**" in md and "time ratio to vanilla" not in md  # no time-error summary line
    table = [line for line in md.splitlines() if line.startswith("| 2xs | ")]
    assert table and all(line.split(" | ")[4:7:2] == ["-", "-"] for line in table)  # time ratio and its error
    assert "Real shapes" in md and "time proportional to FLOPs" in md
    assert "# lit-prunedpo scaling" in capsys.readouterr().out
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "scaling.png").stat().st_size > 0


def test_real_shapes_only_and_dry_run(tmp_path, capsys):
    assert main(["--real-shapes-only", "--real-shapes", "Gemma-3-1B", "--real-batch", "2", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "scaling.json").read_text())
    assert payload["rows"] == [] and {r["shape"] for r in payload["real_shapes"]["rows"]} == {"Gemma-3-1B"}
    assert not (tmp_path / "scaling.png").exists()
    capsys.readouterr()
    assert main(["--quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("params") == 4 and "total ~" in out


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "0"], "unknown size '0'"),
    (["--sizes", "xs,huge"], "unknown size 'huge'"),
    (["--sizes", "d0l2"], "unknown size 'd0l2'"),
    (["--length-size", "d130l2x"], "unknown size"),
    (["--lengths", "0,256"], "lengths must all be >= 1"),
    (["--lengths", "256,long"], "comma-separated integers"),
    (["--steps", "0"], "steps must be >= 1"),
    (["--warmup", "-1"], "warmup must be >= 0"),
    (["--size-batch", "0"], "size_batch must be >= 1"),
    (["--vocab", "4"], "vocab must be >= 8"),
    (["--modes", "branch,all"], "must include vanilla"),
    (["--modes", "vanilla,bogus"], "bogus"),
    (["--scorers", "fast"], "fast"),
    (["--real-shapes", "GPT-5"], "GPT-5"),
    (["--sizes", "", "--lengths", ""], "nothing to sweep"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--real-shapes-only", "--no-real-shapes"], "exclude each other"),
])
def test_bad_arguments_are_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--dry-run"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_sizes_parse():
    assert parse_size("xl") == SIZES["xl"]
    size = parse_size("d2048l16")
    assert (size.hidden, size.layers, size.heads) == (2048, 16, 32)
    assert size.model(32000, 128)["intermediate_size"] == 8192


def test_default_grid_meets_the_issue():
    """At least 4 sizes spanning 30x in parameters, at least 4 lengths up to at least 2048."""
    settings = settings_from(build_parser().parse_args([]))
    params = [s.params(settings.vocab)[0] for s in settings.sizes]
    assert len(params) >= 4 and max(params) / min(params) >= 30
    assert len(settings.lengths) >= 4 and max(settings.lengths) >= 2048 and not settings.smoke_test


def test_gpu_script_flags_parse():
    """The flags ``lab/scripts/gpu-scaling`` passes make valid settings: CUDA, bf16, sizes spanning 30x up to ~1B,
    lengths up to 8192."""
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0
    grid = re.search(r"GRID=\((.*?)\)", SCRIPT.read_text(), re.S)[1]
    settings = settings_from(build_parser().parse_args(shlex.split(grid)))
    params = [s.params(settings.vocab)[0] for s in settings.sizes]
    assert settings.device == "cuda" and settings.dtype == "bfloat16"
    assert max(params) / min(params) >= 30 and 0.9e9 < max(params) < 2e9
    assert max(settings.lengths) >= 4096 and len(settings.lengths) >= 4


@pytest.mark.slow  # subprocesses
def test_gpu_script_dry_run_and_refusal_without_cuda(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run([str(SCRIPT), "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("params") == 10 and "d2048l16" in done.stdout and "8192-token" in done.stdout
    if not torch.cuda.is_available():
        done = subprocess.run([str(SCRIPT), str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode != 0 and "no CUDA device visible" in done.stderr


def _row(sweep, mode, response, key_values):
    row = {"sweep": sweep, "mode": mode, "size": "m", "response": response}
    row.update(key_values)
    return row


def test_error_summary_on_given_numbers():
    """Ratio errors leave vanilla out (1 by construction); the memory error counts every mode."""
    rows = [
        _row("size", "vanilla", 256, dict(time_error=0.0, memory_ratio_error=0.0, memory_error=0.10)),
        _row("size", "branch", 256, dict(time_error=0.05, memory_ratio_error=-0.20, memory_error=0.30)),
        _row("size", "all", 256, dict(time_error=-0.15, memory_ratio_error=0.10, memory_error=-0.05)),
        _row("size", "position", 512, dict(time_error=0.02, memory_ratio_error=None, memory_error=None)),
        _row("length", "branch", 1024, dict(time_error=0.40, memory_ratio_error=0.01, memory_error=0.02)),
    ]
    summary = {(s["sweep"], s["quantity"]): s for s in error_summary(rows)}
    time = summary["size", "time_error"]
    assert (time["points"], time["median_abs"], time["max_abs"]) == (3, 0.05, 0.15)
    assert time["worst"] == "all at m, 256 tokens"
    ratio = summary["size", "memory_ratio_error"]
    assert (ratio["points"], ratio["median_abs"], ratio["max_abs"]) == (2, pytest.approx(0.15), 0.20)
    memory = summary["size", "memory_error"]
    assert (memory["points"], memory["median_abs"], memory["max_abs"]) == (3, 0.10, 0.30)
    assert summary["length", "time_error"]["max_abs"] == 0.40 and len(summary) == 6
    assert rel_error(1.2, 1.0) == pytest.approx(0.2) and rel_error(None, 1.0) is None and rel_error(1.0, 0) is None


def test_point_rows_and_report_state_the_errors():
    """Measured vanilla 2.0 s / 100 MiB, branch 1.5 s / 60 MiB; predicted (FLOP ratio) 0.6 and 80 / 50 MiB: branch's
    time ratio 0.75 is +25% off 0.6, its memory 60 is +20% off 50, its memory ratio 0.6 is -4% off 0.625."""
    settings = Settings(sizes=(SIZES["m"],), lengths=(), length_size=SIZES["m"])
    results = [dict(mode="vanilla", reference="online", scorer="plain", prompt="shared", step_time_s=2.0,
                    ideal_speedup=1.0, peak_step_memory_mb=100.0, tokens_executed=10),
               dict(mode="branch", reference="online", scorer="plain", prompt="shared", step_time_s=1.5,
                    ideal_speedup=1 / 0.6, peak_step_memory_mb=60.0, tokens_executed=8)]
    predicted = {Config("vanilla", "online", "plain"): 80.0, Config("branch", "online", "plain"): 50.0}
    rows = point_rows(Point("size", SIZES["m"], 256, 64, 2), settings, {"results": results, "head_share": 0.2},
                      predicted)
    branch = rows[1]
    assert branch["time_ratio"] == 0.75 and branch["time_error"] == pytest.approx(0.25)
    assert branch["memory_error"] == pytest.approx(0.2) and branch["memory_ratio_error"] == pytest.approx(-0.04)
    payload = {"context": dict(date="d", commit="c", machine="m", cpu_count=2, device="cpu", device_name="x", torch="t",
                               python="p", threads=1, dtype="float32", command="cmd", memory_measure="rss"),
               "settings": {"steps": 5, "warmup": 1, "references": ["online"], "scorers": ["plain"], "vocab": 8192},
               "sizes": [{"name": "m", "hidden": 256, "layers": 4, "params": 8.4e6}], "rows": rows,
               "summary": error_summary(rows), "smoke_test": False}
    md = to_markdown(payload)
    assert "| m | 8.39M | branch | 1.500 | 0.75 | 0.60 | +25% | 60.0 | 50.0 | +20% | 0.60 | 0.62 | -4% |" in md
    assert "| size | time ratio to vanilla | 1 | 25% | 25% | branch at m, 256 tokens |" in md
