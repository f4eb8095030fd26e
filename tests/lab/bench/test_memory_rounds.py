"""The benchmark's memory on the CPU: the tensor meter slows what it measures, so the measured rounds are timed
without it and replayed, untimed and metered, in memory rounds: the same batches, the same sampler draws, every
configuration and every peer measured the same way."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lit_prunedpo_lab.bench import rounds as rounds_module
from lit_prunedpo_lab.bench.presets import get_preset
from lit_prunedpo_lab.bench.rounds import build_rounds, run_rounds


def test_cpu_rounds_are_timed_unmetered_and_replayed_metered(monkeypatch):
    rounds = build_rounds(get_preset("small"), ["vanilla", "branch"], ["online"], ["plain"], ["shared"],
                          num_batches=3, warmup=1, dev=torch.device("cpu"))
    assert rounds.meter.mode == "cpu_tensors" and rounds.meter.intrusive
    calls = []
    step = rounds_module.train_step

    def seen(module, optimizer, batch, parts, generator, stepper=None):
        calls.append((parts, id(batch), generator.initial_seed(), torch.autograd._profiler_enabled()))
        return step(module, optimizer, batch, parts, generator, stepper)

    monkeypatch.setattr(rounds_module, "train_step", seen)
    records, peers = run_rounds(rounds)
    n = len(rounds.parts)
    timed, metered = calls[:3 * n], calls[3 * n:]
    assert not any(profiled for *_, profiled in timed) and all(profiled for *_, profiled in metered)
    assert [c[:3] for c in metered] == [c[:3] for c in timed[n:]]  # the measured rounds' batches and draws again
    assert all(rng.step == 3 for rng in rounds.rngs.values())  # the streams end where the timed rounds left them
    for rec in records.values():
        assert len(rec.times) == len(rec.step_peaks) == 2 and rec.peaks == []  # no absolute peak: above start only
        assert all(p > 0 for p in rec.step_peaks)
    vanilla, branch = (records[c] for c in rounds.parts)
    assert max(branch.step_peaks) < max(vanilla.step_peaks)  # one branch of each pair back-propagated, not two


@pytest.mark.slow  # rounds with TRL's trainer
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl (pip install -e '.[peer]')")
def test_trl_peers_are_measured_the_same_way():
    """Each TRL peer's step is timed without the meter and measured in the memory rounds, as the configurations'."""
    rounds = build_rounds(get_preset("small"), ["vanilla"], ["online"], ["plain"], ["shared"], num_batches=2,
                          warmup=0, dev=torch.device("cpu"), peer="trl,trl-online")
    records, peers = run_rounds(rounds)
    (vanilla,) = records.values()
    for name, rec in peers.items():
        assert len(rec.times) == len(rec.step_peaks) == 2 and rec.peaks == [], name
        assert all(p > 0 for p in rec.step_peaks), name
    # the online peer runs its reference's forward in the step as well: it holds at least as much as the precomputed
    assert max(peers["trl-online"].step_peaks) >= max(peers["trl"].step_peaks)
    assert vanilla.step_peaks
