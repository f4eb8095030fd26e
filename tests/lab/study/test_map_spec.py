"""The map's grid spec (every bad input refused with the spec, block and field named), the plan's arithmetic,
the budget fitted to the limit, and the command's refusal of a budget over the limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_prunedpo_lab.study import tasks
from lit_prunedpo_lab.study.map_cli import main
from lit_prunedpo_lab.study.map_plan import PlanOptions, Probe, cell_seconds, fit_budget
from lit_prunedpo_lab.study.map_plan import makespan
from lit_prunedpo_lab.study.map_spec import DEFAULT_SPEC, load_spec, parse_spec

CELL = {"task": "generated", "length": 16, "head_share": 0.25, "similarity": "near-duplicate", "batch_size": 8}


def test_the_built_in_maps():
    spec = load_spec("default")
    assert spec == parse_spec(DEFAULT_SPEC, "the built-in map 'default'")
    assert len(spec.cells) == 15 and len({c.name for c in spec.cells}) == 15
    budgeted = [c for c in spec.cells if c.memory_budget_mb is not None]
    assert [(c.length, c.head_share, c.memory_budget_mb) for c in budgeted] == [(256, 0.25, 80.0), (64, 0.97, 100.0)]
    assert budgeted[0].name == "near-duplicate-L256-head0.25-B8-mem80MB"
    assert {c.length for c in spec.cells} == {16, 64, 256}
    assert {c.head_share for c in spec.cells} == {0.03, 0.25, 0.97}
    assert {c.similarity for c in spec.cells} == {"near-duplicate", "unrelated"}
    assert {c.batch_size for c in spec.cells} == {4, 8, 32}
    assert len(load_spec("quick").cells) == 2
    (hh,) = load_spec("hh-rlhf").cells
    assert (hh.kind, hh.length, hh.task.max_length) == ("hh-rlhf", 64, 96)


def test_a_block_is_a_factorial_product():
    spec = parse_spec({"modes": "branch", "blocks": [{**CELL, "length": [16, 32], "batch_size": [4, 8]}]})
    assert spec.modes == ["branch"]
    assert sorted((c.length, c.batch_size) for c in spec.cells) == [(16, 4), (16, 8), (32, 4), (32, 8)]


@pytest.mark.parametrize("spec, message", [
    ({"modes": ["nope"], "blocks": [CELL]}, r"modes: unknown or empty \['nope'\]"),
    ({"modes": ["vanilla"], "blocks": [CELL]}, r"modes: unknown or empty \['vanilla'\]"),
    ({"modes": [], "blocks": [CELL]}, "modes: unknown or empty"),
    ({"modes": ["branch"], "blocks": [{**CELL, "length": 0}]},
     "block 1, cell .*: length must be an integer >= 2, got 0"),
    ({"modes": ["branch"], "blocks": [{**CELL, "length": "64"}]}, "length must be an integer >= 2, got '64'"),
    ({"modes": ["branch"], "blocks": [{**CELL, "length": 2.5}]}, "length must be an integer >= 2, got 2.5"),
    ({"modes": ["branch"], "blocks": [{**CELL, "length": 5000}]}, r"length must be an integer in \[2, 1024\]"),
    ({"modes": ["branch"], "blocks": [{**CELL, "batch_size": 0}]}, "batch_size must be an integer >= 2, got 0"),
    # one pair a step: no cost-matched control, no vanilla batch for the noise model, nothing for AutoPruning
    ({"modes": ["branch"], "blocks": [{**CELL, "batch_size": 1}]},
     r"batch_size must be an integer >= 2, got 1 \(at 1 pair a step no vanilla batch is smaller, so the cell has no "
     "cost-matched control"),
    ({"modes": ["branch"], "blocks": [{**CELL, "head_share": 0.001}]}, "needs a vocabulary of .* < 384"),
    ({"modes": ["branch"], "blocks": [{**CELL, "head_share": "a lot"}]}, "head_share must be a number"),
    ({"modes": ["branch"], "blocks": [{**CELL, "similarity": "same"}]}, "similarity must be one of"),
    ({"modes": ["branch"], "blocks": [{**CELL, "colour": 1}]}, r"unknown \['colour'\]"),
    ({"modes": ["branch"], "blocks": [{k: v for k, v in CELL.items() if k != "similarity"}]},
     r"missing \['similarity'\]"),
    ({"modes": ["branch"], "blocks": [{**CELL, "task": "imagenet"}]},
     "block 1: task must be one of generated, hh-rlhf"),
    ({"modes": ["branch"], "blocks": [{"task": "hh-rlhf", "length": 64, "batch_size": 8, "head_share": 0.1}]},
     r"a hh-rlhf block has the fields task, length, batch_size \(optional: memory_budget_mb\); unknown "
     r"\['head_share'\]"),
    ({"modes": ["branch"], "blocks": [CELL, {**CELL}]},
     "block 2: cell near-duplicate-L16-head0.25-B8 is already in block 1"),
    ({"modes": ["branch"], "blocks": []}, "blocks must be a non-empty list"),
    ({"modes": ["branch"], "blocks": [CELL], "budget": 3}, r"unknown keys \['budget'\]"),
    ({"modes": ["branch"], "blocks": [{**CELL, "length": []}]}, "length has no value"),
])
def test_bad_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(spec, "my.yaml")


def test_the_memory_budget_is_an_axis():
    spec = parse_spec({"modes": "branch", "blocks": [{**CELL, "memory_budget_mb": [None, 50, 12.5]}]})
    assert [(c.memory_budget_mb, c.name) for c in spec.cells] == [
        (None, "near-duplicate-L16-head0.25-B8"), (50.0, "near-duplicate-L16-head0.25-B8-mem50MB"),
        (12.5, "near-duplicate-L16-head0.25-B8-mem12.5MB")]
    assert spec.cells[1].settings()["memory_budget_mb"] == 50.0
    (hh,) = parse_spec({"modes": "branch", "blocks": [{"task": "hh-rlhf", "length": 64, "batch_size": 8,
                                                       "memory_budget_mb": 300}]}).cells
    assert hh.memory_budget_mb == 300.0 and hh.name == "hh-rlhf-L64-B8-mem300MB"
    for bad in (0, -5, "lots", True, float("inf")):
        with pytest.raises(ValueError, match=r"my.yaml, block 1, cell .*: memory_budget_mb must be a number > 0 \(MiB "
                                             r"of peak step memory\) or null, got"):
            parse_spec({"modes": "branch", "blocks": [{**CELL, "memory_budget_mb": bad}]}, "my.yaml")


@pytest.mark.parametrize("written, fix", [
    ("1.0e12", r": YAML reads 1.0e12 as a string \(its exponents need a dot in the number and a sign: 1.0e\+12, "
               r"not 1e12 or 1.0e12\); write 1.0e\+12$"),
    ("'80'", r": a string; write 80 without quotes$"),
])
def test_a_memory_budget_yaml_reads_as_a_string_says_how_to_write_it(tmp_path, written, fix):
    spec = tmp_path / "map.yaml"
    spec.write_text("modes: [branch]\nblocks:\n  - {task: generated, length: 16, head_share: 0.25, "
                    f"similarity: unrelated, batch_size: 4, memory_budget_mb: {written}}}\n")
    with pytest.raises(ValueError, match=r"memory_budget_mb must be a number > 0 \(MiB of peak step memory\) or "
                                         r"null, got '[0-9.e]+'" + fix):
        load_spec(spec)
    spec.write_text(spec.read_text().replace(written, "1.0e+12"))
    assert load_spec(spec).cells[0].memory_budget_mb == 1e12


def test_spec_files(tmp_path):
    good = tmp_path / "map.yaml"
    good.write_text("modes: [branch]\nblocks:\n  - {task: generated, length: 16, head_share: 0.25, similarity: "
                    "unrelated, batch_size: 4}\n")
    assert [c.name for c in load_spec(good).cells] == ["unrelated-L16-head0.25-B4"]
    bad = tmp_path / "map.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"map spec '.*map.json': not valid JSON"):
        load_spec(bad)
    with pytest.raises(ValueError, match="cannot be read"):
        load_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[3].glob("docs/records/study/*/spec.yaml")),
                         ids=lambda p: p.parent.name)
def test_the_published_specs_load(path):
    """Every spec a results page names in its command still reads, with the cells its map.json reports."""
    spec = load_spec(path)
    reported = json.loads((path.parent / "map.json").read_text())
    assert sorted(c.name for c in spec.cells) == sorted({row["name"] for row in reported["rows"]})
    assert sorted(spec.modes) == sorted({row["mode"] for row in reported["rows"]})


def test_plan_arithmetic_and_the_fitted_budget():
    o = PlanOptions(modes=1, steps=10, evals=2, seeds=3, tune_seeds=1, lr_factors=3, calibration_steps=1,
                    noise_pairs=4, noise_draws=2)
    p = Probe(step_s=0.5, eval_s=0.25, setup_s=1.0)
    # 3 arms x (3 x 1 + 3) = 18 runs; train 18 x (max(8, 5) + 0.5); evals 18 x 5 x 0.25; calibration (3 probes + 1) x 2
    # x 0.5; noise (4 + 1 + 2) x 0.5; setup 3 x 1; report 3
    # (the calibration's steps also pay the memory meter's settling, SETTLE_S = 0.2 each)
    expected = 18 * 8.5 + 18 * 5 * 0.25 + 4 * 2 * 0.7 + 7 * 0.5 + 3.0 + 3.0
    assert cell_seconds(p, o, 8.0, batch_size=4) == pytest.approx(expected)
    # below the step budget's cost the budget does not matter; warm start: (3 + 1) x 10 x 0.5
    assert cell_seconds(p, o, 1.0, 4) == cell_seconds(p, o, 5.0, 4)
    assert cell_seconds(p, o, 8.0, 4, warm_start_steps=10) == pytest.approx(expected + 20.0)
    # a memory budget: the cost-matched control's peak 1 x 2 x 0.7; 11 variants (chunked, checkpointing, accumulation
    # x1/2/4 at batch 4, less the arm itself) of vanilla and the pruned mode, 2 x 11 x 2 x (2 x 0.5 + 0.2); the
    # memory-fitted vanilla's 6 runs at twice a vanilla step: 6 x (max(8, 10) + 1) training, 6 x 5 x 0.25 evaluation
    memory = 1 * 2 * 0.7 + 2 * 11 * 2 * 1.2 + 6 * 11.0 + 6 * 5 * 0.25
    assert cell_seconds(p, o, 8.0, 4, memory_budget=True) == pytest.approx(expected + memory)
    assert fit_budget(lambda b: 10 + 3 * b, 40.0) == pytest.approx(10.0)
    assert fit_budget(lambda b: 10 + 3 * b, 41.0) == pytest.approx(10.3)
    assert fit_budget(lambda b: 10 + 3 * b, 10.0) is None
    # two workers, longest cell first to the least loaded: [9] and [5, 4, 3] -> 12; one worker: the sum
    assert makespan([3, 9, 4, 5], 2) == 12 and makespan([3, 9, 4, 5], 1) == 21 and makespan([3], 4) == 3


TINY_SPEC = {"modes": ["position-coupled"], "blocks": [{**CELL, "length": 8, "batch_size": 4}]}


def test_a_budget_over_the_limit_is_refused(tmp_path, capsys):
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(TINY_SPEC))
    with pytest.raises(SystemExit) as exit_info:
        main(["--spec", str(spec), "--budget", "100", "--limit-minutes", "1", "--plan-only", "--max-eval-pairs", "8",
              "--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--budget 100: the planned total" in err and "exceeds --limit-minutes 1" in err
    with pytest.raises(SystemExit):  # nothing fits a limit below the probed costs
        main(["--spec", str(spec), "--limit-minutes", "0.001", "--plan-only", "--max-eval-pairs", "8", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the map cannot fit --limit-minutes 0.001: even a 0.1 s budget per run plans" in err
    # without --budget, the largest budget that fits is chosen and printed with the plan
    assert main(["--spec", str(spec), "--limit-minutes", "1", "--plan-only", "--max-eval-pairs", "8", "--quiet"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["total_s"] <= 60 and plan["budget_s"] > 0 and list(plan["cells"]) == ["near-duplicate-L8-head0.25-B4"]


def test_command_errors(tmp_path, capsys):
    for argv, message in ((["--modes", "nope"], "argument --modes: unknown"),
                          (["--spec", str(tmp_path / "none.yaml"), "--plan-only"], "cannot be read"),
                          (["--seeds", "0,1", "--tune-seeds", "1"], "overlap"),
                          (["--plan-only", "--modes", "vanilla"], "name pruned modes only")):
        with pytest.raises(SystemExit):
            main(argv + ([] if "--plan-only" in argv else ["--out", str(tmp_path / "o")]))
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_cell_whose_data_is_missing_is_refused_before_training(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "harmless-base-test.jsonl.gz"
    monkeypatch.setattr(tasks, "HH_RLHF_DATA", missing)  # the default data file, resolved beside the repository
    with pytest.raises(SystemExit):
        main(["--spec", "hh-rlhf", "--plan-only", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"cell hh-rlhf-L64-B8: hh-rlhf task: data file '{missing}' not found" in err
