"""The study under a memory budget, end to end on a tiny head-heavy task (vocabulary 16384, 4 pairs per step):
same-batch vanilla is over the budget, so it is fitted its fastest exact way and joins the controls as the
memory-fitted vanilla; every arm that runs fits; the verdict's references are the vanillas that fit; the report
names the budget, the peaks and the fit. A budget nothing fits, and --prune-early with a budget, are refused."""

from __future__ import annotations

import json

import pytest

from lit_prunedpo_lab.study.cli import main
from lit_prunedpo_lab.study.tasks import QUICKSTART_MODEL, EditedTask

pytestmark = pytest.mark.slow  # studies of tiny trainings: `pytest -m slow` (CI runs it)

HEAVY = {**QUICKSTART_MODEL, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
         "num_key_value_heads": 1,
         "vocab_size": 16384}
ARGS = ["--seeds", "0,1", "--budget", "0.1", "--steps", "2", "--evals", "1", "--calibration-steps", "1", "--bootstrap",
        "200",
        "--no-sweep", "--no-matched", "--modes", "position-coupled", "--max-eval-pairs", "4", "--quiet"]


@pytest.fixture(scope="module")
def task():
    return EditedTask(name="tiny-heavy", num_rows=64, batch_size=4, model=dict(HEAVY))


def test_a_binding_budget_fits_vanilla_and_judges_against_the_vanillas_that_fit(task, tmp_path, capsys):
    out = tmp_path / "study"
    # vanilla's plain step peaks at ~30 MB here (logits, log-softmax and their gradient over 8192 ids); the chunked
    # scorer or accumulation brings it under 15
    assert main(ARGS + ["--memory-budget-mb", "15", "--out", str(out)], task=task) == 0
    payload = json.loads((out / "study.json").read_text())
    mem = payload["memory"]
    if mem["peaks"]["vanilla@4"] <= 15:
        pytest.skip(f"vanilla's peak on this machine is {mem['peaks']['vanilla@4']:.1f} MB: the budget does not bind")
    assert mem["budget_mb"] == 15 and mem["vanilla_fit"] != "as is"
    rows = {r["arm"]: r for r in payload["summary"]["arms"]}
    fitted = next(r for r in rows.values() if r["memory_fitted"])
    assert fitted["mode"] == "vanilla" and fitted["batch_size"] == 4 and fitted["fit"] == mem["vanilla_fit"]
    assert mem["peaks"][fitted["arm"]] <= 15
    pruned = next(r for r in rows.values() if r["mode"] == "position-coupled")
    assert mem["peaks"][pruned["arm"]] <= 15  # fits as is, or was replaced by its fitted variant
    assert "vanilla@4" not in pruned["references"] and fitted["arm"] in pruned["references"]
    assert set(pruned["references"]) == set(mem["references"]) & set(rows)
    assert payload["summary"]["same_batch_reference"] is False
    table = mem["tables"]["vanilla@4"]
    chosen = [r for r in table if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["fits"] and chosen[0]["cost_s"] == min(r["cost_s"] for r in table
                                                                                 if r["fits"])
    md = (out / "study.md").read_text()
    assert "Memory budget: **15 MB**" in md and f"fitted as **{mem['vanilla_fit']}**" in md
    assert ("Peak step memory above the step's start (MB, the largest over the timed steps): vanilla@4 "
            f"{mem['peaks']['vanilla@4']:.1f}" in md)
    assert mem["gpu_needed"] == any(r["micro_batches"] > 1 for r in rows.values()
                                    if r["arm"] in pruned["references"] + [pruned["arm"]]) \
        or mem["gpu_needed"] == ("accumulation" in md)


def test_a_budget_nothing_fits_is_refused_naming_the_smallest_peak(task, capsys, monkeypatch):
    # the calibration replaced by a hand-made one (every variant peaks at 40 MB, the chunked ones at 12.5): the refusal
    # is the command's last line, before any training (the real calibration's path: the test above)
    from lit_prunedpo_lab.study import calibrate
    from lit_prunedpo_lab.study.calibrate import StepCost

    def fake(task, arms, dm, steps, warmup=1, seed=0, memory=False, precision="32-true",
             device="cpu"):
        return {a: StepCost(0.01, 0.01, steps, 12.5 if a.chunked else 40.0) for a in arms}

    monkeypatch.setattr(calibrate, "measure_step_costs", fake)
    with pytest.raises(SystemExit):
        main(ARGS + ["--memory-budget-mb", "10"], task=task)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("--memory-budget-mb: memory budget 10 MB: no exact way of running vanilla@4 fits; the smallest "
                        "measured peak step memory is 12.5 MB (chunked scorer); raise --memory-budget-mb to at least "
                        "that")


def test_memory_budget_arguments_are_checked(task, capsys):
    for argv, message in ((["--memory-budget-mb", "0"],
                           "argument --memory-budget-mb: must be a finite number > 0, got 0"),
                          (["--memory-budget-mb", "100", "--prune-early", "0.5"],
                           "--prune-early cannot be combined with --memory-budget-mb")):
        with pytest.raises(SystemExit):
            main(ARGS + argv, task=task)
        assert message in capsys.readouterr().err.strip().splitlines()[-1]
