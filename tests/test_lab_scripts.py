"""The lab's measuring scripts (``scripts/``), each run in one process on a small setting: what they count is
checked, not how long it took."""

from __future__ import annotations

import pytest

from helpers import REPO


def test_lora_memory_script_counts(monkeypatch):
    """scripts/lora_memory.py in one process on the small preset: LoRA trains and keeps optimizer state for the
    adapters only, full fine-tuning for every weight (and holds the reference copy)."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
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
    """scripts/control_variate_variance.py --quick: every mode's row at both checkpoints, finite, the estimators'
    extra target logits in their cost ratio, and at the initial weights (policy = reference) far less within-pair
    variance than the position design they wrap."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
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
