"""TRL's peers in the benchmark: ``trl`` (precomputed reference), ``trl-online`` (its reference model's
forward in every timed step), alternated in the rounds with the project's configurations on the same batches."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest
import torch

from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.cli import main
from lit_prunedpo_lab.bench.harness import run_benchmark
from lit_prunedpo_lab.bench.presets import get_preset
from lit_prunedpo_lab.bench.rounds import build_rounds, run_rounds
from lit_prunedpo_lab.bench.utilisation import peer_step_flops
from lit_prunedpo.callbacks import PeakMemoryMeter

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the [peer] extra (trl)")


@pytest.mark.slow  # a benchmark run with TRL's trainer
@needs_trl
def test_both_peers_start_from_the_projects_vanilla_loss(tmp_path):
    assert main(["--preset", "small", "--modes", "vanilla,branch", "--references", "online", "--scorers", "plain",
                 "--steps", "2", "--warmup", "0", "--peer", "trl,trl-online", "--out", str(tmp_path), "--quiet"]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    trl, online = payload["peers"]
    assert (trl["name"], online["name"]) == ("trl", "trl-online") and payload["peer"] == trl
    vanilla = next(r for r in payload["results"] if r["mode"] == "vanilla")
    # step 0: every policy equals its reference, so every DPO loss is ln 2, TRL's and this project's alike
    assert vanilla["losses"][0] == pytest.approx(math.log(2), abs=1e-5)
    for peer in (trl, online):
        # tighter than 1e-5: a reference run under TRL's default bf16 autocast, the policy not, was 9e-6 off
        assert peer["losses"][0] == pytest.approx(vanilla["losses"][0], abs=1e-6)
        assert peer["losses"][0] == pytest.approx(math.log(2), abs=1e-5)
        assert peer["step_time_s"] > 0 and peer["flops"] > 0 and peer["utilisation"] > 0
        for row in payload["results"]:
            assert row[f"speedup_vs_{peer['name']}"] == pytest.approx(peer["step_time_s"] / row["step_time_s"])
    assert all(row["speedup_vs_peer"] == row["speedup_vs_trl"] for row in payload["results"])
    # the online reference runs a forward over the same padded rows; the precomputed one runs none in the step
    assert trl["reference_tokens_executed"] == 0
    assert online["reference_tokens_executed"] == online["tokens_executed"] == trl["tokens_executed"]
    assert online["flops"] > trl["flops"]
    md = (tmp_path / "bench.md").read_text()
    assert "Peer `trl` (TRL DPOTrainer.compute_loss with a precomputed reference" in md
    assert "Peer `trl-online` (TRL DPOTrainer.compute_loss with an online reference" in md
    assert "| vs trl | vs trl-online |" in md


@pytest.mark.slow  # rounds with TRL's trainer
@needs_trl
def test_the_online_peer_runs_its_reference_in_every_step_on_padded_rows():
    rounds = build_rounds(get_preset("small"), ["vanilla"], ["online"], ["plain"], ["shared"], num_batches=2,
                          warmup=0, dev=torch.device("cpu"), peer="trl,trl-online")
    rounds.meter = PeakMemoryMeter(torch.device("cpu"))  # no garbage-collector pass per step: a faster test
    trl, online = rounds.peers["trl"], rounds.peers["trl-online"]
    assert rounds.peer is trl and trl.reference is None
    (frozen,) = rounds.module.reference.models()
    reference = online.reference
    assert reference is not online.model and not any(p.requires_grad for p in reference.parameters())
    for a, b in zip(reference.parameters(), frozen.parameters(), strict=True):  # the initial weights, same dtype
        assert a.dtype == b.dtype and torch.equal(a, b)
    calls = {"reference": 0, "trl": 0, "trl-online": 0}
    count = lambda key: lambda *args: calls.__setitem__(key, calls[key] + 1)  # noqa: E731
    reference.register_forward_hook(count("reference"))
    trl.model.register_forward_hook(count("trl"))
    online.model.register_forward_hook(count("trl-online"))
    _, records = run_rounds(rounds)
    assert calls == {"reference": 2, "trl": 2, "trl-online": 2}
    for name, peer in rounds.peers.items():
        for r, flops in enumerate(records[name].flops):
            rows, width = peer.inputs(r)["input_ids"].shape  # padding included
            assert records[name].tokens[r] == rows * width
            f = cost.forward_flops(rounds.dims, rows, width, rows * (width - 1))  # the CPU head: every position
            online_reference = f.total if name == "trl-online" else 0
            assert flops == cost.StepFlops(f.total, 2 * f.total, f.head, online_reference)


def test_a_missing_trl_names_the_peer_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # import now raises ImportError
    with pytest.raises(RuntimeError, match=r"--peer trl-online needs TRL: pip install -e '\.\[peer\]'"):
        run_benchmark(get_preset("small"), modes=["vanilla"], references=["online"], scorers=["plain"], steps=1,
                      warmup=0, peer="trl-online")


@pytest.mark.slow  # TRL's trainer, twice
@needs_trl
def test_the_checkpointing_peer_runs_each_layer_again_in_backward_and_computes_the_same_step():
    """``trl-online-checkpointing`` is ``trl-online`` with DPOConfig's default activation checkpointing, switched on
    as ``Trainer.train`` switches it on: the same loss and gradients, each decoder layer's forward run twice."""
    rounds = build_rounds(get_preset("small"), ["vanilla"], ["online"], ["plain"], ["shared"], num_batches=1,
                          warmup=0, dev=torch.device("cpu"), peer="trl-online,trl-online-checkpointing")
    plain, checkpointed = rounds.peers["trl-online"], rounds.peers["trl-online-checkpointing"]
    assert checkpointed.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing
    assert checkpointed.reference is not None
    layer_calls = {}
    for name, peer in rounds.peers.items():
        # a pre-hook inside the checkpoint: the layer's own hooks stay outside it, and the recompute stops early,
        # before a forward hook after the MLP would run
        layer = peer.model.get_decoder().layers[0].mlp
        layer.register_forward_pre_hook(
            lambda *args, key=name: layer_calls.__setitem__(key, layer_calls.get(key, 0) + 1))
    losses, grads = {}, {}
    for name, peer in rounds.peers.items():
        # read the gradients where AdamW would step (the stepper clears them after)
        peer.optimizer.step = lambda *_, key=name, model=peer.model: grads.__setitem__(
            key, [p.grad.clone() for p in model.parameters() if p.grad is not None])
        losses[name] = peer.step(peer.inputs(0))
    assert layer_calls == {"trl-online": 1, "trl-online-checkpointing": 2}
    # its FLOPs count the body's second forward; the reference's no-grad forward is not checkpointed
    flops = {name: peer_step_flops(rounds.dims, peer.forwards) for name, peer in rounds.peers.items()}
    assert flops["trl-online"].body_recompute == 0
    body = flops["trl-online-checkpointing"].policy_forward - flops["trl-online-checkpointing"].head_recompute
    assert flops["trl-online-checkpointing"].body_recompute == body > 0
    assert [f.checkpointed for f in checkpointed.forwards] == [not f.reference for f in checkpointed.forwards]
    assert losses["trl-online"] == pytest.approx(losses["trl-online-checkpointing"], abs=1e-6)
    grad_a, grad_b = grads["trl-online"], grads["trl-online-checkpointing"]
    assert len(grad_a) == len(grad_b) > 0
    for a, b in zip(grad_a, grad_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
