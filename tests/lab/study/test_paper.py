"""The paper's form of the comparison: designs (a mode, its replaced sampler arguments, a batch, epochs), the
epoch-matched runs (steps per design, the memory probe off the clocks), the paired figures and the frontier,
the families, and the command end to end (files, resume, refusals)."""

from __future__ import annotations

import json

import pytest
import torch

from lit_prunedpo.models import FromConfig
from lit_prunedpo_lab.study.arms import Arm, with_settings
from lit_prunedpo_lab.study.epochs import make_designs, parse_design, probe_memory, steps_per_epoch
from lit_prunedpo_lab.study.paper_cli import main
from lit_prunedpo_lab.study.paper_report import compare, pareto, sentence, summarise_cell, to_markdown
from lit_prunedpo_lab.study.runner import make_run, train_arms
from lit_prunedpo_lab.study.tasks import QUICKSTART_MODEL, EditedTask, family_config, with_family

TINY = {**QUICKSTART_MODEL, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
        "num_key_value_heads": 1}


@pytest.mark.parametrize("text, expected", [
    ("vanilla", ("vanilla", (), 16, 1.0)),
    ("stratified-coupled:rate=0.125", ("stratified-coupled", (("rate", 0.125),), 16, 1.0)),
    ("all-coupled:rate=0.25,min_fraction=0.75", ("all-coupled", (("rate", 0.25), ("min_fraction", 0.75)), 16, 1.0)),
    ("vanilla@/2", ("vanilla", (), 8, 1.0)),
    ("vanilla@x2", ("vanilla", (), 32, 1.0)),
    ("vanilla@4/0.5", ("vanilla", (), 4, 1.0)),
    ("branch/0.5", ("branch", (), 16, 1.0)),
])
def test_a_design_is_a_mode_its_sampler_arguments_a_batch_and_epochs(text, expected):
    mode, settings, batch, epochs = parse_design(text, 16, 2.0)
    want_epochs = 2.0 * (0.5 if text.endswith("/0.5") else 1.0)
    assert (mode, settings, batch, epochs) == (*expected[:3], want_epochs)


@pytest.mark.parametrize("text, words", [
    ("Vanilla", "expected MODE"), ("position:rate", "not name=number"), ("position:rate=abc", "not name=number"),
    ("vanilla/0", "epochs must be a number > 0"), ("position@", "expected MODE"),
])
def test_a_malformed_design_is_refused_naming_it(text, words):
    with pytest.raises(ValueError, match=words):
        parse_design(text, 16, 1.0)


def test_designs_get_their_epochs_steps_and_unknown_arguments_are_refused():
    task = EditedTask(batch_size=16)
    designs = make_designs(["branch", "vanilla@x2", "vanilla/0.5", "branch"], task, train_pairs=100, epochs=2.0)
    assert [d.label for d in designs] == ["vanilla@16/2", "branch@16/2", "vanilla@32/2", "vanilla@16"]
    assert [d.arm.schedule_steps for d in designs] == [2 * 7, 2 * 7, 2 * 4, 7]
    assert steps_per_epoch(100, 16) == 7
    with pytest.raises(ValueError, match="design 'vanilla:rate=0.5'.*'rate' is taken by no samplers of vanilla"):
        make_designs(["vanilla:rate=0.5"], task, 100, 1.0)
    with pytest.raises(ValueError, match="design 'position:rate=2'.*rate must be in"):
        make_designs(["position:rate=2"], task, 100, 1.0)
    with pytest.raises(ValueError, match="unknown mode 'nope'"):
        make_designs(["nope"], task, 100, 1.0)


def test_settings_rebuild_the_samplers_with_their_own_checks():
    arm = Arm("all-coupled", 8, settings=(("rate", 0.125), ("min_fraction", 0.75)))
    prefix, position, branch = arm.samplers()
    assert (prefix.min_fraction, position.rate, type(branch).__name__) == (0.75, 0.125, "AntitheticBranch")
    assert arm.samplers()[1] is not arm.samplers()[1]  # new objects every time
    assert arm.name == "all-coupled:rate=0.125,min_fraction=0.75@8"
    assert with_settings(Arm("branch", 8).samplers(), (("chosen_probability", 0.25),))[2].chosen_probability == 0.25
    # the default position mode wraps its position sampler: a setting reaches the wrapped one, the wrapper is kept
    position = Arm("position", 8, settings=(("rate", 0.5),)).samplers()[1]
    assert (type(position).__name__, type(position.positions).__name__) == ("ExactTargetLogits",
                                                                            "CoupledStratifiedPositions")
    assert (position.positions.rate, position.fallback) == (0.5, True)


def test_families_keep_the_sizes_and_build():
    gpt2 = family_config(QUICKSTART_MODEL, "gpt2")
    assert (gpt2["n_embd"], gpt2["n_layer"], gpt2["n_head"], gpt2["n_inner"],
            gpt2["vocab_size"]) == (64, 2, 4, 128, 384)
    model = FromConfig("gpt2", gpt2, seed=0).build()
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.eos_token_id == 383
    task = with_family(EditedTask(), "qwen2")
    assert task.name == "edited-qwen2" and type(task.policy(0).build()).__name__ == "Qwen2ForCausalLM"
    assert with_family(EditedTask(), "llama").name == "edited"
    with pytest.raises(ValueError, match="model family must be one of llama, qwen2, gpt2, got 'bert'"):
        with_family(EditedTask(), "bert")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    task = EditedTask(name="tiny-edited", num_rows=96, batch_size=8, model=dict(TINY))
    return task, task.datamodule(tmp_path_factory.mktemp("paper-data"))


def test_runs_without_a_time_budget_train_their_own_step_counts(tiny):
    task, dm = tiny
    torch.set_num_threads(1)
    arms = [Arm("vanilla", 8, schedule_steps=5), Arm("vanilla", 8, schedule_steps=2),
            Arm("branch", 4, schedule_steps=3)]
    runs = train_arms(task, arms, [0], budget_s=None, steps=lambda arm: arm.schedule_steps, evals=2, dm=dm)
    assert [r.step for r in runs] == [5, 2, 3]
    assert [[p.step for p in r.points] for r in runs] == [[0, 2, 5], [0, 1, 2], [0, 2, 3]]


def test_the_memory_probe_is_not_training(tiny):
    task, dm = tiny
    run = make_run(task, Arm("vanilla", 8, schedule_steps=2), 0, dm)
    run.train_step()
    before = (run.step, run.cpu_s, run.wall_s, list(run.step_cpu))
    peak = probe_memory(run, 3)
    assert (run.step, run.cpu_s, run.wall_s, run.step_cpu) == before
    assert len(run.step_peak_mb) == 3 and (peak is None or peak >= 0)


def test_bf16_mixed_runs_each_forward_under_autocast_and_keeps_float32_weights(tiny, monkeypatch):
    task, dm = tiny
    seen = []
    real = torch.nn.Linear.forward
    monkeypatch.setattr(torch.nn.Linear, "forward",
                        lambda self, x: seen.append(torch.is_autocast_enabled("cpu")) or real(self, x))
    runs = {p: make_run(task, Arm("vanilla", 8, schedule_steps=2), 0, dm,
                        precision=p) for p in ("32-true", "bf16-mixed")}
    batches = [next(iter(dm.val_dataloader()))]
    for precision, run in runs.items():
        run.evaluate(batches, ["steps"])  # the first forward runs the layout's conformance probe (in float32 too)
        seen.clear()
        run.evaluate(batches, ["steps"])
        run.train_step()
        run.evaluate(batches, ["steps"])
        assert seen and all(seen) == (precision == "bf16-mixed") and any(seen) == (precision == "bf16-mixed")
        assert all(p.dtype == torch.float32 for p in run.module.policy.parameters())
        assert run.summary()["precision"] == precision
    fp32, bf16 = (runs[p].points[-1].loss for p in ("32-true", "bf16-mixed"))  # after a step: policy != reference
    assert fp32 != bf16 and abs(fp32 - bf16) < 0.02  # bfloat16 rounding moved the loss, and only by that


def test_a_study_run_refuses_a_precision_it_does_not_train_in(tiny):
    task, dm = tiny
    with pytest.raises(ValueError, match="precision: .*32-true, bf16-mixed.*'bf16-true'"):
        make_run(task, Arm("vanilla", 8, schedule_steps=2), 0, dm, precision="bf16-true")


def _record(design, seed, cpu, step, peak, accuracy, loss):
    return {"design": design, "seed": seed, "train_cpu_s": cpu, "train_wall_s": cpu * 1.1, "median_step_cpu_s": step,
            "peak_step_mb": peak, "final_accuracy": accuracy, "final_loss": loss}


def test_figures_are_paired_by_seed_against_vanilla():
    vanilla = {s: _record("vanilla@8", s, 10.0, 0.10, 100.0, 0.80, 0.60) for s in range(3)}
    branch = {0: _record("branch@8", 0, 7.0, 0.07, 90.0, 0.78, 0.62), 1: _record("branch@8", 1, 8.0, 0.08, 80.0, 0.80,
                                                                                 0.61),
              2: _record("branch@8", 2, 6.0, 0.06, 70.0, 0.76, 0.63), 9: _record("branch@8", 9, 1.0, 1.0, 1.0, 1.0,
                                                                                 1.0)}
    row = compare(branch, vanilla)
    assert row["seeds"] == [0, 1, 2]  # seed 9 has no vanilla to pair with
    assert row["time_saved"][0] == pytest.approx(0.3)
    assert row["step_speedup"][0] == pytest.approx((10 / 7 + 10 / 8 + 10 / 6) / 3)
    assert row["memory_ratio"][0] == pytest.approx(0.8)
    assert row["accuracy_change"][0] == pytest.approx(-0.02)
    low, high = row["time_saved"][1:]
    assert low <= 0.3 <= high and low >= 0.2 - 1e-9 and high <= 0.4 + 1e-9
    assert "Step speedup" in sentence("branch", row) and "time saved in line with its ~30 %" in sentence("branch", row)


def test_pareto_keeps_only_the_undominated():
    points = {"a": (1.0, 0.5), "b": (2.0, 0.7), "c": (2.5, 0.6), "d": (3.0, 0.9), "e": (3.0, 0.9)}
    assert pareto(points, higher_is_better=True) == {"a", "b", "d", "e"}
    assert pareto({"a": (1.0, 0.5), "b": (2.0, 0.4)}, higher_is_better=False) == {"a", "b"}
    assert pareto({"a": (1.0, 0.5), "b": (2.0, 0.6)}, higher_is_better=False) == {"a"}


def test_sentences_follow_the_intervals():
    row = {"accuracy_change": (-0.05, -0.08, -0.02), "memory_ratio": (0.7, 0.6, 0.8), "step_speedup": (2.0, 1.8, 2.2),
           "time_saved": (0.5, 0.45, 0.55)}
    assert sentence("position", row) == "Lower peak memory, as the paper says; an accuracy drop."
    assert sentence("antithetic", row).startswith("Step speedup above the paper's 1.426x; time saved above")
    assert sentence("sequence", {**row,
                                 "memory_ratio": (1.0, 0.9, 1.1)}).startswith("No detectable change in peak memory")
    assert sentence("all", row) == "The paper gives no figure for this design; an accuracy drop."


@pytest.mark.slow
def test_the_command_runs_a_cell_resumes_it_and_reports(tmp_path, capsys):
    out = tmp_path / "cell"
    argv = ["cell", "--task", "edited", "--max-rows", "48", "--seeds", "0,1", "--designs", "branch;vanilla@/2",
            "--evals", "1", "--probe-steps", "2", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted((r["design"], r["seed"]) for r in records) == sorted(
        (d, s) for d in ("vanilla@16", "branch@16", "vanilla@8") for s in (0, 1))
    cell = json.loads((out / "cell.json").read_text())
    assert cell["vanilla"] == "vanilla@16" and cell["steps"] == {"vanilla@16": 3, "branch@16": 3, "vanilla@8": 6}
    assert all(r["steps"] == cell["steps"][r["design"]] for r in records)
    assert main(argv) == 2 and "holds an earlier cell" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    assert len((out / "records.jsonl").read_text().splitlines()) == 6  # nothing was missing: nothing ran again
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    markdown = (tmp_path / "report" / "paper.md").read_text()
    assert "| edited | `branch@16` |" in markdown and "#### edited" in markdown and "vanilla@8" in markdown
    summary = json.loads((tmp_path / "report" / "paper.json").read_text())
    assert set(summary["cells"][0]["rows"]) == {"vanilla@16", "branch@16", "vanilla@8"}
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r2")]) == 2
    assert "not a cell folder" in capsys.readouterr().err


@pytest.mark.slow
def test_the_cell_takes_its_learning_rate_batch_and_precision_and_resumes_only_with_them(tmp_path, capsys):
    out = tmp_path / "cell"
    argv = ["cell", "--task", "edited", "--max-rows", "32", "--seeds", "0,1", "--designs", "branch", "--evals", "1",
            "--probe-steps", "0", "--lr", "3e-3", "--batch-size", "8", "--precision", "bf16-mixed", "--out", str(out),
            "--quiet"]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {(r["design"], r["lr"], r["batch_size"], r["precision"]) for r in records} == {
        ("vanilla@8", 3e-3, 8, "bf16-mixed"), ("branch@8", 3e-3, 8, "bf16-mixed")}
    cell = json.loads((out / "cell.json").read_text())
    assert cell["precision"] == "bf16-mixed" and cell["task"]["lr"] == 3e-3 and cell["task"]["batch_size"] == 8
    capsys.readouterr()
    assert main([*argv[:-5], "--precision", "32-true", "--out", str(out), "--resume"]) == 2
    assert "precision" in capsys.readouterr().err


def test_summaries_need_the_cells_vanilla():
    cell = {"name": "c", "task": {}, "vanilla": "vanilla@8", "designs": ["branch@8"],
            "records": [_record("branch@8", 0, 1.0, 0.1, 1.0, 0.5, 0.6)]}
    with pytest.raises(ValueError, match="cell c: no record of its vanilla design 'vanilla@8'"):
        summarise_cell(cell)
    cell["records"] += [_record("vanilla@8", s, 1.0, 0.1, 1.0, 0.5, 0.6) for s in (0, 1)]
    cell["records"] += [_record("branch@8", 1, 1.0, 0.1, 1.0, 0.5, 0.6)]
    assert "| c | `branch@8` |" in to_markdown({"cells": [summarise_cell(cell)], "table_modes": ["vanilla", "branch"]})


def _cell_folder(folder, command, seeds, records):
    folder.mkdir()
    cell = {"name": "c", "task": {}, "vanilla": "vanilla@8", "designs": ["vanilla@8", "branch@8"],
            "provenance": {"command": command, "seeds": seeds}}
    (folder / "cell.json").write_text(json.dumps(cell))
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_a_resume_with_other_settings_is_refused_naming_each(tmp_path, capsys):
    out = _cell_folder(tmp_path / "cell", f"lit-prunedpo-paper cell --task edited --max-rows 48 --out {tmp_path}/cell",
                       [0, 1], [])
    argv = ["cell", "--task", "edited", "--max-rows", "24", "--warm-start-steps", "3", "--out", str(out), "--resume"]
    before = (out / "cell.json").read_text()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: --resume: the records in" in err and "--max-rows 48 -> 24; --warm-start-steps none -> 3" in err
    assert (out / "cell.json").read_text() == before  # nothing rewritten
    from lit_prunedpo_lab.study.paper_cli import resume_refusal

    # other seeds and designs choose which runs happen (each record names its own): no refusal, the seeds kept
    assert resume_refusal(out, ["cell", "--task", "edited", "--max-rows", "48", "--seeds", "5,6", "--designs", "branch",
                                "--out", "elsewhere", "--quiet"]) == (None, [0, 1])
    (out / "cell.json").write_text("{")
    assert main(argv) == 2 and "cell.json is corrupt or unreadable" in capsys.readouterr().err


def test_a_negative_warm_start_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["cell", "--task", "edited", "--warm-start-steps", "-5", "--out", "never"])
    assert stop.value.code == 2
    assert "argument --warm-start-steps: must be >= 0, got -5" in capsys.readouterr().err


def test_a_report_of_a_stopped_cell_names_the_missing_seeds(tmp_path, capsys):
    records = [_record(d, s, 1.0 + s, 0.1, 1.0, 0.5, 0.6) for d in ("vanilla@8", "branch@8") for s in (0, 1)]
    out = _cell_folder(tmp_path / "cell", "lit-prunedpo-paper cell --task edited --out cell", [0, 1, 2], records)
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    assert "no records of seed 2 of vanilla@8, branch@8 (a stopped cell" in capsys.readouterr().err
    summary = json.loads((tmp_path / "report" / "paper.json").read_text())
    assert summary["cells"][0]["provenance"]["seeds"] == [0, 1]
    assert "seeds [0, 1] (missing: seed 2 of vanilla@8, branch@8; a stopped cell)" in (
        tmp_path / "report" / "paper.md").read_text()
