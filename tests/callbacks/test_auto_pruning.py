"""AutoPruning: the choice rule on hand-made figures, the calibration's measurements through the real module, and
the callback in real fits (the choice applied to every step, kept across a resume, refusals)."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lit_prunedpo.callbacks.auto_pruning as auto_pruning
from helpers import RecordWork, make_batch
from lit_prunedpo import PrunedDPO
from lit_prunedpo.callbacks import AutoPruning
from lit_prunedpo.callbacks.auto_pruning import AutoDecision, calibrate, calibration_steps, decide, skip_reason
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.gradient_noise import between_variance, gradient, pair
from lit_prunedpo.modes import load_mode
from lit_prunedpo.step.plan import exact_samplers
from lit_prunedpo.samplers import AllPositions, BothBranches, FullPrefix, RandomBranch


# ------------------------------------------------------------------------------------------- the rule
def test_decide_picks_the_candidate_with_the_lowest_variance_times_cost():
    # between 1: "a" costs half (k 2) and adds within 0.5: (1 + 0.5) / 2 = 0.75; "b" k 4/3, within 0: 0.75 too;
    # "c" k 2, within 2: 1.5
    choice, reason, arms = decide(1.0, 1.0, {"c": (0.5, 2.0), "a": (0.5, 0.5), "b": (0.75, 0.0)}, min_gain=0.1)
    assert choice == "a"  # ties go to the first given of the best
    assert [a.mode for a in arms] == ["vanilla", "c", "a", "b"]
    assert [a.inefficiency for a in arms] == pytest.approx([1.0, 1.5, 0.75, 0.75])
    assert arms[2].k == pytest.approx(2.0) and "0.75 <= 0.90" in reason


def test_decide_keeps_vanilla_without_enough_gain():
    # (1 + 0.5) / 1.6 = 0.9375: better than vanilla, but not by min_gain 0.1
    choice, reason, _ = decide(1.0, 0.8, {"a": (0.5, 0.5)}, min_gain=0.1)
    assert choice == "vanilla" and "no candidate" in reason
    assert decide(1.0, 0.8, {"a": (0.5, 0.5)}, min_gain=0.0)[0] == "a"
    # no between-pair noise at all: any added noise is infinitely worse per unit of variance
    assert decide(0.0, 1.0, {"a": (0.1, 1e-9)}, min_gain=0.1)[0] == "vanilla"
    assert decide(1.0, 1.0, {}, min_gain=0.1)[0] == "vanilla"
    with pytest.raises(ValueError, match="step times"):
        decide(1.0, 0.0, {"a": (0.5, 0.5)}, min_gain=0.1)


# ------------------------------------------------------------------------------------- the calibration
@pytest.fixture
def module(tiny_source):
    torch.manual_seed(0)
    return PrunedDPO(policy=tiny_source)


def test_calibration_measures_through_the_module_and_leaves_it_as_it_was(module):
    batch = make_batch([3, 2, 4, 2, 5, 3], [5, 4, 6, 3, 6, 5], [4, 6, 2, 5, 3, 4])
    weights = [p.detach().clone() for p in module.policy.parameters()]
    samplers = (module.prefix_sampler, module.position_sampler, module.branch_sampler)
    stream = module.sampler_rng.step
    decision = calibrate(module, batch, {"antithetic": load_mode("antithetic").samplers}, pairs=4, draws=3,
                         min_gain=0.1)
    assert all(p.grad is None for p in module.policy.parameters())  # no gradients left

    # between: the unbiased variance of the first 4 pairs' exact gradients, recomputed here independently
    g = torch.Generator().manual_seed(0)
    per_pair = torch.stack([gradient(module, pair(batch, i), exact_samplers(), g) for i in range(4)])
    assert decision.between == pytest.approx(between_variance(per_pair), rel=1e-5)
    assert decision.pairs == 4 and decision.draws == 3 and decision.calibration_s > 0
    vanilla, antithetic = decision.arms
    assert (vanilla.mode, vanilla.k, vanilla.within) == ("vanilla", 1.0, 0.0)
    # one branch per pair: a real extra variance, and the rule applied to the measured figures
    assert antithetic.within > 0
    assert antithetic.inefficiency == pytest.approx((1 + antithetic.within / decision.between) / antithetic.k)
    assert decision.choice == decide(decision.between, vanilla.step_s,
                                     {"antithetic": (antithetic.step_s, antithetic.within)}, 0.1)[0]
    # the module: same weights, samplers and sampler stream
    assert all(torch.equal(a, b) for a, b in zip(weights, module.policy.parameters()))
    assert (module.prefix_sampler, module.position_sampler, module.branch_sampler) == samplers
    assert module.sampler_rng.step == stream


def test_an_exact_candidate_adds_no_variance(module):
    # the exact samplers under another name: every draw is the exact batch gradient, so within is exactly 0 and
    # the candidate's inefficiency is vanilla's up to timing (k ~ 1): never chosen with a gain asked for
    batch = make_batch([3, 2, 4], [5, 4, 6], [4, 6, 2])
    decision = calibrate(module, batch, {"exact-again": exact_samplers()}, pairs=3, draws=2, min_gain=0.5)
    assert decision.arms[1].within == 0.0
    assert decision.choice == "vanilla"


def test_calibration_refuses_a_batch_of_one_pair(module):
    with pytest.raises(ValueError, match=">= 2 pairs"):
        calibrate(module, make_batch([3], [5], [4]), {"branch": load_mode("branch").samplers})


# --------------------------------------------------------------------------------------- the callback

def _fit(tiny_source, auto, tmp_path=None, max_steps=3, ckpt_path=None, module=None):
    module = module or PrunedDPO(policy=tiny_source, shared_prompt=False)
    record = RecordWork()
    callbacks = [auto, record]
    if tmp_path is not None:
        callbacks.append(ModelCheckpoint(dirpath=tmp_path, save_last=True))
    trainer = L.Trainer(accelerator="cpu", max_steps=max_steps, limit_val_batches=0, logger=False,
                        enable_checkpointing=tmp_path is not None, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)
    trainer.fit(module, datamodule=SyntheticPreferenceData(vocab_size=32, num_train=48, num_val=8, batch_size=4),
                ckpt_path=ckpt_path)
    return trainer, module, record


def test_the_choice_is_applied_from_the_first_step_and_logged(tiny_source):
    auto = AutoPruning(candidates=["antithetic", "position-coupled"], pairs=4, draws=2, max_share=None)
    trainer, module, record = _fit(tiny_source, auto)
    decision = auto.decision
    assert decision is not None and [a.mode for a in decision.arms] == ["vanilla", "antithetic", "position-coupled"]
    metrics = trainer.callback_metrics
    assert float(metrics["auto/pruned"]) == float(decision.choice != "vanilla")
    assert float(metrics["auto/antithetic/k"]) == pytest.approx(decision.arms[1].k)
    assert math.isfinite(float(metrics["auto/calibration_s"]))
    branches, all_branches, positions, all_positions = record.steps[0]
    if decision.choice == "vanilla":
        assert all(s[0] == s[1] and s[2] == s[3] for s in record.steps)
    elif decision.choice == "antithetic":
        assert all(s[0] == s[1] // 2 for s in record.steps)
    else:
        assert all(s[2] < s[3] for s in record.steps)
    # the module is left as configured
    assert isinstance(module.branch_sampler, BothBranches) and isinstance(module.position_sampler, AllPositions)


def test_a_resumed_run_keeps_its_choice_without_calibrating_again(tiny_source, tmp_path, monkeypatch):
    calls = []
    real = auto_pruning.calibrate

    def forced(module, batch, candidates, *args):  # the real calibration, its choice forced to a pruning mode
        calls.append(1)
        d = real(module, batch, candidates, *args)
        return AutoDecision("antithetic", "forced by the test", d.between, d.arms, d.pairs, d.draws, d.calibration_s)

    monkeypatch.setattr(auto_pruning, "calibrate", forced)
    first = AutoPruning(candidates=["antithetic"], pairs=2, draws=1, max_share=None)
    _, _, record = _fit(tiny_source, first, tmp_path, max_steps=2)
    assert calls == [1] and all(s[0] == s[1] // 2 for s in record.steps)  # one branch per pair from step 1

    second = AutoPruning(candidates=["antithetic"], pairs=2, draws=1, max_share=None)
    _, _, record = _fit(tiny_source, second, tmp_path, max_steps=4, ckpt_path=str(tmp_path / "last.ckpt"))
    assert calls == [1]  # restored from the checkpoint, not calibrated again
    assert second.decision is not None and second.decision.choice == "antithetic"
    assert len(record.steps) == 2 and all(s[0] == s[1] // 2 for s in record.steps)


def test_a_skipped_calibration_is_decided_again_when_the_run_is_extended(tiny_source, tmp_path, monkeypatch, caplog):
    # 2 pairs, 1 draw, 1 candidate: at most 5 vanilla steps of work; max_share 0.5 asks for 10 steps or more
    calls = []
    real = auto_pruning.calibrate
    monkeypatch.setattr(auto_pruning, "calibrate", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = AutoPruning(candidates=["antithetic"], pairs=2, draws=1, max_share=0.5)
    _fit(tiny_source, first, tmp_path, max_steps=3)
    assert calls == [] and first.decision.skipped and first.decision.choice == "vanilla"

    short = AutoPruning(candidates=["antithetic"], pairs=2, draws=1, max_share=0.5)  # 6 steps left: still too few
    with caplog.at_level("INFO"):
        _fit(tiny_source, short, tmp_path, max_steps=9, ckpt_path=str(tmp_path / "last.ckpt"))
    assert calls == [] and short.decision.skipped and "still vanilla" in caplog.text and "run's 6 steps" in caplog.text

    longer = AutoPruning(candidates=["antithetic"], pairs=2, draws=1, max_share=0.5)  # 10 steps left: calibrates
    with caplog.at_level("INFO"):
        _fit(tiny_source, longer, tmp_path, max_steps=19, ckpt_path=str(tmp_path / "last.ckpt"))
    assert calls == [1] and not longer.decision.skipped
    assert [a.mode for a in longer.decision.arms] == ["vanilla", "antithetic"]
    assert "resumed at step 9 with 10 steps left, enough to repay a calibration" in caplog.text


def test_a_decision_saved_before_the_skipped_field_is_read_as_skipped():
    old = {"choice": "vanilla", "reason": "calibration skipped: its work ...", "between": math.nan, "arms": [],
           "pairs": 8, "draws": 4, "calibration_s": 0.0}
    assert AutoDecision.from_dict(old).skipped
    assert not AutoDecision.from_dict({**old, "reason": "no candidate gains"}).skipped


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown candidate mode.*shipped modes are"):
        AutoPruning(candidates=["positon"])
    with pytest.raises(ValueError, match="'vanilla' is always measured"):
        AutoPruning(candidates=["vanilla", "branch"])
    with pytest.raises(ValueError, match="repeat"):
        AutoPruning(candidates=["branch", "branch"])
    with pytest.raises(ValueError, match="pairs >= 2"):
        AutoPruning(pairs=1)
    with pytest.raises(ValueError, match="min_gain"):
        AutoPruning(min_gain=1.0)
    with pytest.raises(ValueError, match="max_share"):
        AutoPruning(max_share=0.0)


def test_refuses_a_module_configured_with_pruning(tiny_source):
    module = PrunedDPO(policy=tiny_source, branch_sampler=RandomBranch())
    with pytest.raises(ValueError, match="model.branch_sampler: RandomBranch; leave them unset"):
        _fit(tiny_source, AutoPruning(), module=module)
    assert isinstance(PrunedDPO(policy=tiny_source).prefix_sampler, FullPrefix)


def test_refuses_more_than_one_process(tiny_source):
    # the check reads only the trainer's world size; a two-process launch from inside pytest would re-run pytest
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="calibrates on one process, this run has 2"):
        AutoPruning().on_fit_start(SimpleNamespace(world_size=2), PrunedDPO(policy=tiny_source))


def test_a_run_too_short_to_repay_a_calibration_skips_it():
    # 8 pairs, 4 draws, 2 candidates: at most 1 + 8 + 4 x 3 = 21 vanilla steps of work
    assert calibration_steps(8, 4, 2) == 21
    assert skip_reason(1050, 8, 4, 2, 0.02) is None  # 21 <= 0.02 x 1050
    reason = skip_reason(1049, 8, 4, 2, 0.02)
    assert reason is not None and "up to 21 vanilla steps" in reason and "1049 steps" in reason
    assert skip_reason(10, 8, 4, 2, None) is None and skip_reason(None, 8, 4, 2, 0.02) is None


def test_a_short_fit_trains_vanilla_without_calibrating(tiny_source, monkeypatch):
    monkeypatch.setattr(auto_pruning, "calibrate", lambda *a, **k: pytest.fail("calibrated a 3-step run"))
    auto = AutoPruning()
    trainer, _, record = _fit(tiny_source, auto, max_steps=3)
    assert auto.decision is not None and auto.decision.choice == "vanilla" and auto.decision.arms == ()
    assert "calibration skipped" in auto.decision.reason and "3 steps" in auto.decision.reason
    assert (float(trainer.callback_metrics["auto/pruned"]) == 0.0
            and float(trainer.callback_metrics["auto/calibration_s"]) == 0.0)
    assert all(s[0] == s[1] and s[2] == s[3] for s in record.steps)


def test_configs_auto_pruning_through_the_cli(tmp_path):
    # configs/auto_pruning.yaml is the quickstart plus AutoPruning: its 3-step run skips the calibration and trains
    # vanilla; with max_share null (the command line's override of the callback's argument) it calibrates on the
    # first batch
    from helpers import REPO, csv_logger
    from lit_prunedpo.cli import build_cli

    args = ["fit", "--config", str(REPO / "configs/auto_pruning.yaml"), "--trainer.max_steps=3",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false", "--data.init_args.max_rows=128"]
    cli = build_cli([*args, f"--trainer.default_root_dir={tmp_path / 'a'}", *csv_logger(tmp_path / "a")])
    (auto,) = [c for c in cli.trainer.callbacks if isinstance(c, AutoPruning)]
    assert auto.decision.choice == "vanilla" and "calibration skipped" in auto.decision.reason
    cli = build_cli([*args, f"--trainer.default_root_dir={tmp_path / 'b'}", *csv_logger(tmp_path / "b"),
                     "--trainer.callbacks.init_args.max_share=null"])
    (auto,) = [c for c in cli.trainer.callbacks if isinstance(c, AutoPruning)]
    assert auto.max_share is None and [a.mode for a in auto.decision.arms] == ["vanilla", "position", "antithetic"]
    assert auto.decision.calibration_s > 0
