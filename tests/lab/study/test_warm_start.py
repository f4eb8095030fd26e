"""The study's warm start on a tiny real task: the NLL on chosen responses falls, held-out rows are never seen,
the cache is reused, and every arm of a seed starts from the warmed weights (policy and reference alike)."""

from __future__ import annotations

import json

import pytest
import torch

from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.runner import train_arms, weights_checksum
from lit_prunedpo_lab.study.tasks import QUICKSTART_MODEL, EditedTask
from lit_prunedpo_lab.study.warm_start import RECORD, chosen_inputs, chosen_nll, warm_start

pytestmark = pytest.mark.slow  # warm-start trainings: `pytest -m slow` (CI runs it)

TINY = {**QUICKSTART_MODEL, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
        "num_key_value_heads": 1}
STEPS = 12


@pytest.fixture(scope="module")
def task():
    return EditedTask(name="tiny-warm", num_rows=200, batch_size=8, model=dict(TINY), warm_start_steps=STEPS,
                      warm_start_lr=1e-2)


@pytest.fixture(scope="module")
def dm(task, tmp_path_factory):
    return task.datamodule(tmp_path_factory.mktemp("warm-data"))


@pytest.fixture(scope="module")
def warmed(task, dm, tmp_path_factory):
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("warm-work")
    source, record = warm_start(task, 0, dm, work, STEPS, lr=task.warm_start_lr)
    return work, source, record


def test_chosen_inputs_score_every_chosen_token_after_its_prompt(dm):
    batch = next(iter(dm.train_dataloader()))
    inputs = chosen_inputs(batch)
    lengths = batch.response_lengths[:, 0]
    assert inputs.targets.numel() == int(lengths.sum())
    P = batch.prompt_width
    # the token at each gathered column is the one before its target: the prompt's last token, then the response
    row, col = inputs.gather_row, inputs.gather_col
    first = col == P - 1
    assert torch.equal(inputs.input_ids[row[first], col[first]], batch.prompt_ids[row[first], -1])
    full = torch.cat([batch.prompt_ids, batch.response_ids[:, 0]], dim=1)
    assert torch.equal(full[row, col + 1], inputs.targets)  # each target is the token after its column
    assert torch.equal(inputs.input_ids, full[:, : inputs.input_ids.shape[1]])
    assert inputs.input_ids.shape[1] == P + int(lengths.max()) - 1


def test_the_nll_on_chosen_responses_falls(warmed, task, dm):
    _, source, record = warmed
    losses = record["losses"]
    assert len(losses) == STEPS and record["reused"] is False and record["cpu_s"] > 0
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3
    batch = next(iter(dm.train_dataloader()))
    with torch.no_grad():
        assert float(chosen_nll(source.build(), batch)) < float(chosen_nll(task.policy(0).build(), batch)) - 0.3


def test_held_out_rows_are_never_seen(warmed, dm):
    _, _, record = warmed
    held_out = set(dm.val_dataset["index"])
    assert held_out and set(record["trained_rows"]) <= set(dm.train_dataset["index"])
    assert not held_out & set(record["trained_rows"])
    assert len(record["trained_rows"]) == STEPS * 8  # 12 steps of 8 pairs, within the first pass over 190 rows


def test_the_cache_is_reused_per_seed_and_settings(warmed, task, dm):
    work, source, record = warmed
    files = sorted((work / "warm-start").iterdir())
    assert len(files) == 1 and (files[0] / RECORD).exists()
    stamp = (files[0] / RECORD).stat().st_mtime_ns
    again, record_again = warm_start(task, 0, dm, work, STEPS, lr=task.warm_start_lr)
    assert record_again["reused"] is True and record_again["path"] == record["path"]
    assert (files[0] / RECORD).stat().st_mtime_ns == stamp
    assert weights_checksum(again.build()) == weights_checksum(source.build())
    # another seed or another step count is another warm start
    lines: list[str] = []
    _, other = warm_start(task, 1, dm, work, 51, lr=task.warm_start_lr, log=lines.append)
    assert other["reused"] is False and other["path"] != record["path"]
    # its progress: a line every 50 steps with the time left, then the summary
    assert len(lines) == 2 and lines[0].startswith("warm start seed 1: step 50 of 51, NLL ")
    assert "CPU-s left)" in lines[0] and lines[1].startswith("warm start seed 1: 51 steps, NLL ")
    assert len(list((work / "warm-start").iterdir())) == 2
    with pytest.raises(ValueError, match="steps"):
        warm_start(task, 0, dm, work, 0)


def test_every_arm_of_a_seed_starts_from_the_warmed_model(warmed, task, dm):
    work, source, record = warmed
    runs = train_arms(task, [Arm("vanilla", 8), Arm("branch", 8)], seeds=[0], budget_s=0.05, steps=1, evals=1, dm=dm,
                     work_dir=work, max_eval_pairs=8)
    warm_sum = weights_checksum(source.build())
    assert warm_sum != weights_checksum(task.policy(0).build())
    for run in runs:
        assert run.initial_checksum == pytest.approx(warm_sum)
        assert run.warm_start["reused"] is True and run.warm_start["path"] == record["path"]
        # the reference is the warmed model
        assert weights_checksum(run.module.reference.model) == pytest.approx(warm_sum)
        assert run.points[0].loss == pytest.approx(0.6931, abs=1e-3)  # policy = reference: every margin 0
        assert run.summary()["warm_start"]["cpu_s"] == record["cpu_s"]


def test_cli_reports_the_warm_start_apart(tmp_path):
    from lit_prunedpo_lab.study.cli import main

    out = tmp_path / "study"
    code = main(["--task", "quickstart", "--max-rows", "120", "--batch-size", "4", "--modes", "vanilla", "--seeds", "0",
                 "--budget", "0.05", "--steps", "1", "--evals", "1", "--no-matched", "--max-eval-pairs", "4",
                 "--warm-start-steps", "3", "--work-dir", str(tmp_path / "work"),
                 "--out", str(out), "--quiet"])
    assert code == 0
    payload = json.loads((out / "study.json").read_text())
    assert payload["task"]["warm_start_steps"] == 3 and payload["warm_start"]["0"]["steps"] == 3
    assert payload["warm_start"]["0"]["cpu_s"] > 0 and "not counted in any budget" in (out / "study.md").read_text()
    with pytest.raises(SystemExit):
        main(["--warm-start-steps", "-1"])
