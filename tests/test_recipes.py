"""The recipes for real models and data: ``configs/hh_rlhf.yaml`` and ``configs/smollm2_hh.yaml`` run exact DPO
(pruning is an overlay a user adds), and the ``# offline:`` line of ``smollm2_hh.yaml``, the command that runs it on
a CPU from ``../shared``, trains."""

from __future__ import annotations

import csv
import os
import shlex
import subprocess
import sys

import pytest
import yaml

from helpers import REPO, csv_logger

RECIPE = REPO / "configs/smollm2_hh.yaml"
OFFLINE = "# offline:"
LOCAL_FILES = ("--model.policy.init_args.name_or_path", "--data.init_args.tokenizer", "--data.init_args.path")


def offline_command(path) -> list[str]:
    """The command of the one header line starting with ``# offline:``, split as a shell would."""
    lines = [line for line in path.read_text().splitlines() if line.startswith(OFFLINE)]
    assert len(lines) == 1, f"{path} must have one line starting with {OFFLINE!r}, has {len(lines)}"
    return shlex.split(lines[0].removeprefix(OFFLINE))


@pytest.mark.parametrize("name", ["hh_rlhf", "smollm2_hh"])
def test_the_real_data_recipes_prune_nothing(name):
    model = yaml.safe_load((REPO / f"configs/{name}.yaml").read_text())["model"]
    assert not {"prefix_sampler", "position_sampler", "branch_sampler"} & set(model), name


def test_smollm2_recipe_renders_hh_turns_with_the_chat_template_against_an_online_reference():
    config = yaml.safe_load(RECIPE.read_text())
    data, model = config["data"]["init_args"], config["model"]
    assert data["dialogues"] == "messages" and data["tokenizer"] == model["policy"]["init_args"]["name_or_path"]
    assert model["reference"]["class_path"] == "lit_prunedpo.reference.OnlineReference"
    assert config["trainer"]["precision"] == "bf16-mixed"  # measured faster and exact: docs/real-model.md


def test_the_offline_line_runs_the_recipe_on_the_shared_files():
    args = offline_command(RECIPE)
    assert args[:4] == ["lit-prunedpo", "fit", "--config", "configs/smollm2_hh.yaml"]
    options = dict(zip(args[4::2], args[5::2]))
    assert len(options) * 2 == len(args) - 4, "every override is '--key value'"
    for key in LOCAL_FILES:
        assert options[key].startswith("../shared/") and (REPO / options[key]).is_file(), key
    assert options["--data.init_args.val_split"] == "null"


@pytest.mark.slow
def test_the_offline_line_trains(tmp_path):
    """The ``# offline:`` line as written (SmolLM2 read from its GGUF file, HH-RLHF from ../shared), shortened to 2
    steps and one validation batch: it exits 0 and logs training and validation metrics."""
    args = offline_command(RECIPE)
    short = ["--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
             "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
             f"--trainer.default_root_dir={tmp_path}", *csv_logger(tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    out = subprocess.run([sys.executable, "-m", "lit_prunedpo", *args[1:], *short], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-4000:]
    metrics: dict[str, str] = {}
    for row in csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()):
        metrics.update({key: value for key, value in row.items() if value})
    for key in ("train/loss", "val/loss", "val/rewards/accuracies"):
        assert key in metrics, key
    assert int(float(metrics["step"])) >= 1
