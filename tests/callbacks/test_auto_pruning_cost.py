"""AutoPruning's calibration cost: the passes it runs per arm, the decision on fixed measurements, the memory-light
``between`` and distance, the ``budget_s`` bound, and no timed pass under a profiler (a CPU tensor meter)."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import lightning as L
import pytest
import torch

import lit_prunedpo.callbacks.auto_pruning as auto_pruning
import lit_prunedpo.gradient_noise as gradient_noise
from helpers import make_batch
from lit_prunedpo import PrunedDPO
from lit_prunedpo.callbacks import AutoPruning, PeakMemoryMonitor
from lit_prunedpo.callbacks.auto_pruning import calibrate, decide
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.gradient_noise import (RunningBetween, between_variance, gradient, pair, squared_distance,
                                         within_variance)
from lit_prunedpo.modes import load_mode
from lit_prunedpo.step.plan import exact_samplers

BATCH = ([3, 2, 4, 2, 5, 3], [5, 4, 6, 3, 6, 5], [4, 6, 2, 5, 3, 4])


@pytest.fixture
def module(tiny_source):
    torch.manual_seed(0)
    return PrunedDPO(policy=tiny_source)


class Scripted:
    """Stands in for ``timed_gradient``: the real gradient, the seconds given per arm (cycled), and a fake clock
    that advances by them; records which arm each timed pass was."""

    def __init__(self, seconds: dict[str, list[float]], monkeypatch) -> None:
        self.seconds, self.calls, self.now = seconds, [], 0.0
        self.kinds = {type(s[2]).__name__ + type(s[1]).__name__: m
                      for m, s in [("vanilla", exact_samplers()), *((m, load_mode(m).samplers) for m in seconds
                                                                    if m != "vanilla")]}
        monkeypatch.setattr(auto_pruning, "timed_gradient", self)
        monkeypatch.setattr(auto_pruning, "time", SimpleNamespace(perf_counter=lambda: self.now))

    def __call__(self, module, batch, samplers, generator):
        arm = self.kinds[type(samplers[2]).__name__ + type(samplers[1]).__name__]
        seconds = self.seconds[arm][sum(c == arm for c in self.calls) % len(self.seconds[arm])]
        self.calls.append(arm)
        self.now += seconds
        return gradient(module, batch, samplers, generator), seconds


def test_running_between_is_between_variance_in_two_gradients_of_memory():
    g = torch.Generator().manual_seed(3)
    per_pair = torch.randn(8, 1000, generator=g) * 0.1 + 5.0  # a large mean: the update must not cancel it away
    running = RunningBetween()
    for row in per_pair:
        running.add(row)
    assert running.n == 8 and running.value == pytest.approx(between_variance(per_pair), rel=1e-12)
    assert torch.equal(per_pair, per_pair.clone())  # the caller's rows untouched
    one = RunningBetween()
    one.add(per_pair[0])
    with pytest.raises(ValueError, match="n >= 2"):
        one.value


def test_squared_distance_by_slices_is_the_whole_sum(monkeypatch):
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(1001, generator=g), torch.randn(1001, generator=g)
    whole = float((a.double() - b.double()).pow(2).sum())
    assert squared_distance(a, b) == whole  # one slice: the same arithmetic
    monkeypatch.setattr(gradient_noise, "_CHUNK", 100)
    assert squared_distance(a, b) == pytest.approx(whole, rel=1e-12)
    assert squared_distance(a[:0], b[:0]) == 0.0


def test_each_arm_is_timed_draws_times_and_the_decision_is_the_rule_on_those_measurements(module, monkeypatch):
    # fixed timings: vanilla 1.0 s (medians of [1, 3, 1, 5] = 2), antithetic [0.5, 4] -> median 2.25; position [1]
    scripted = Scripted({"vanilla": [1.0, 3.0, 1.0, 5.0], "antithetic": [0.5, 4.0], "position": [1.0]}, monkeypatch)
    passes = []
    real_gradient = auto_pruning.gradient
    monkeypatch.setattr(auto_pruning, "gradient",
                        lambda m, b, s, g: passes.append(b.num_pairs) or real_gradient(m, b, s, g))
    batch = make_batch(*BATCH)
    modes = {"antithetic": load_mode("antithetic").samplers, "position": load_mode("position").samplers}
    decision = calibrate(module, batch, modes, pairs=4, draws=4, min_gain=0.1)
    assert passes == [6, 1, 1, 1, 1]  # the warm-up (the exact batch gradient), then one pass per measured pair
    assert scripted.calls == ["vanilla", "antithetic", "position"] * 4  # interleaved rounds, 4 timed passes per arm
    assert decision.draws == 4 and decision.pairs == 4 and "budget" not in decision.reason

    # the same figures, computed here independently of the calibration
    g = torch.Generator().manual_seed(0)
    exact = gradient(module, batch, exact_samplers(), g)
    between = between_variance(torch.stack([gradient(module, pair(batch, i), exact_samplers(), g) for i in range(4)]))
    distances = {m: [] for m in modes}
    for _ in range(4):
        gradient(module, batch, exact_samplers(), g)
        for m, samplers in modes.items():
            distances[m].append(squared_distance(gradient(module, batch, samplers, g), exact))
    measured = {m: (statistics.median(t), within_variance(distances[m], 6))
                for m, t in {"antithetic": [0.5, 4.0, 0.5, 4.0], "position": [1.0] * 4}.items()}
    choice, reason, arms = decide(between, 2.0, measured, 0.1)
    assert decision.between == pytest.approx(between, rel=1e-9)
    assert (decision.choice, decision.reason) == (choice, reason)
    assert [(a.mode, a.step_s, a.k) for a in decision.arms] == [(a.mode, a.step_s, a.k) for a in arms]
    assert [a.within for a in decision.arms] == pytest.approx([a.within for a in arms], rel=1e-9)


def test_the_budget_stops_further_rounds_and_is_said(module, monkeypatch):
    # every pass 1 s on the fake clock: a round of vanilla + 2 candidates is 3 s; at 5 s the second round ends it
    scripted = Scripted({"vanilla": [1.0], "antithetic": [1.0], "position": [1.0]}, monkeypatch)
    modes = {"antithetic": load_mode("antithetic").samplers, "position": load_mode("position").samplers}
    decision = calibrate(module, make_batch(*BATCH), modes, pairs=2, draws=4, budget_s=5.0)
    assert scripted.calls == ["vanilla", "antithetic", "position"] * 2
    assert decision.draws == 2 and decision.reason.endswith("budget_s 5 reached after 2 of 4 draws")
    # a budget below one round still measures one round
    scripted.calls.clear()
    decision = calibrate(module, make_batch(*BATCH), modes, pairs=2, draws=4, budget_s=0.5)
    assert scripted.calls == ["vanilla", "antithetic", "position"] and decision.draws == 1
    # a budget not reached changes nothing
    scripted.calls.clear()
    decision = calibrate(module, make_batch(*BATCH), modes, pairs=2, draws=4, budget_s=100.0)
    assert len(scripted.calls) == 12 and decision.draws == 4 and "budget" not in decision.reason


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "5"])
def test_a_bad_budget_is_refused(module, bad):
    with pytest.raises(ValueError, match="budget_s must be a number of seconds > 0 or null"):
        AutoPruning(budget_s=bad)
    with pytest.raises(ValueError, match="budget_s"):
        calibrate(module, make_batch(*BATCH), {}, budget_s=bad)


def test_the_callback_passes_its_budget_and_times_no_pass_under_a_profiler(tiny_source, monkeypatch):
    # with PeakMemoryMonitor (which meters the first step around the calibration) no timed pass runs under a
    # profiler, the only meter that slows what it measures; a budget of a nanosecond measures one round
    profiled = []
    real = auto_pruning.timed_gradient
    monkeypatch.setattr(auto_pruning, "timed_gradient",
                        lambda *a: profiled.append(torch.autograd._profiler_enabled()) or real(*a))
    auto = AutoPruning(candidates=["antithetic"], pairs=2, draws=3, max_share=None, budget_s=1e-9)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[PeakMemoryMonitor(), auto])
    trainer.fit(PrunedDPO(policy=tiny_source, shared_prompt=False),
                datamodule=SyntheticPreferenceData(vocab_size=32, num_train=16, num_val=4, batch_size=4))
    assert profiled == [False, False] and auto.decision.draws == 1 and "after 1 of 3 draws" in auto.decision.reason


def test_a_calibration_under_a_profiler_warns(module):
    with torch.autograd.profiler.profile(), pytest.warns(UserWarning, match="under a running torch profiler"):
        calibrate(module, make_batch(*BATCH), {}, pairs=2, draws=1)
