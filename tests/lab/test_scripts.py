"""The lab's measuring scripts (``lab/scripts/``), each run in one process on a small setting: what they count is
checked, not how long it took."""

from __future__ import annotations

import pytest

from helpers import REPO


def test_lora_memory_script_counts(monkeypatch):
    """lab/scripts/lora_memory.py in one process on the small preset: LoRA trains and keeps optimizer state for the
    adapters only, full fine-tuning for every weight (and holds the reference copy)."""
    monkeypatch.syspath_prepend(str(REPO / "lab" / "scripts"))
    from lora_memory import run_one

    full = run_one("small", "full", "vanilla", steps=1, warmup=0, rank=2)
    lora = run_one("small", "lora", "vanilla", steps=1, warmup=0, rank=2)
    assert full["params"] == 2 * full["trainable"]  # the policy and its frozen online-reference copy
    assert lora["trainable"] < full["trainable"] / 4 and lora["params"] == full["trainable"] + lora["trainable"]
    assert lora["optimizer_state_mib"] * 4 < full["optimizer_state_mib"]
    # full: fp32 policy + reference copy + gradients (3 x 4 bytes a policy weight) + the optimizer state
    assert full["model_state_mib"] == pytest.approx(12 * full["trainable"] / 2**20 + full["optimizer_state_mib"])
    assert full["model_state_mib"] > 3 * lora["model_state_mib"]


def test_control_variate_variance_script_quick(monkeypatch, capsys):
    """lab/scripts/control_variate_variance.py --quick: every mode's row at both checkpoints, finite, the estimators'
    extra target logits in their cost ratio, and at the initial weights (policy = reference) far less within-pair
    variance than the position design they wrap."""
    monkeypatch.syspath_prepend(str(REPO / "lab" / "scripts"))
    from control_variate_variance import MODES, main

    rows = main(["--quick"])
    assert "| quickstart | 2 | stratified-coupled-reference-lse | cached |" in capsys.readouterr().out
    assert [(r["step"], r["mode"]) for r in rows] == [(s, m) for s in (0, 2)
                                                      for m in ("vanilla", *(m for m, _ in MODES))]
    by_mode = {r["mode"]: r for r in rows if r["step"] == 0}
    assert all(r["between"] > 0 and r["within"] >= 0 and r["k"] >= 1 for r in rows)
    wrapped = by_mode["stratified-coupled"]
    for mode in ("stratified-coupled-exact-targets", "stratified-coupled-reference-lse"):
        assert by_mode[mode]["within"] < wrapped["within"] / 10 and by_mode[mode]["k"] > 1
    # the same head saving as the design it wraps (same reference), less the target logits' 2d FLOPs a token
    assert by_mode["stratified-coupled-exact-targets"]["k"] < wrapped["k"]


def load_script(name: str):
    """A script of ``lab/scripts/`` as a module (its file name has dashes)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), REPO / "lab" / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_real_model_learning_script_runs_the_recipe_on_another_accelerator_and_model():
    """lab/scripts/real-model-learning.py's command for a GPU and a hub name, resolved by the real CLI (`--print_config`
    parses without training): the options given last replace the offline line's CPU and local GGUF."""
    import subprocess
    import sys

    import yaml

    script = load_script("real-model-learning")
    args = script.arguments(["--out", "unused", "--accelerator", "gpu", "--data", "pairs.jsonl", "--model",
                             "HuggingFaceTB/SmolLM2-135M-Instruct", "--max-length", "1024", "--max-prompt-length",
                             "512", "--batch-size", "16", "--steps", "100"])
    cmd = script.command(args, 0, REPO / "unused-root", None)
    assert "cpu" in cmd  # the offline line's accelerator is there, and replaced
    cli = [sys.executable, "-m", "lit_prunedpo.cli", *cmd[1:], "--print_config"]
    done = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    config = yaml.safe_load(done.stdout)
    assert config["trainer"]["accelerator"] == "gpu" and config["trainer"]["max_steps"] == 100
    assert config["model"]["policy"]["init_args"]["name_or_path"] == args.model == config["data"]["init_args"][
        "tokenizer"]
    assert (config["data"]["init_args"]["path"], config["data"]["init_args"]["max_length"]) == ("pairs.jsonl", 1024)


def test_the_gpu_real_model_script_commands_parse_and_refuse_without_cuda(tmp_path):
    """lab/scripts/gpu-real-model --dry-run: each stage's command read by its own command's parser (an option misspelt
    fails here, not on a lent GPU), an unknown stage refused before any work; without CUDA the run stops at once."""
    import os
    import subprocess
    import sys

    import torch

    from lit_prunedpo_lab.bench.cli import build_parser as bench_parser
    from lit_prunedpo_lab.study.arguments import build_parser as study_parser

    script = REPO / "lab/scripts/gpu-real-model"
    env = dict(os.environ, PYTHON=sys.executable, MODEL="HuggingFaceTB/SmolLM2-135M-Instruct")
    dry = subprocess.run([str(script), "--dry-run", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout.splitlines()
    commands = {line.split(": ", 1)[0]: line.split(": ", 1)[1].split() for line in dry}
    assert list(commands) == ["bench", "learning", "study"]
    bench = bench_parser().parse_args(commands["bench"][1:])
    assert (bench.device, bench.precision, bench.max_length, bench.model) == ("cuda", "bf16-mixed", 1024, env["MODEL"])
    learning = load_script("real-model-learning").arguments(commands["learning"][2:])
    assert (learning.accelerator, learning.model, learning.max_length) == ("gpu", env["MODEL"], 1024)
    study = study_parser().parse_args(commands["study"][1:])
    assert (study.device, study.clock, study.model, study.max_length, study.seeds) == (
        "cuda", "wall", env["MODEL"], 1024, [0, 1, 2, 3, 4])
    bad = subprocess.run([str(script), "--dry-run", str(tmp_path / "out"), "bogus"], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    assert bad.returncode != 0 and "unknown stage 'bogus'" in bad.stderr and not (tmp_path / "out").exists()
    if not torch.cuda.is_available():
        run = subprocess.run([str(script), str(tmp_path / "out"), "bench"], capture_output=True, text=True, env=env,
                             timeout=120, check=False)
        assert run.returncode != 0 and "no CUDA device visible to torch" in run.stderr
