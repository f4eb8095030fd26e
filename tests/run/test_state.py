"""The state ``PrunedDPO`` carries, each piece an object it constructs, tested without a Trainer: ``RunState``
round-trips through a checkpoint dict, ``OptimizerRecord`` records and re-applies a run's optimizer arguments over a
restored real AdamW, ``GradientCheck`` checks a real gradient (against ``clip_grad_norm_``) and drops a non-finite
one, ``TrainingLog`` writes the window's means through any ``Logs``."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from lit_prunedpo.run.gradient_check import GradientCheck
from lit_prunedpo.metrics import StepStats
from lit_prunedpo.run.nonfinite import NonFiniteGuard
from lit_prunedpo.optim import WarmupCosineLR
from lit_prunedpo.run.optimizer_setup import UNRECORDED, OptimizerRecord
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo.run.state import RunState


def draws(rng: SamplerRNG, n: int = 3) -> list[float]:
    return [torch.rand(1, generator=rng.next()).item() for _ in range(n)]


def test_run_state_round_trips_through_a_checkpoint_and_goes_on_drawing_where_it_stopped():
    state = RunState(NonFiniteGuard("skip", 5))
    state.sampler_rng = SamplerRNG(seed=7)
    draws(state.sampler_rng, 4)
    state.nonfinite.skipped_steps, state.nonfinite.skipped_in_a_row, state.num_tokens = 3, 1, 12345
    checkpoint = state.state_dict()
    assert "optimizer_setup" not in checkpoint  # nothing built, nothing recorded
    resumed = RunState(NonFiniteGuard("skip", 5))
    resumed.load_state_dict(checkpoint, sampler_seed=7)
    assert draws(resumed.sampler_rng) == draws(state.sampler_rng)
    assert (resumed.nonfinite.skipped_steps, resumed.nonfinite.skipped_in_a_row, resumed.num_tokens) == (3, 1, 12345)


def test_a_checkpoint_without_the_samplers_stream_restarts_it_and_says_so():
    resumed = RunState(NonFiniteGuard())
    with pytest.warns(UserWarning, match="no sampler generator state"):
        resumed.load_state_dict({"num_tokens": 5})
    assert resumed.num_tokens == 5 and resumed.sampler_rng.step == 0


def _build(record: OptimizerRecord, lr: float, scheduler: Any = None) -> tuple[torch.nn.Parameter, Any]:
    weight = torch.nn.Parameter(torch.ones(3))
    answer = record.build([weight], functools.partial(torch.optim.AdamW, lr=lr), scheduler, lambda: 10)
    return weight, answer


def test_the_optimizer_record_is_what_checkpoints_carry_and_a_resume_applies_this_runs_rate():
    saved = OptimizerRecord()
    weight, optimizer = _build(saved, lr=1e-3)
    weight.grad = torch.ones(3)
    optimizer.step()
    checkpoint = {**saved.state_dict(), "optimizer_states": [optimizer.state_dict()]}
    assert checkpoint["optimizer_setup"]["optimizer_args"]["lr"] == 1e-3
    record = OptimizerRecord()
    _, resumed = _build(record, lr=5e-4)
    record.load_state_dict(checkpoint)
    resumed.load_state_dict(checkpoint["optimizer_states"][0])  # what Lightning restores: the old rate
    assert resumed.param_groups[0]["lr"] == 1e-3
    record.apply_resumed([resumed], [])
    assert resumed.param_groups[0]["lr"] == 5e-4 and record.resumed is None  # applied, once


def test_a_checkpoint_with_optimizer_state_and_no_record_keeps_its_own_and_warns():
    record = OptimizerRecord()
    _, optimizer = _build(record, lr=5e-4)
    record.load_state_dict({"optimizer_states": [{}]})
    assert record.resumed == UNRECORDED
    with pytest.warns(UserWarning, match="records no optimizer or scheduler arguments"):
        record.apply_resumed([optimizer], [])


def test_a_warmup_cosine_scheduler_is_fitted_to_the_runs_steps_and_recorded_as_configured():
    record = OptimizerRecord()
    _, answer = _build(record, 1e-3, functools.partial(WarmupCosineLR, warmup_steps=2))
    assert answer["lr_scheduler"]["interval"] == "step"
    assert record.configured is not None and record.in_effect is not None


def _gradient(values: list[float]) -> torch.optim.Optimizer:
    weight = torch.nn.Parameter(torch.zeros(len(values)))
    weight.grad = torch.tensor(values)
    return torch.optim.SGD([weight], lr=0.1)


def test_the_gradient_check_measures_the_norm_clipping_would_and_hands_it_over_once():
    skipped = []
    check = GradientCheck(NonFiniteGuard("raise"), lambda: skipped.append(1))
    optimizer = _gradient([3.0, 4.0])
    params = optimizer.param_groups[0]["params"]
    loss = check.closure(optimizer, lambda: torch.tensor(1.0), scaled=False, step=0, batch_idx=0)()
    assert float(loss) == 1.0 and not skipped
    norm = check.take_norm()
    assert float(norm) == pytest.approx(float(torch.nn.utils.clip_grad_norm_(params, float("inf")))) == 5.0
    assert check.take_norm() is None


def test_a_non_finite_gradient_is_dropped_under_skip_and_stops_the_run_under_raise():
    skipped = []
    check = GradientCheck(NonFiniteGuard("skip", 3), lambda: skipped.append(1))
    optimizer = _gradient([float("nan"), 1.0])
    with pytest.warns(UserWarning, match="non-finite gradient"):
        check.closure(optimizer, lambda: torch.tensor(1.0), scaled=False, step=4, batch_idx=2)()
    assert optimizer.param_groups[0]["params"][0].grad is None and skipped == [1]
    assert check.guard.skipped_steps == 1
    with pytest.raises(FloatingPointError, match="at step 4 .batch 2."):
        GradientCheck(NonFiniteGuard("raise"), lambda: None).check(_gradient([float("inf")]), False, 4, 2, True)


def test_a_grad_scalers_gradients_are_not_checked():
    guard = NonFiniteGuard("raise")
    guard.skipped_in_a_row = 2
    optimizer = _gradient([float("nan")])
    assert GradientCheck(guard, lambda: None).check(optimizer, True, 0, 0, has_loss=True) is None
    assert guard.skipped_in_a_row == 0  # a finite loss whose step the scaler handles ends the streak


class RecordingLogs:
    """Any ``Logs``: keeps what was logged."""

    def __init__(self) -> None:
        self.logged: dict[str, Any] = {}

    def log(self, name: str, value: Any, **kwargs: Any) -> None:
        self.logged[name] = value

    def log_dict(self, dictionary: dict[str, Any], **kwargs: Any) -> None:
        self.logged.update(dictionary)


def test_the_training_log_writes_the_windows_means_and_the_token_count_through_any_logs(tiny_step_output):
    from lit_prunedpo.run.training_logs import TrainingLog

    log, sink = TrainingLog(), RecordingLogs()
    for out in tiny_step_output:
        log.add(out, beta=0.1)
    log.write(sink, tiny_step_output[-1], num_pairs=3, num_tokens=2**25 + 1)
    chosen = [float(out.estimate.policy_logps[:, 0].mean()) for out in tiny_step_output]
    assert float(sink.logged["train/logps/chosen"]) == pytest.approx(sum(chosen) / len(chosen))  # both steps'
    assert float(sink.logged["train/loss"]) == pytest.approx(0.6931, abs=1e-4)  # policy = reference: ln 2
    assert int(sink.logged["train/num_tokens"]) == 2**25 + 1  # exact past float32's 2**24
    assert log.window.pop_means() == {}  # emptied by the write


@pytest.fixture
def tiny_step_output(tiny_source, small_batch) -> list:
    """Two real steps of a tiny module (different draws of its positions), as the training step hands them to the
    log."""
    from lit_prunedpo import PrunedDPO
    from lit_prunedpo.samplers import BernoulliPositions

    module = PrunedDPO(tiny_source, position_sampler=BernoulliPositions(0.5))
    outs = [module.step(small_batch, generator=torch.Generator().manual_seed(s), token_stats=True) for s in (0, 1)]
    assert all(isinstance(out.stats, StepStats) for out in outs)
    assert float(outs[0].estimate.policy_logps[:, 0].mean()) != float(outs[1].estimate.policy_logps[:, 0].mean())
    return outs
