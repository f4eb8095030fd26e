"""TRLKeys: a run through the real CLI logs exactly TRL 1.16's DPOTrainer keys (read from TRL's own source where trl
is installed, and from the copy in lit_prunedpo.trl_keys), each with the value of the package's own metric of the
same meaning, at TRL's step; keys without TRL's meaning (a pruned window, SimPO's rewards, a window of several
batches) are not written under TRL's names."""

from __future__ import annotations

import csv
import importlib.util
import re
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from lit_prunedpo.callbacks import TRLKeys
from lit_prunedpo.cli import build_cli
from lit_prunedpo.losses import SimPOLoss, SigmoidLoss
from lit_prunedpo.metrics import token_metrics, weighted_mean
from lit_prunedpo.trl_keys import (
    DPO_METRICS, NOT_PROVIDED, PROVIDED, TRAINER_EVALUATION, TRAINER_TRAINING, TRL_KEYS, RowContext,
    reports_dpo_rewards, trl_row,
)
from lit_prunedpo.run.validation import exact_step

from helpers import REPO, csv_logger

#: The package's own key groups (and Lightning's): what a run writes beside TRL's keys with own_keys=all.
OWN = ("train/", "val/", "memory/", "time/", "throughput/")


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory, monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets_cache"))


def trl_source_keys() -> tuple[list[str], str]:
    """``DPOTrainer._metrics``' keys in the installed TRL's source, in order, and that source's evaluation prefix
    line; skipped without trl."""
    if importlib.util.find_spec("trl") is None:
        pytest.skip("needs the [peer] extra (trl)")
    source = (Path(importlib.util.find_spec("trl").origin).parent / "trainer/dpo_trainer.py").read_text()
    keys = list(dict.fromkeys(re.findall(r'self\._metrics\[mode\]\["([^"]+)"\]', source)))
    prefix = re.search(r'metrics = \{f"(\w+)\{key\}": val for key, val in metrics\.items\(\)\}', source)
    return keys, prefix.group(1) if prefix else ""


def test_the_copied_keys_are_trls_own():
    keys, prefix = trl_source_keys()
    assert keys == list(DPO_METRICS), f"trl {version('trl')} logs other keys than the copy of TRL 1.16's"
    assert prefix == "eval_"
    trainer = (Path(importlib.util.find_spec("transformers").origin).parent / "trainer.py").read_text()
    for key in TRAINER_TRAINING:
        assert f'logs["{key}"] = ' in trainer, key
    assert 'metrics[f"{metric_key_prefix}_loss"]' in trainer
    speed = (Path(importlib.util.find_spec("transformers").origin).parent / "trainer_utils.py").read_text()
    for key in TRAINER_EVALUATION[1:4]:
        assert key.replace("eval_", '{split}_') in speed, key


def _fit(root: Path, *extra: str):
    args = ["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={root}",
            *csv_logger(root), "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            "--trainer.log_every_n_steps=1", "--data.init_args.max_rows=48", "--data.init_args.val_fraction=0.15",
            "--data.init_args.batch_size=8", "--data.init_args.val_batch_size=3",
            "--trainer.callbacks+=lit_prunedpo.callbacks.TRLKeys", *extra]
    return build_cli(args)


def _rows(root: Path) -> tuple[list[str], list[dict[str, float]]]:
    (metrics,) = (root / "lightning_logs").glob("*/metrics.csv")
    with open(metrics) as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), [{k: float(v) for k, v in row.items() if v != ""} for row in reader]


def _batch_means(module, loader) -> dict[str, float]:
    """TRL's evaluation values computed here, independently: each validation batch's mean, averaged over batches."""
    per_batch: dict[str, list[float]] = {}
    module.eval()
    with torch.no_grad():
        for batch in loader:
            plan, logps, _ = exact_step(module, batch, token_stats=True)
            values = {k: v.mean() for k, v in module.exact_pair_metrics(batch).items()}
            values.update({k: weighted_mean(v, w) for k, (v, w) in
                           token_metrics(plan, logps.policy_token_stats, batch.num_pairs).items()})
            for key, value in values.items():
                per_batch.setdefault(f"eval_{key}", []).append(float(value))
    return {key: sum(v) / len(v) for key, v in per_batch.items()}


def test_a_run_logs_trls_keys_with_the_values_of_its_own(tmp_path):
    source, _ = trl_source_keys() if importlib.util.find_spec("trl") else (list(DPO_METRICS), "")
    expected = {*TRAINER_TRAINING, *source, *TRAINER_EVALUATION, *(f"eval_{k}" for k in source)} - NOT_PROVIDED.keys()
    cli = _fit(tmp_path, "--trainer.max_steps=4", "--trainer.val_check_interval=4",
               "--trainer.callbacks.own_keys=all")
    header, rows = _rows(tmp_path)
    assert {k for k in header if not k.startswith(OWN)} - {"step"} == expected == PROVIDED
    training = [row for row in rows if "loss" in row]
    (evaluation,) = [row for row in rows if "eval_loss" in row]
    assert [row["step"] for row in training] == [1, 2, 3, 4] and evaluation["step"] == 4  # TRL's: steps done
    per_epoch = cli.trainer.num_training_batches
    for row in training:
        for key in ("loss", "grad_norm", "learning_rate", "num_tokens", *DPO_METRICS[1:]):
            assert row[key] == row[f"train/{key}"], key
        assert row["epoch"] == pytest.approx(row["step"] / per_epoch)
    assert evaluation["eval_loss"] == evaluation["val/loss"] and evaluation["epoch"] == pytest.approx(4 / per_epoch)
    assert evaluation["eval_num_tokens"] == training[-1]["num_tokens"]
    # the batches of 3, 3 and 1 pairs: TRL's mean of batch means, not the mean over pairs (val/*)
    loader = cli.datamodule.val_dataloader()
    assert [batch.num_pairs for batch in loader] == [3, 3, 1]
    for key, value in _batch_means(cli.model, loader).items():
        if key != "eval_loss":
            assert evaluation[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    pairs = evaluation["eval_samples_per_second"] * evaluation["eval_runtime"]
    assert pairs == pytest.approx(7, rel=0.05) and evaluation["eval_runtime"] > 0
    assert evaluation["eval_steps_per_second"] == pytest.approx(3 / evaluation["eval_runtime"], rel=0.05)
    assert not {k for k in header if k in TRL_KEYS} & set(NOT_PROVIDED)


def test_own_keys_none_writes_trls_keys_alone_and_pruned_windows_keep_their_own_names(tmp_path):
    _fit(tmp_path, "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.callbacks.own_keys=none",
         "--config", str(REPO / "configs/modes/position.yaml"))
    header, rows = _rows(tmp_path)
    # every step pruned positions: its loss, rewards, logps and token means are IPW estimates, not TRL's values
    pruned = {"loss", "logits/chosen", "logits/rejected", "entropy", "mean_token_accuracy", "rewards/chosen",
              "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected"}
    assert set(header) == (PROVIDED - pruned) | {"step"}
    assert all("grad_norm" in row for row in rows if "eval_loss" not in row)


def test_under_gradient_accumulation_a_row_averages_every_micro_batch_as_trls(tmp_path):
    cli = _fit(tmp_path, "--trainer.max_steps=2", "--trainer.accumulate_grad_batches=2",
               "--trainer.val_check_interval=1000", "--trainer.callbacks+=helpers.RecordWork")
    (work,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "RecordWork"]
    scored = [positions for _, _, positions, _ in work.steps]
    _, rows = _rows(tmp_path)
    training = [row for row in rows if "grad_norm" in row]
    assert [row["step"] for row in training] == [1, 2] and len(scored) == 4  # one row per optimizer step
    for row, pair in zip(training, (scored[:2], scored[2:]), strict=True):
        assert row["train/work/positions_scored"] == pytest.approx(sum(pair) / 2)  # both micro-batches, not the last
        assert "loss" in row and "entropy" not in row  # the token means are the last micro-batch's alone


def test_rows_keep_only_the_keys_with_trls_meaning():
    shares = {f"train/pruning/{k}": 1.0 for k in ("response_tokens_kept_frac", "positions_scored_frac",
                                                   "branches_backpropagated_frac")}
    row = {"train/loss": 0.5, "train/rewards/chosen": 0.1, "train/entropy": 3.0, "train/grad_norm": 1.0,
           "train/num_tokens": 10.0, "epoch": 0, **shares}
    assert trl_row(row, RowContext(epoch=0.5, num_tokens=10.0), "none") == {
        "loss": 0.5, "rewards/chosen": 0.1, "entropy": 3.0, "grad_norm": 1.0, "num_tokens": 10.0, "epoch": 0.5}
    # a window of two batches: the token means are the last batch's, not TRL's window mean
    assert "entropy" not in trl_row(row, RowContext(batches=2), "none")
    # SimPO's rewards are CPOTrainer's: kept under their own names, the loss is TRL's all the same
    simpo = trl_row(row, RowContext(dpo_rewards=False), "unmatched")
    assert "rewards/chosen" not in simpo and simpo["train/rewards/chosen"] == 0.1 and simpo["loss"] == 0.5
    # a pruned window: IPW estimates, under their own names only; Lightning's whole-epoch count is never written
    pruned = trl_row({**row, "train/pruning/positions_scored_frac": 0.5}, RowContext(), "unmatched")
    assert "loss" not in pruned and pruned["train/loss"] == 0.5 and pruned["grad_norm"] == 1.0
    assert "epoch" not in pruned


def test_rewards_are_dpotrainers_for_dpo_losses_only():
    assert reports_dpo_rewards(SigmoidLoss()) and not reports_dpo_rewards(SimPOLoss())


def test_a_bad_own_keys_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^TRLKeys\(own_keys='some'\): give one of 'unmatched', 'all', 'none'$"):
        TRLKeys(own_keys="some")

