"""The study's bookkeeping on a tiny real run: equal budgets, same initial weights per seed, seeds that differ,
evaluation kept off the training clock and equal to the module's own validation, and the compute-matched batch."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch

from lit_prunedpo.bench.cost import ModelDims
from lit_prunedpo.module import PrunedDPO
from lit_prunedpo.study.arms import Arm, ideal_speedup, matched_batch_size
from lit_prunedpo.study.cli import main
from lit_prunedpo.study.report import summarise
from lit_prunedpo.study.runner import eval_batches, exact_eval, make_run, run_study
from lit_prunedpo.study.tasks import QUICKSTART_MODEL, EditedTask

TINY = {**QUICKSTART_MODEL, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1}
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
    arms = [Arm("vanilla", 4), Arm("all", 4), Arm("branch", 6, matched=True)]
    return run_study(task, arms, seeds=[0, 1], budget_s=BUDGET, steps=STEPS, evals=EVALS, dm=dm, max_eval_pairs=8)


def test_every_run_gets_both_budgets_and_the_same_grid(runs):
    assert len(runs) == 6
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


def test_summary_targets_vanilla_and_reports_every_arm(runs):
    s = summarise(runs, "cpu", BUDGET, EVALS)
    vanilla_final = [r.on_grid("time")[-1].loss for r in runs if r.arm.name == "vanilla@4"]
    assert s["target_loss"] == pytest.approx(sum(vanilla_final) / 2)
    names = [row["arm"] for row in s["arms"]]
    assert names == ["vanilla@4", "all@4", "branch@6 (matched)"]
    assert s["arms"][0]["loss_time_ratio"]["mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="vanilla"):
        summarise([r for r in runs if r.arm.mode != "vanilla"], "cpu", BUDGET, EVALS)


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
        run_study(task, [Arm("vanilla", 4)], [0, 0], 1.0, 2, 1, dm=dm)
    with pytest.raises(ValueError, match="budget_s"):
        run_study(task, [Arm("vanilla", 4)], [0], 0.0, 2, 1, dm=dm)


def test_cli_writes_the_report(tmp_path, capsys):
    out = tmp_path / "study"
    code = main(["--task", "quickstart", "--max-rows", "120", "--batch-size", "4", "--modes", "vanilla,branch", "--seeds", "0,1",
                 "--budget", "0.1", "--steps", "2", "--evals", "1", "--lr", "0.003", "--out", str(out), "--quiet"])
    assert code == 0
    payload = json.loads((out / "study.json").read_text())
    assert payload["task"]["lr"] == 0.003  # --lr replaces the task's learning rate for every arm
    matched = round(4 * payload["ideal_speedups"]["branch"])
    assert [a["arm"] for a in payload["summary"]["arms"]] == ["vanilla@4", "branch@4", f"branch@{matched} (matched)"]
    assert payload["clock"] == "cpu" and payload["seeds"] == [0, 1] and len(payload["runs"]) == 6
    assert payload["task"]["max_rows"] == 120 and payload["eval_pairs"] == 6  # 5% of 120 rows held out
    assert "time to loss target" in (out / "study.md").read_text()
    assert "| vanilla@4 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--modes", "vanilla,nope"])
    with pytest.raises(SystemExit):
        main(["--lr", "0"])


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
    from lit_prunedpo.study.tasks import HHRLHFTask

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


@pytest.mark.parametrize("coupled, uncoupled", [("position-coupled", "position"), ("all-coupled", "all")])
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
    monkeypatch.setattr(PrunedDPO, "step", lambda self, batch, *args: calls.append((self, args)) or step(self, batch, *args))
    run = make_run(task, Arm("all", 4), 0, dm)
    run.train_step()
    run.train_step()
    assert calls == [(run.module, ())] * 2 and run.module.sampler_rng.step == 2
