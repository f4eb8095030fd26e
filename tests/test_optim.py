"""WarmupCosineLR: linear warm-up, cosine decay, the trainer's step count filled in when not given."""

from __future__ import annotations

import math

import pytest
import torch

from lit_prunedpo.optim import WarmupCosineLR


def rates(scheduler, steps):
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def test_warmup_then_cosine():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    lr = rates(WarmupCosineLR(opt, warmup_steps=3, total_steps=13, min_lr_ratio=0.1), 14)
    assert lr[:3] == pytest.approx([0.25, 0.5, 0.75])
    assert lr[3] == pytest.approx(1.0)
    assert lr[8] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr[13] == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs, name", [({"warmup_steps": -1}, "warmup_steps"), ({"total_steps": 0}, "total_steps"),
                                          ({"min_lr_ratio": 2.0}, "min_lr_ratio"), ({"on_extension": "jump"},
                                                                                    "on_extension")])
def test_bad_arguments(kwargs, name):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=name):
        WarmupCosineLR(opt, **kwargs)


def _sgd(lr):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _extended(first_total, steps, new_total, **kwargs):
    """A schedule of ``first_total`` steps run for ``steps``, then resumed (Lightning's order: optimizer state,
    then scheduler state) by one that follows a trainer of ``new_total`` steps."""
    first = WarmupCosineLR(_sgd(1.0), **kwargs)
    first.fit_to(first_total)
    rates(first, steps)
    resumed = WarmupCosineLR(_sgd(1.0), **kwargs)
    resumed.fit_to(new_total)
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    resumed.load_state_dict(first.state_dict())
    return first, resumed


def test_an_extension_continues_from_the_resume_steps_rate_without_a_jump(caplog):
    caplog.set_level("INFO")
    first, resumed = _extended(10, 6, 20, warmup_steps=2, min_lr_ratio=0.1)
    at_resume = first.optimizer.param_groups[0]["lr"]  # the rate step 6 would have had in the first run
    assert (resumed.total_steps, resumed.last_epoch) == (20, 6)
    later = rates(resumed, 15)  # steps 6..20
    assert later[0] == pytest.approx(at_resume)  # no jump
    assert all(a > b for a, b in zip(later, later[1:-1]))  # down a cosine ...
    assert later[14] == pytest.approx(0.1)  # ... to the floor at the new end (step 20)
    assert later[7] == pytest.approx(0.1 + (at_resume - 0.1) * 0.5)  # half-way: (20 - 6) / 2 steps on
    assert "continues from" in caplog.text and "on_extension=stretch would re-fit" in caplog.text
    # extended again from step 12: continues from the continued curve, not from the first schedule
    again = WarmupCosineLR(_sgd(1.0), warmup_steps=2, min_lr_ratio=0.1)
    again.fit_to(30)
    second = WarmupCosineLR(_sgd(1.0), warmup_steps=2, min_lr_ratio=0.1)
    second.fit_to(20)
    second.optimizer.load_state_dict(first.optimizer.state_dict())
    second.load_state_dict(first.state_dict())
    rates(second, 6)  # to step 12
    again.optimizer.load_state_dict(second.optimizer.state_dict())
    again.load_state_dict(second.state_dict())
    assert again.get_last_lr()[0] == pytest.approx(second.get_last_lr()[0]) and again.anchor[0] == 12


def test_a_finished_schedule_is_not_continued_at_rate_zero():
    with pytest.raises(ValueError, match=r"extended from 4 to 8 steps .* had ended at rate 0 at step 4: continued, "
                                         r"every added step would train at rate 0. Set model.scheduler.init_args."
                                         r"on_extension=stretch to re-fit the warm-up and cosine to 8 steps \(rate "
                                         r"0.5"):
        _extended(4, 4, 8)
    _, floor = _extended(4, 4, 8, min_lr_ratio=0.2)  # a floor above 0 goes on at the floor
    assert rates(floor, 4) == pytest.approx([0.2] * 4)


def test_stretch_refits_the_whole_schedule_and_a_given_total_is_the_users():
    first, resumed = _extended(4, 4, 8, on_extension="stretch")
    assert first.optimizer.param_groups[0]["lr"] == pytest.approx(0.0)  # the end of a 4-step schedule
    assert (resumed.total_steps, resumed.last_epoch) == (8, 4)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.5)  # half-way through 8 steps, from this step
    given = WarmupCosineLR(_sgd(1.0), total_steps=4)
    given.load_state_dict(first.state_dict())
    assert given.total_steps == 4 and not given.follows_trainer  # a total that was given is the user's


def test_an_extension_during_the_warm_up_has_nothing_to_jump():
    first, resumed = _extended(10, 2, 20, warmup_steps=5)
    assert resumed.anchor is None and resumed.get_last_lr()[0] == pytest.approx(first.get_last_lr()[0])


def _resume(make_scheduler, lr_before, lr_after, steps):
    """describe/apply_changes around a resume: the checkpoint's run, then this run with its state loaded."""
    from lit_prunedpo.optim import apply_changes, describe

    opt = _sgd(lr_before)
    sched = make_scheduler(opt)
    saved = describe(opt, sched)
    rates(sched, steps)
    new_opt = _sgd(lr_after)
    new_sched = make_scheduler(new_opt)
    configured = describe(new_opt, new_sched)
    new_opt.load_state_dict(opt.state_dict())
    new_sched.load_state_dict(sched.state_dict())
    return apply_changes(saved, configured, configured, new_opt, new_sched), new_opt, new_sched


def test_a_new_learning_rate_is_applied_over_the_restored_state():
    from torch.optim.lr_scheduler import StepLR

    applied, opt, sched = _resume(lambda o: StepLR(o, step_size=2, gamma=0.5), 1.0, 0.1, 3)
    assert applied == ["optimizer.lr"]
    group = opt.param_groups[0]
    assert (group["lr"], group["initial_lr"], sched.base_lrs) == (pytest.approx(0.05), 0.1, [0.1])  # 0.1 * 0.5^(3//2)
    opt.step()
    sched.step()
    assert group["lr"] == pytest.approx(0.025)  # the schedule goes on from the new rate


def test_a_new_learning_rate_a_scheduler_cannot_recompute_is_refused():
    from torch.optim.lr_scheduler import CyclicLR

    with pytest.raises(ValueError, match=r"model.optimizer.init_args.lr changed \(1.0 -> 0.1\) but the current rate of "
                                         r"torch.optim.lr_scheduler.CyclicLR cannot be recomputed"):
        _resume(lambda o: CyclicLR(o, base_lr=0.01, max_lr=0.1, cycle_momentum=False), 1.0, 0.1, 3)


def test_a_changed_scheduler_argument_it_keeps_elsewhere_is_refused():
    from torch.optim.lr_scheduler import OneCycleLR

    from lit_prunedpo.optim import apply_changes, describe

    def build(max_lr):
        opt = _sgd(0.1)
        return opt, OneCycleLR(opt, max_lr=max_lr, total_steps=10)

    opt, sched = build(1.0)
    saved = describe(opt, sched, {"max_lr": 1.0, "total_steps": 10})
    new_opt, new_sched = build(2.0)
    configured = describe(new_opt, new_sched, {"max_lr": 2.0, "total_steps": 10})
    with pytest.raises(ValueError, match=r"model.scheduler.init_args.max_lr changed \(1.0 -> 2.0\) but the restored "
                                         r"torch.optim.lr_scheduler.OneCycleLR keeps it in no attribute of that name"):
        apply_changes(saved, configured, describe(new_opt, new_sched), new_opt, new_sched)


def test_a_run_shorter_than_its_warm_up_is_warned():
    with pytest.warns(UserWarning, match=r"warmup_steps=150 is not less than this run's 30 optimizer steps "
                                         r"\(trainer.max_steps\): the learning rate never reaches the set rate "
                                         r"\(the last step's is 20% of it\); lower warmup_steps or raise"):
        WarmupCosineLR(_sgd(1.0), warmup_steps=150).fit_to(30)


def test_a_resume_past_the_new_total_neither_continues_nor_refuses(caplog):
    caplog.set_level("INFO")
    first, resumed = _extended(8, 8, 4)  # the checkpoint's schedule ended at rate 0 at step 8; the new run ends at 4
    assert resumed.total_steps == 4 and "resume: WarmupCosineLR" not in caplog.text
