"""The memory budget: gradient accumulation computes the full step's gradients, the fastest fitting variant is
chosen from (variant -> peak, cost) tables, a budget nothing fits is refused naming the smallest peak, and the
calibration measures a peak step memory that the chunked scorer and accumulation lower."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo.models import FromConfig
from lit_prunedpo.module import PrunedDPO
from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.calibrate import StepCost, measure_step_costs
from lit_prunedpo_lab.study.memory import (
    GPU_NOTE, accumulate, base_of, choose_fit, fit_candidates, fit_to_budget, needs_gpu, split_batch,
)
from lit_prunedpo_lab.study.tasks import QUICKSTART_MODEL, EditedTask
from lit_prunedpo.testing import synthetic_batch

pytestmark = pytest.mark.slow  # memory-fitted trainings: `pytest -m slow` (CI runs it)

TINY = {**QUICKSTART_MODEL, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 64}


def _grads(module: PrunedDPO) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.policy.parameters() if p.grad is not None]


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_accumulated_micro_batches_give_the_full_steps_gradients_in_float64(parts):
    torch.manual_seed(0)
    lengths = torch.tensor([[3, 5], [4, 4], [6, 2], [2, 7], [5, 5]])
    batch = synthetic_batch(lengths, prompt_length=3, vocab=64, seed=1)
    module = PrunedDPO(FromConfig("llama", dict(TINY), seed=0))
    module.policy.double()
    full = module.step(batch).estimate.objective
    full.backward()
    expected = _grads(module)
    module.policy.zero_grad(set_to_none=True)
    total = accumulate(module, batch, parts)
    got = _grads(module)
    assert float(total) == pytest.approx(float(full.detach()), abs=1e-12)
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-9)


def test_unweighted_micro_batch_means_would_not_be_the_full_step():
    # uneven micro-batches (2 and 3 pairs): summing their means without the shares b_k / B is a different gradient,
    # so the equality above tests the weighting
    lengths = torch.tensor([[3, 5], [4, 4], [6, 2], [2, 7], [5, 5]])
    batch = synthetic_batch(lengths, prompt_length=3, vocab=64, seed=1)
    module = PrunedDPO(FromConfig("llama", dict(TINY), seed=0))
    module.policy.double()
    module.step(batch).estimate.objective.backward()
    expected = _grads(module)
    module.policy.zero_grad(set_to_none=True)
    for micro in split_batch(batch, 2):
        module.step(micro).estimate.objective.backward()
    assert not all(torch.allclose(g, e, rtol=1e-6) for g, e in zip(_grads(module), expected))


def test_split_batch_keeps_every_pair_once_in_order():
    batch = synthetic_batch(torch.full((7, 2), 3))
    parts = split_batch(batch, 3)
    assert [p.num_pairs for p in parts] == [2, 3, 2]
    assert torch.equal(torch.cat([p.index for p in parts]), batch.index)
    with pytest.raises(ValueError, match=r"micro_batches must be in \[1, 7\].*got 8"):
        split_batch(batch, 8)


def test_fit_candidates_cover_every_combination_once():
    arm = Arm("vanilla", 8)
    variants = fit_candidates(arm)
    assert len(variants) == 2 * 2 * 4 - 1 and arm not in variants and len(set(variants)) == len(variants)
    assert {v.micro_batches for v in variants} == {1, 2, 4, 8}
    assert {v.micro_batches for v in fit_candidates(Arm("vanilla", 6))} == {1, 2, 4, 6}
    assert all(base_of(v) == arm for v in variants)
    assert Arm("vanilla", 8, chunked=True, micro_batches=2).fit == "chunked scorer + accumulation x2"
    assert Arm("vanilla", 8, chunked=True, micro_batches=2, memory_fitted=True).name == \
        "vanilla@8 [chunked scorer + accumulation x2] (memory-fitted)"
    with pytest.raises(ValueError, match="micro_batches must be in"):
        Arm("vanilla", 4, micro_batches=5)
    with pytest.raises(ValueError, match="memory-fitted control is a vanilla arm"):
        Arm("position", 4, memory_fitted=True)


def test_the_fastest_variant_that_fits_is_chosen():
    plain, chunked, ckpt = Arm("vanilla", 8), Arm("vanilla", 8, chunked=True), Arm("vanilla", 8, checkpointing=True)
    acc2, chunked_acc2 = Arm("vanilla", 8, micro_batches=2), Arm("vanilla", 8, chunked=True, micro_batches=2)
    table = {plain: (100.0, 1.0), chunked: (60.0, 1.1), ckpt: (70.0, 1.3), acc2: (55.0, 1.05),
             chunked_acc2: (30.0, 1.2)}
    assert choose_fit(table, 120) == plain  # fits as is
    assert choose_fit(table, 65) == acc2  # fastest under 65: accumulation (1.05) before the chunked scorer (1.1)
    assert choose_fit(table, 58) == acc2
    assert choose_fit(table, 50) == chunked_acc2  # only the combination fits
    assert choose_fit({chunked: (40.0, 1.0), acc2: (50.0, 1.0)}, 60) == chunked  # equal cost: the smaller peak
    assert choose_fit({chunked: (40.0, 1.0), chunked_acc2: (40.0, 1.0)}, 60) == chunked  # then fewer changes


def test_a_budget_nothing_fits_names_the_budget_and_the_smallest_peak():
    table = {Arm("vanilla", 8): (100.0, 1.0), Arm("vanilla", 8, chunked=True, micro_batches=8): (31.25, 2.0)}
    with pytest.raises(ValueError, match=r"memory budget 20 MB: no exact way of running vanilla@8 fits; the smallest "
                                         r"measured peak step memory is 31\.2 MB \(chunked scorer \+ accumulation "
                                         r"x8\)"):
        choose_fit(table, 20, "vanilla@8")
    with pytest.raises(ValueError, match="no measured variant"):
        choose_fit({}, 20)


def test_needs_gpu_marks_accumulation_only():
    assert needs_gpu([Arm("position", 8), Arm("vanilla", 8, micro_batches=2)])
    assert not needs_gpu([Arm("position", 8), Arm("vanilla", 8, chunked=True, checkpointing=True)])


def test_the_calibration_measures_peak_step_memory(tmp_path):
    # a vocabulary of 8192 on 24 response tokens: the plain head's logits (and their log-softmax and gradient) are a
    # few MB per step; the chunked scorer and accumulation over 4 micro-batches each leave out most of them
    task = EditedTask(name="tiny-mem", num_rows=64, batch_size=4, model={**TINY, "vocab_size": 8192})
    dm = task.datamodule(tmp_path)
    plain, chunked, acc = Arm("vanilla", 4), Arm("vanilla", 4, chunked=True), Arm("vanilla", 4, micro_batches=4)
    costs = measure_step_costs(task, [plain, chunked, acc], dm, steps=2, warmup=1, memory=True)
    peaks = {a: costs[a].peak_mb for a in costs}
    if any(p is None for p in peaks.values()):
        pytest.skip("this machine cannot read the process's peak memory")
    assert peaks[plain] > 0
    assert peaks[chunked] < peaks[plain] and peaks[acc] < peaks[plain]
    assert measure_step_costs(task, [plain], dm, steps=1)[plain].peak_mb is None  # memory not asked for


def test_the_cpu_calibration_times_its_steps_unmetered(tmp_path, monkeypatch):
    """The CPU meter (live tensor storage) slows the step it measures: the timed steps run without it and as many
    metered steps follow, whose peaks are the arm's."""
    from lit_prunedpo_lab.study import runner

    task = EditedTask(name="tiny-mem", num_rows=64, batch_size=4, model={**TINY, "vocab_size": 8192})
    dm = task.datamodule(tmp_path)
    seen = []
    step = runner.Run.train_step

    def watched(run):
        seen.append((run.arm.name, run.meter is not None and run.meter.mode))
        step(run)

    monkeypatch.setattr(runner.Run, "train_step", watched)
    plain, branch = Arm("vanilla", 4), Arm("branch", 4)
    costs = measure_step_costs(task, [plain, branch], dm, steps=2, warmup=1, memory=True)
    assert [m for _, m in seen] == [False] * 6 + ["cpu_tensors"] * 4
    assert all(costs[a].steps == 2 and costs[a].peak_mb > 0 for a in (plain, branch))
    assert costs[branch].peak_mb < costs[plain].peak_mb


def _fake_cost(arm: Arm) -> StepCost:
    """A hand-made calibration: the plain head's logits are most of vanilla@8's 134 MB; the chunked scorer drops them
    at +10 % cost, accumulation divides the rest by the micro-batches at +20 % per extra one, checkpointing saves 10 %
    at +30 %; position pruning and smaller batches scale the whole."""
    base = {"vanilla": 134.0, "position-coupled": 61.0}[arm.mode] * arm.batch_size / 8
    logits = 0.7 * base
    peak = ((base - logits) * (0.9 if arm.checkpointing else 1.0)
            + (0.0 if arm.chunked else logits)) / arm.micro_batches
    cost = 0.025 * arm.batch_size * (1.1 if arm.chunked else 1.0) * (1.3 if arm.checkpointing else 1.0)
    cost *= 1 + 0.2 * (arm.micro_batches - 1)
    return StepCost(cost, cost, 2, peak)


def _fit(budget: float, controls: list[Arm], measured_peaks: bool = True):
    vanilla, pruned = Arm("vanilla", 8), [Arm("position-coupled", 8)]
    measured = {a: _fake_cost(a) for a in [vanilla, *pruned]}
    calls: list[list[Arm]] = []

    def measure(arms):
        calls.append(list(arms))
        return {a: _fake_cost(a) if measured_peaks else StepCost(1.0, 1.0, 2, None) for a in arms}

    if not measured_peaks:
        measured = {a: StepCost(1.0, 1.0, 2, None) for a in measured}
    return fit_to_budget(budget, vanilla, pruned, controls, measured, measure, "cpu", "test"), calls


def test_fit_to_budget_picks_the_memory_fitted_vanilla_and_the_references_that_fit():
    control = Arm("vanilla", 3, cost_matched=True)  # 50 MB: fits 100
    fit, calls = _fit(100.0, [control])
    vanilla = Arm("vanilla", 8)
    # vanilla@8 (134 MB) is over; the fastest variant under 100 MB: the chunked scorer (40 MB, 0.22 s) beats
    # accumulation x2 (67 MB, 0.24 s); position-coupled@8 (61 MB) fits as is
    assert fit.fitted == {vanilla: Arm("vanilla", 8, chunked=True)}
    assert fit.vanilla == Arm("vanilla", 8, chunked=True, memory_fitted=True) and not fit.same_batch_fits
    assert fit.controls_fitting == [control]
    assert calls == [[control], fit_candidates(vanilla)]  # the control's peak, then vanilla's variants; nothing else
    rec = fit.record
    assert rec["references"] == ["vanilla@3 (cost-matched)", "vanilla@8 [chunked scorer] (memory-fitted)"]
    assert rec["vanilla_fit"] == "chunked scorer" and rec["over"] == [] and not rec["gpu_needed"]
    assert rec["peaks"]["vanilla@8 [chunked scorer] (memory-fitted)"] == pytest.approx(0.3 * 134)
    assert [r["fit"] for r in rec["tables"]["vanilla@8"] if r["chosen"]] == ["chunked scorer"]


def test_fit_to_budget_fits_pruned_arms_drops_controls_over_it_and_flags_accumulation():
    control = Arm("vanilla", 7, cost_matched=True)  # 117 MB: over 30
    fit, _ = _fit(30.0, [control])
    # under 30 MB: vanilla needs the chunked scorer and accumulation x2 (20 MB) at least; position-coupled@8 the
    # chunked scorer (18 MB, cheapest)
    assert fit.fitted[Arm("vanilla", 8)] == Arm("vanilla", 8, chunked=True, micro_batches=2)
    assert fit.fitted[Arm("position-coupled", 8)] == Arm("position-coupled", 8, chunked=True)
    assert fit.controls_fitting == [] and fit.record["over"] == ["vanilla@7 (cost-matched)"]
    assert fit.record["references"] == ["vanilla@8 [chunked scorer + accumulation x2] (memory-fitted)"]
    assert fit.record["gpu_needed"] and fit.record["gpu_note"] == GPU_NOTE


def test_fit_to_budget_refusals():
    with pytest.raises(ValueError, match=r"memory budget 1 MB: no exact way of running vanilla@8 fits; the smallest "
                                         r"measured peak step memory is 4\.5 MB \(chunked scorer \+ checkpointing \+ "
                                         r"accumulation x8\)"):
        _fit(1.0, [])
    with pytest.raises(ValueError, match="this machine cannot measure a step's peak memory"):
        _fit(100.0, [], measured_peaks=False)
