"""The study's bookkeeping on a tiny real run: equal budgets, same initial weights per seed, seeds that differ,
evaluation kept off the training clock and equal to the module's own validation, the compute-matched batch, each
arm's learning rate and schedule, the summary's targets and controls, and the command: its argument checks, its
output folder check and its progress file."""

from __future__ import annotations

import json
import os

import lightning as L
import pytest
import torch

from lit_prunedpo_lab.bench.cost import ModelDims
from lit_prunedpo.module import PrunedDPO
from lit_prunedpo_lab.study.arms import Arm, ideal_speedup, matched_batch_size
from lit_prunedpo_lab.study.cli import main
from lit_prunedpo.optim import WarmupCosineLR
from lit_prunedpo_lab.study.curves import improvement_target, mean_curve
from lit_prunedpo_lab.study.report_summary import summarise
from lit_prunedpo_lab.study.runner import eval_batches, exact_eval, make_run, train_arms
from lit_prunedpo_lab.study.tasks import QUICKSTART_MODEL, EditedTask

pytestmark = pytest.mark.slow  # studies of tiny trainings: `pytest -m slow` (CI runs it)

TINY = {**QUICKSTART_MODEL, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
        "num_key_value_heads": 1}
BUDGET, STEPS, EVALS = 0.15, 4, 2


@pytest.fixture(scope="module")
def task():
    return EditedTask(name="tiny-edited", num_rows=160, batch_size=4, model=dict(TINY))


@pytest.fixture(scope="module")
def dm(task, tmp_path_factory):
    return task.datamodule(tmp_path_factory.mktemp("study-data"))


@pytest.fixture(scope="module")
def runs(task, dm):
    torch.set_num_threads(1)
    arms = [Arm("vanilla", 4), Arm("all", 4), Arm("branch", 6, matched=True), Arm("vanilla", 2, cost_matched=True)]
    return train_arms(task, arms, seeds=[0, 1], budget_s=BUDGET, steps=STEPS, evals=EVALS, dm=dm, max_eval_pairs=8)


def test_every_run_gets_both_budgets_and_the_same_grid(runs):
    assert len(runs) == 8
    for run in runs:
        time_points, step_points = run.on_grid("time"), run.on_grid("steps")
        assert len(time_points) == len(step_points) == EVALS + 1
        assert time_points[0].step == step_points[0].step == 0
        assert time_points[-1].cpu_s >= BUDGET and run.step >= STEPS
        for k, p in enumerate(time_points[1:], start=1):
            assert p.cpu_s >= BUDGET * k / EVALS  # evaluated once the training clock passed the grid point
        assert [p.step for p in step_points[1:]] == [2, 4]


def test_training_clocks_count_training_steps_only(runs):
    for run in runs:
        assert run.cpu_s == pytest.approx(sum(run.step_cpu)) and len(run.step_cpu) == run.step
        assert run.wall_s == pytest.approx(sum(run.step_wall))
        assert run.eval_wall_s > 0
        # an evaluation does not move the training clocks
        assert all(a.cpu_s <= b.cpu_s for a, b in zip(run.points, run.points[1:]))


def test_same_initial_weights_per_seed_and_seeds_differ(runs):
    by_seed = {}
    for run in runs:
        by_seed.setdefault(run.seed, []).append(run)
    for seed, rs in by_seed.items():
        assert len({r.initial_checksum for r in rs}) == 1, seed
        # one step from the same weights on the same first batch: the arms differ only by their samplers
        assert len({round(r.points[1].loss, 6) for r in rs}) == len(rs)
    assert len({r.initial_checksum for r in runs}) == 2
    # the sampler streams and the training order differ between seeds too
    streams = {r.seed: r.module.sampler_rng.seed for r in runs}
    assert streams == {0: 0, 1: 1}


def test_training_order_follows_the_seed(task, dm):
    first = {s: next(iter(make_run(task, Arm("vanilla", 4), s, dm).loader)).index.tolist() for s in (0, 1)}
    again = next(iter(make_run(task, Arm("branch", 4), 0, dm).loader)).index.tolist()
    assert first[0] == again and first[0] != first[1]


def test_exact_eval_is_the_modules_validation(task, dm):
    run = make_run(task, Arm("position", 4), 0, dm)
    for _ in range(3):
        run.train_step()
    loss, accuracy = exact_eval(run.module, eval_batches(dm))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (metrics,) = trainer.validate(run.module, datamodule=dm, verbose=False)
    assert loss == pytest.approx(metrics["val/loss"], rel=1e-5)
    assert accuracy == pytest.approx(metrics["val/rewards/accuracies"], abs=1e-6)


def test_summary_targets_a_share_of_vanillas_best_improvement_and_judges_against_the_better_vanilla(runs):
    s = summarise(runs, "cpu", BUDGET, EVALS, share=0.8, resamples=200, controls={"all": "vanilla@2 (cost-matched)"})
    vanilla = [[p.loss for p in r.on_grid("time")] for r in runs if r.arm.name == "vanilla@4"]
    assert s["target_loss"] == pytest.approx(improvement_target(mean_curve(vanilla), 0.8))
    names = [row["arm"] for row in s["arms"]]
    assert names == ["vanilla@4", "all@4", "branch@6 (matched)", "vanilla@2 (cost-matched)"]
    rows = {row["arm"]: row for row in s["arms"]}
    same = rows["vanilla@4"]["loss_time_ratio"]
    assert (same["value"], same["low"], same["high"], same["verdict"]) == (1.0, 1.0, 1.0, "TIE")
    # `all` is judged against both vanillas, `branch` (no control given) against the same batch only
    assert rows["all@4"]["references"] == ["vanilla@4", "vanilla@2 (cost-matched)"]
    assert "loss_time_ratio_same_batch" in rows["all@4"]
    assert rows["branch@6 (matched)"]["references"] == ["vanilla@4"]
    assert rows["vanilla@2 (cost-matched)"]["references"] == ["vanilla@4"]
    for row in s["arms"]:
        mean, low, high = row["best_loss"]
        assert low <= mean <= high and len(row["loss_seed_times"]) == 2
        assert row["loss_time_ratio"]["verdict"] in ("WIN", "TIE", "LOSS")
    with pytest.raises(ValueError, match="vanilla"):
        summarise([r for r in runs if r.arm.mode != "vanilla"], "cpu", BUDGET, EVALS)
    with pytest.raises(ValueError, match="control"):
        summarise(runs, "cpu", BUDGET, EVALS, controls={"all": "vanilla@3 (cost-matched)"})


def test_each_arm_trains_at_its_own_rate_on_a_warm_up_then_cosine_schedule(task, dm):
    run = make_run(task, Arm("branch", 4, lr=0.01, schedule_steps=60), 0, dm)
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 / (task.warmup_steps + 1))  # warming up
    scheduler = run.scheduler
    assert isinstance(scheduler, WarmupCosineLR) and scheduler.total_steps == 60
    assert scheduler.warmup_steps == task.warmup_steps == 20
    factor = scheduler.lr_lambdas[0]
    assert factor(20) == pytest.approx(1.0) and factor(40) == pytest.approx(0.5) and factor(60) == pytest.approx(0.0)
    assert run.summary()["lr"] == 0.01 and run.summary()["schedule_steps"] == 60
    plain = make_run(task, Arm("branch", 4), 0, dm)  # no schedule length: constant after the warm-up, the task's rate
    assert plain.scheduler.lr_lambdas[0](1000) == 1.0 and plain.summary()["lr"] == task.lr


def test_compute_matched_batch(task, dm):
    dims = ModelDims.from_model(task.policy(0).build())
    batches = [b for _, b in zip(range(4), dm.train_dataloader())]
    assert ideal_speedup("vanilla", batches, dims) == pytest.approx(1.0)
    branch = ideal_speedup("branch", batches, dims)
    assert 1.2 < branch < 1.4  # one of two branches back-propagated, online reference: 4F / 3F at most
    assert matched_batch_size(16, branch) == round(16 * branch)
    assert matched_batch_size(16, 0.9) == 16
    with pytest.raises(ValueError, match="unknown mode"):
        Arm("prune-everything", 4)


def test_bad_study_arguments_are_refused(task, dm):
    with pytest.raises(ValueError, match="seeds must differ"):
        train_arms(task, [Arm("vanilla", 4)], [0, 0], 1.0, 2, 1, dm=dm)
    with pytest.raises(ValueError, match="budget_s"):
        train_arms(task, [Arm("vanilla", 4)], [0], 0.0, 2, 1, dm=dm)
    # was a ZeroDivisionError at the first evaluation
    with pytest.raises(ValueError, match="max_eval_pairs must be >= 1"):
        train_arms(task, [Arm("vanilla", 4)], [0], 1.0, 2, 1, dm=dm, max_eval_pairs=0)
    with pytest.raises(ValueError, match="cost-matched arm is a vanilla arm"):
        Arm("branch", 4, cost_matched=True)


TINY_CLI = ["--task", "quickstart", "--max-rows", "120", "--batch-size", "4", "--seeds", "0,1", "--budget", "0.1",
            "--steps", "2", "--evals", "1", "--lr", "0.003", "--calibration-steps", "1", "--bootstrap", "200",
            "--quiet"]


def test_cli_runs_the_protocol_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "study"
    code = main(TINY_CLI + ["--modes", "vanilla,branch", "--tune-seeds", "100", "--lr-factors", "0.5,2", "--out",
                            str(out)])
    assert code == 0
    payload = json.loads((out / "study.json").read_text())
    assert payload["task"]["lr"] == 0.003  # --lr is the base rate the sweep multiplies
    matched = round(4 * payload["ideal_speedups"]["branch"])
    cal = payload["calibration"]
    control = cal["cost_matched"]["branch"]["batch"]  # measured, so it depends on the machine: between 1 and 4
    assert (1 <= control <= 4
            and cal["cost_matched"]["branch"]["flop_batch"] == round(4 / payload["ideal_speedups"]["branch"]))
    assert sorted(cal["vanilla_measured"]) == ["1", "2", "4"]
    names = [a["arm"] for a in payload["summary"]["arms"]]
    expected = ["vanilla@4", "branch@4"] + ([f"vanilla@{control} (cost-matched)"] if control < 4
                                            else []) + [f"branch@{matched} (matched)"]
    assert names == expected
    rows = {r["arm"]: r for r in payload["summary"]["arms"]}
    assert rows["branch@4"]["references"] == ["vanilla@4"] + ([f"vanilla@{control} (cost-matched)"] if control < 4
                                                              else [])
    # every arm at its own rate from the sweep on the tuning seed, over the sweep's factors
    sweep = payload["sweep"]
    assert sweep["seeds"] == [100] and len(sweep["rows"]) == 2 * len(names)
    assert all(rows[r["arm"]]["lr"] == r["lr"] for r in sweep["rows"] if r["chosen"])
    assert {r["lr"] for r in sweep["rows"]} == {0.0015, 0.006}
    assert all(r["schedule_steps"] >= 2 for r in payload["summary"]["arms"])
    assert payload["clock"] == "cpu" and payload["seeds"] == [0, 1] and len(payload["runs"]) == 2 * len(names)
    assert payload["task"]["max_rows"] == 120 and payload["eval_pairs"] == 6  # 5% of 120 rows held out
    md = (out / "study.md").read_text()
    assert "time to loss target" in md and "Verdicts:" in md and "- branch@4: loss " in md
    assert "| vanilla@4 |" in capsys.readouterr().out
    # the progress file: the command, the calibration, every evaluation of the sweep and the study, every run
    lines = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    kinds = [line["kind"] for line in lines]
    assert kinds[:2] == ["study", "calibration"] and kinds.count("sweep") == 1
    assert sum(1 for line in lines if line["kind"] == "point"
               and line["phase"] == "study") == sum(len(r["points"]) for r in payload["runs"])
    assert sum(1 for line in lines if line["kind"] == "run" and line["phase"] == "study") == len(payload["runs"])
    assert sum(1 for line in lines if line["kind"] == "run" and line["phase"] == "sweep") == 2 * len(names)


@pytest.mark.parametrize("argv, message", [
    (["--max-eval-pairs", "0"], "argument --max-eval-pairs: must be >= 1, got 0"),
    (["--budget", "0"], "argument --budget: must be a finite number > 0, got 0"),
    (["--budget", "inf"], "argument --budget: must be a finite number > 0, got inf"),
    (["--steps", "-3"], "argument --steps: must be >= 1, got -3"),
    (["--evals", "two"], "argument --evals: expected an integer >= 1, got 'two'"),
    (["--threads", "0"], "argument --threads: must be >= 1"),
    (["--batch-size", "0"], "argument --batch-size: must be >= 1"),
    (["--max-rows", "1"], "argument --max-rows: must be >= 2"),
    (["--lr", "0"], "argument --lr: must be a finite number > 0"),
    (["--lr", "nan"], "argument --lr: must be a finite number > 0"),
    (["--warm-start-steps", "-1"], "argument --warm-start-steps: must be >= 0"),
    (["--prune-early", "1.5"], "argument --prune-early: must be a finite number in [0, 1]"),
    (["--seeds", "0,0"], "argument --seeds: need distinct seeds"),
    (["--seeds", "a"], "argument --seeds: expected comma-separated integers"),
    (["--tune-seeds", ""], "argument --tune-seeds: need distinct seeds"),
    (["--lr-factors", "1,-1"], "argument --lr-factors: need distinct positive numbers"),
    (["--target-share", "0"], "argument --target-share: must be a finite number in (0, 1]"),
    (["--confidence", "1"], "argument --confidence: must be a finite number in (0, 1)"),
    (["--bootstrap", "10"], "argument --bootstrap: must be >= 100"),
    (["--calibration-steps", "0"], "argument --calibration-steps: must be >= 1"),
    (["--modes", "vanilla,nope"], "argument --modes: unknown or empty ['nope']"),
    (["--seeds", "0,100", "--tune-seeds", "100,101"], "--tune-seeds [100, 101] and --seeds [0, 100] share [100]"),
])
def test_cli_refuses_bad_numbers_while_parsing(argv, message, capsys, monkeypatch):
    import lit_prunedpo_lab.study.tasks as tasks

    monkeypatch.setattr(tasks.QuickstartTask, "datamodule", lambda *a: pytest.fail("read data after a bad argument"))
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_study_at_batch_1_says_what_it_cannot_conclude(tmp_path, capsys):
    # no vanilla batch below 1 pair: no cost-matched control, and the log and study.md say what that leaves out
    from lit_prunedpo_lab.study.report_markdown import ONE_PAIR_NOTE

    argv = [a for a in TINY_CLI if a != "--quiet"]
    argv[argv.index("--batch-size") + 1] = "1"
    out = tmp_path / "study"
    assert main(argv + ["--modes", "vanilla,branch", "--no-sweep", "--out", str(out)]) == 0
    assert f"warning: {ONE_PAIR_NOTE}" in capsys.readouterr().err
    assert f"- {ONE_PAIR_NOTE}." in (out / "study.md").read_text()
    assert ONE_PAIR_NOTE.startswith("batch 1: no vanilla batch is smaller, so no cost-matched control exists")


def test_cli_checks_the_output_folder_before_training(tmp_path, capsys, monkeypatch):
    import lit_prunedpo_lab.study.tasks as tasks

    monkeypatch.setattr(tasks.QuickstartTask, "datamodule", lambda *a: pytest.fail("read data before checking --out"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        main(TINY_CLI + ["--out", str(blocker / "study")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--out: output folder '{blocker / 'study'}' cannot be created or written" in last
    if os.geteuid() != 0:  # root writes through permissions
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(SystemExit):
            main(TINY_CLI + ["--out", str(locked)])
        assert f"output folder '{locked}' cannot be created or written" in capsys.readouterr().err


def test_a_study_stopped_late_keeps_what_it_measured(tmp_path, monkeypatch):
    """The study is killed at its 7th evaluation of at least 8 (2 seeds x step 0 and 3 per grid), after the
    calibration: progress.jsonl holds the 6 before."""
    import lit_prunedpo_lab.study.runner as runner

    evaluations, exact = [], runner.exact_eval

    def dies_at_the_seventh(module, batches, *precision):
        evaluations.append(1)
        if len(evaluations) == 7:
            raise KeyboardInterrupt
        return exact(module, batches, *precision)

    monkeypatch.setattr(runner, "exact_eval", dies_at_the_seventh)
    out = tmp_path / "study"
    with pytest.raises(KeyboardInterrupt):
        main(TINY_CLI + ["--modes", "vanilla", "--no-sweep", "--evals", "3", "--steps", "3", "--out", str(out)])
    lines = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    points = [line for line in lines if line["kind"] == "point"]
    assert [line["kind"] for line in lines[:2]] == ["study", "calibration"] and len(points) == 6
    assert {(p["arm"], p["seed"]) for p in points} == {("vanilla@4", 0), ("vanilla@4", 1)}
    assert all(set(p) >= {"step", "cpu_s", "wall_s", "loss", "accuracy", "lr", "phase"} for p in points)
    assert not (out / "study.json").exists()


def test_prune_early_arm_switches_to_exact_at_its_share_of_the_budget(task, dm):
    run = make_run(task, Arm("branch", 4, prune_fraction=0.5), 0, dm, budget_s=10.0, clock="cpu")
    assert run.exact_after_s == 5.0 and "then exact after 0.5" in run.arm.name
    run.train_step()
    assert type(run.module.branch_sampler).__name__ == "RandomBranch"
    run.cpu_s = 5.0  # the training clock reached half the budget
    run.train_step()
    assert type(run.module.branch_sampler).__name__ == "BothBranches"
    with pytest.raises(ValueError, match="budget_s"):
        make_run(task, Arm("branch", 4, prune_fraction=0.5), 0, dm)


def test_hh_rlhf_task_holds_out_real_pairs(tmp_path):
    from lit_prunedpo_lab.study.tasks import HHRLHFTask

    small = {**TINY, "vocab_size": 50257}
    task = HHRLHFTask(max_rows=60, batch_size=2, max_length=48, max_prompt_length=24, model=small)
    dm = task.datamodule(tmp_path)
    assert len(dm.val_dataset) == 6 and len(dm.train_dataset) == 54
    assert not set(dm.val_dataset["index"]) & set(dm.train_dataset["index"])  # held-out pairs never trained on
    run = make_run(task, Arm("branch", 2), 0, dm)
    run.train_step()
    loss, accuracy = exact_eval(run.module, eval_batches(dm))
    assert 0 < loss < 5 and 0 <= accuracy <= 1
    with pytest.raises(FileNotFoundError, match="data file"):
        HHRLHFTask(path=str(tmp_path / "missing.jsonl.gz")).datamodule(tmp_path)


@pytest.mark.parametrize("coupled, uncoupled", [("position-coupled", "position-bernoulli"), ("all-coupled", "all")])
def test_coupled_arms_differ_from_their_twins_only_in_the_shared_position_draw(task, dm, coupled, uncoupled):
    batch = next(iter(dm.train_dataloader()))
    (pre_c, pos_c, br_c), (pre_u, pos_u, br_u) = Arm(coupled, 4).samplers(), Arm(uncoupled, 4).samplers()
    assert (type(pre_c), type(br_c)) == (type(pre_u), type(br_u)) and type(pos_c) is not type(pos_u)
    assert isinstance(pos_c, type(pos_u)) and vars(pos_c) == vars(pos_u)
    kept = batch.response_lengths.reshape(-1)
    torch.testing.assert_close(pos_c.inclusion(kept, 40), pos_u.inclusion(kept, 40))
    masks = pos_c.draw(kept, 40, torch.Generator().manual_seed(0))
    same_length = kept[0::2] == kept[1::2]
    assert bool(same_length.any())
    assert torch.equal(masks[0::2][same_length], masks[1::2][same_length])
    run = make_run(task, Arm(coupled, 4), 0, dm)
    assert isinstance(run.module.position_sampler, type(pos_c))


def test_a_study_step_is_the_modules_step(task, dm, monkeypatch):
    """A run trains through ``PrunedDPO.step`` (the step ``training_step`` runs), with the module's own parts and
    sampler stream: one call per training step."""
    calls, step = [], PrunedDPO.step
    monkeypatch.setattr(PrunedDPO, "step",
                        lambda self, batch, *args: calls.append((self, args)) or step(self, batch, *args))
    run = make_run(task, Arm("all", 4), 0, dm)
    run.train_step()
    run.train_step()
    assert calls == [(run.module, ())] * 2 and run.module.sampler_rng.step == 2


def test_a_diverged_run_stops_alone_only_when_asked(task, dm, monkeypatch):
    """The sweep's runs may blow up at a large rate: with ``stop_on_nonfinite`` that run stops, marked, and
    the others finish; the study itself still stops on it."""
    import lit_prunedpo_lab.study.runner as runner

    train_step = runner.Run.train_step

    def branch_blows_up(self):
        if self.arm.mode == "branch" and self.step == 1:
            raise FloatingPointError(f"study run {self.arm.name} seed {self.seed}: non-finite loss at step 1")
        train_step(self)

    monkeypatch.setattr(runner.Run, "train_step", branch_blows_up)
    arms = [Arm("vanilla", 4), Arm("branch", 4)]
    runs = train_arms(task, arms, [0], budget_s=0.05, steps=3, evals=1, dm=dm, max_eval_pairs=4, stop_on_nonfinite=True)
    (vanilla, branch) = runs
    assert branch.diverged and branch.step == 1 and all(p.step <= 1 for p in branch.points)  # stopped at the blow-up
    assert not vanilla.diverged and vanilla.step >= 3
    with pytest.raises(FloatingPointError, match="branch@4 seed 0"):
        train_arms(task, arms, [0], budget_s=0.05, steps=3, evals=1, dm=dm, max_eval_pairs=4)


def test_the_study_is_a_function_that_returns_its_report_and_writes_only_where_told(tmp_path):
    """``run_study`` (what the command and the regime map call): the same report with or without a folder, a folder
    holding exactly the files it names, no table printed."""
    from lit_prunedpo_lab.study.arguments import build_parser, resolve_options
    from lit_prunedpo_lab.study.cli import task_of
    from lit_prunedpo_lab.study.protocol import STUDY_FILES, StudyResult, run_study
    from lit_prunedpo_lab.study.tasks import TASKS

    args = build_parser().parse_args(TINY_CLI + ["--modes", "vanilla", "--no-sweep", "--seeds", "0"])
    task, options = task_of(args, TASKS["quickstart"]), resolve_options(args)
    lines: list[str] = []
    kept = run_study(task, options, log=lines.append, command="a study")
    assert isinstance(kept, StudyResult) and kept.files == [] and kept.payload["command"] == "a study"
    assert any(line.startswith("arms: vanilla@4") for line in lines)
    out = tmp_path / "study"
    written = run_study(task, options, out=out)
    assert sorted(p.name for p in written.files) == sorted(n for n in STUDY_FILES if n != "progress.jsonl")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(STUDY_FILES)
    assert json.loads((out / "study.json").read_text())["runs"] == json.loads(json.dumps(written.payload["runs"]))
    assert written.markdown == (out / "study.md").read_text()


def test_a_study_in_bf16_mixed_calibrates_trains_and_evaluates_in_it(monkeypatch):
    """``--precision bf16-mixed``: the calibration's steps, every run's steps and every evaluation run under bfloat16
    autocast (none in float32), and the report says so; the default stays float32."""
    from lit_prunedpo_lab.study import runner
    from lit_prunedpo_lab.study.arguments import build_parser, resolve_options
    from lit_prunedpo_lab.study.cli import task_of
    from lit_prunedpo_lab.study.protocol import run_study
    from lit_prunedpo_lab.study.tasks import TASKS

    seen: list[str] = []
    real = runner.forward_precision
    monkeypatch.setattr(runner, "forward_precision", lambda module, precision: seen.append(precision)
                        or real(module, precision))
    payloads = {}
    for precision in ("bf16-mixed", "32-true"):
        seen.clear()
        args = build_parser().parse_args(TINY_CLI + ["--modes", "branch", "--no-sweep", "--no-matched", "--seeds",
                                                     "0", "--precision", precision])
        payloads[precision] = run_study(task_of(args, TASKS["quickstart"]), resolve_options(args)).payload
        assert seen and set(seen) == {precision}
        assert payloads[precision]["precision"] == precision == payloads[precision]["calibration"]["precision"]
        assert {r["precision"] for r in payloads[precision]["runs"]} == {precision}
    losses = {p: [pt["loss"] for r in payload["runs"] for pt in r["points"][1:]] for p, payload in payloads.items()}
    assert losses["bf16-mixed"] != losses["32-true"]  # the same runs, another arithmetic
    from lit_prunedpo_lab.study.report import to_markdown

    assert "pairs; 1 torch thread; bf16-mixed (float32 weights, the forward under bfloat16 autocast);" in to_markdown(
        payloads["bf16-mixed"])
    assert "pairs; 1 torch thread; float32;" in to_markdown(payloads["32-true"])


def test_the_study_device_reaches_the_calibration_every_run_and_the_record(monkeypatch):
    """``--device``: every run the calibration and the study build is built on it, the runs' records and the payload
    name it (a CUDA study is refused here without a GPU: tests/lab/study/test_devices.py)."""
    from lit_prunedpo_lab.study import calibrate, runner
    from lit_prunedpo_lab.study.arguments import build_parser, resolve_options
    from lit_prunedpo_lab.study.cli import task_of
    from lit_prunedpo_lab.study.protocol import run_study
    from lit_prunedpo_lab.study.report import to_markdown
    from lit_prunedpo_lab.study.tasks import TASKS

    seen: list[str] = []
    real = runner.make_run

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device", "not given"))
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "make_run", spy)
    monkeypatch.setattr(calibrate, "make_run", spy)
    args = build_parser().parse_args(TINY_CLI + ["--modes", "branch", "--no-sweep", "--no-matched", "--seeds", "0",
                                                 "--device", "cpu:0"])
    payload = run_study(task_of(args, TASKS["quickstart"]), resolve_options(args)).payload
    assert len(seen) >= 4 and set(seen) == {"cpu:0"}  # the calibration's arms and both study runs
    assert payload["device"] == payload["calibration"]["device"] == "cpu:0"
    assert {r["device"] for r in payload["runs"]} == {"cpu:0"}
    assert "; on cpu:0;" in to_markdown(payload)


def test_seeds_trained_a_few_at_a_time_give_the_same_runs_and_free_each_group(task, dm):
    """``seeds_at_once=1``: the same runs (every evaluation equal: a run's arithmetic depends on its seed only), the
    seeds one after another, and a group's models freed before the next group's are built (the memory of one seed's
    runs, not of all)."""
    import gc
    import weakref

    arms, seeds = [Arm("vanilla", 4), Arm("branch", 4)], [0, 1, 2]
    together = train_arms(task, arms, seeds, budget_s=None, steps=2, evals=1, dm=dm, max_eval_pairs=8)
    order, alive_at_start = [], {}
    models: dict[int, list] = {}

    def on_point(run, point):
        order.append(run.seed)
        if point.step == 0:
            gc.collect()
            alive_at_start.setdefault(run.seed, [s for s, refs in models.items() if s != run.seed
                                                 and any(ref() is not None for ref in refs)])
            models.setdefault(run.seed, []).append(weakref.ref(run.module))

    grouped = train_arms(task, arms, seeds, budget_s=None, steps=2, evals=1, dm=dm, max_eval_pairs=8,
                         seeds_at_once=1, on_point=on_point)
    assert [(r.arm.name, r.seed) for r in grouped] == [(r.arm.name, r.seed) for r in together]
    for a, b in zip(together, grouped):
        assert [(p.step, p.loss, p.accuracy) for p in a.points] == [(p.step, p.loss, p.accuracy) for p in b.points]
        assert b.module is None and b.summary()["lr"] == a.summary()["lr"]
    assert order == sorted(order)  # seed 0's evaluations, then seed 1's, then seed 2's
    assert alive_at_start == {0: [], 1: [], 2: []}  # no earlier group's model alive when a group starts
    with pytest.raises(ValueError, match="seeds_at_once must be an integer >= 1"):
        train_arms(task, arms, seeds, budget_s=None, steps=2, evals=1, dm=dm, seeds_at_once=0)


def test_a_study_whose_runs_cannot_fit_in_memory_stops_before_training(task, dm, monkeypatch):
    """The runs of a group are counted against the memory free once the first is built: too many stop the study with
    the figures (the process was killed part way before, with no message), fewer at once pass."""
    from lit_prunedpo_lab.study import runner
    from lit_prunedpo_lab.study.devices import RunsDoNotFit

    one = runner.training_state_bytes(make_run(task, Arm("vanilla", 4), 0, dm).module)
    monkeypatch.setattr(runner, "available_bytes", lambda device: int(2.5 * one))  # 3 runs in all: the 1st + 2.5
    arms, done = [Arm("vanilla", 4), Arm("branch", 4)], []
    with pytest.raises(RunsDoNotFit, match="4 runs training at once need at least"):
        train_arms(task, arms, [0, 1], budget_s=None, steps=1, evals=1, dm=dm, max_eval_pairs=4,
                   on_point=lambda r, p: done.append(p))
    assert done == []  # nothing was trained or evaluated
    runs = train_arms(task, arms, [0, 1], budget_s=None, steps=1, evals=1, dm=dm, max_eval_pairs=4, seeds_at_once=1)
    assert len(runs) == 4
