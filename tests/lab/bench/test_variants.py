"""The bench's variants of one exact step, alternated: ``--compare-precisions`` (a row per mode and precision, its
ratio to the first, its utilisation against its own dtype's peak, its distance from float32's numbers) and the
refusals of options that do not go with it. ``--compile`` is tested with the compiled bodies (tests/test_compiling.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from lit_prunedpo_lab.bench.cli import main
from lit_prunedpo_lab.bench.precision import resolve_precision
from lit_prunedpo_lab.bench.precisions import compare_precisions
from lit_prunedpo_lab.bench.presets import get_preset


def test_precisions_alternate_and_each_is_read_against_float32(tmp_path):
    torch.set_num_threads(1)
    assert main(["--preset", "small", "--modes", "vanilla,branch", "--compare-precisions",
                 "32-true,bf16-mixed,bf16-true",
                 "--steps", "2", "--warmup", "1", "--threads", "1", "--out", str(tmp_path), "--quiet"]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["mode"], r["variant"]): r for r in payload["rows"]}
    assert set(rows) == {(m, p) for m in ("vanilla", "branch") for p in ("32-true", "bf16-mixed", "bf16-true")}
    assert set(payload["peaks"]) == {"float32", "bfloat16"}
    for (mode, variant), r in rows.items():
        first = rows[mode, "32-true"]["step_time_s"]
        assert r["vs_first"] == pytest.approx(first / r["step_time_s"])
        assert r["utilisation"] == pytest.approx(r["achieved_flops_per_s"] / payload["peaks"][
            "float32" if variant == "32-true" else "bfloat16"]["flops_per_s"])
        if variant == "32-true":
            assert r["max_objective_difference"] == 0 and r["max_grad_relative_difference"] == 0
        else:  # bfloat16 rounding: visible, and small
            assert 0 < r["max_objective_difference"] < 0.01 and 0 < r["max_grad_relative_difference"] < 0.2
    assert rows["vanilla", "32-true"]["flops"] > rows["branch", "32-true"]["flops"]  # pruned work is not counted
    assert "| branch | bf16-true |" in (tmp_path / "bench.md").read_text()


@pytest.mark.parametrize("extra, words", [
    (["--compare-precisions", "32-true,bf16-mixed", "--peer", "trl"], "--peer does not go with --compare-precisions"),
    (["--compare-precisions", "32-true,bf16-mixed", "--precision", "bf16-mixed"], "--precision/--dtype does not go"),
    (["--compare-precisions", "32-true,bf16-mixed", "--compile"], "--compile does not go with --compare-precisions"),
    (["--compare-precisions", "32-true,bf17"], "precision: unknown 'bf17'"),
    (["--compare-precisions", "32-true"], "two variants or more"),
])
def test_options_that_do_not_go_with_a_comparison_are_refused_naming_them(extra, words, capsys):
    with pytest.raises(SystemExit):
        main(["--preset", "small", "--modes", "vanilla", "--steps", "2", "--warmup", "1", *extra])
    assert words in capsys.readouterr().err


def test_a_precision_named_twice_is_refused():
    p = resolve_precision("32-true", None)
    with pytest.raises(ValueError, match="names a precision twice: 32-true,32-true"):
        compare_precisions(get_preset("small"), ["vanilla"], 2, 1, [p, p])
