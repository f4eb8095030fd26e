"""The user-facing example: a custom sampler from the user's own module is unbiased (checked with the public
helper, as a user would) and trains through the CLI with no change to the package."""

from __future__ import annotations

import pytest

from lit_prunedpo.cli import build_cli
from lit_prunedpo.testing import check_position_sampler, check_unbiased

from helpers import REPO


@pytest.fixture
def custom_sampler(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import custom_sampler

    return custom_sampler


def test_custom_sampler_is_unbiased(custom_sampler):
    report = check_position_sampler(custom_sampler.TailWeightedPositions(0.2, 0.8), lengths=(1, 2, 5, 9),
                                    num_draws=6000)
    assert report.exact_checks == 12
    check_unbiased(position=custom_sampler.TailWeightedPositions(0.3, 0.9), num_draws=1500)


def test_custom_sampler_arguments_checked(custom_sampler):
    with pytest.raises(ValueError, match="first"):
        custom_sampler.TailWeightedPositions(first=0.0)


def test_custom_sampler_config_trains(custom_sampler, tmp_path):
    cli = build_cli(["fit", "--config", str(REPO / "examples/custom_sampler.yaml"),
                     f"--trainer.default_root_dir={tmp_path}",
                     "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                     "--data.init_args.max_rows=64", "--trainer.enable_progress_bar=false"])
    assert type(cli.model.position_sampler).__name__ == "TailWeightedPositions"
    assert cli.trainer.global_step == 2


def test_lora_memory_script_counts(monkeypatch):
    """examples/lora_memory.py in one process on the small preset: LoRA trains and keeps optimizer state for the
    adapters only, full fine-tuning for every weight (and holds the reference copy)."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
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
    """examples/control_variate_variance.py --quick: every mode's row at both checkpoints, finite, the estimators'
    extra target logits in their cost ratio, and at the initial weights (policy = reference) far less within-pair
    variance than the position design they wrap."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
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
