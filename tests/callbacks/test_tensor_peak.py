"""The CPU's peak of live tensor storage (``callbacks/_tensor_peak.py``) and the meter's ``"cpu_tensors"`` mode: exact
on known allocations, counting what autograd saves, what backward and the optimizer allocate, reproducible to the
byte on a real training step and larger for a larger batch."""

from __future__ import annotations

import sys

import pytest
import torch
from helpers import TINY_LLAMA, make_batch

from lit_prunedpo.callbacks import PeakMemoryMeter
from lit_prunedpo.callbacks._tensor_peak import TensorPeakTracker, replay
from lit_prunedpo.models import FromConfig
from lit_prunedpo.module import PrunedDPO

MiB = 2**20
SMALL = 64 * 1024  # bytes of the few scalars autograd and a reduction allocate around the sized tensors


def _bytes(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8)


def test_replay_orders_by_time_and_ignores_older_blocks():
    # allocate 10 at t=1, free it at t=2, allocate 4 twice; a free of a block never allocated (address 9) is ignored
    events = [(3, 2, 4), (1, 1, 10), (2, 1, -10), (4, 3, 4), (5, 9, -100)]
    assert replay(events) == (10, 8)
    assert replay([]) == (0, 0)


def test_known_sequence_is_exact():
    tracker = TensorPeakTracker()
    tracker.start()
    big = _bytes(10 * MiB)
    del big
    held = [_bytes(4 * MiB), _bytes(4 * MiB)]
    reading = tracker.stop()
    assert (reading.peak, reading.held) == (10 * MiB, 8 * MiB)

    tracker.start()  # the order matters: 4 held, then 10 on top; freeing older storage (held) lowers nothing
    kept = _bytes(4 * MiB)
    big = _bytes(10 * MiB)
    del big, held
    reading = tracker.stop()
    assert (reading.peak, reading.held) == (14 * MiB, 4 * MiB)
    del kept


class _SavesAndScratches(torch.autograd.Function):
    """Saves a 2 MiB tensor for backward; backward allocates 3 MiB of scratch while it is live."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(torch.ones(2 * MiB // 4))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        (saved,) = ctx.saved_tensors
        scratch = torch.ones(3 * MiB // 4)
        return grad * float(scratch[0] * saved[0])


def test_autograd_saved_tensors_and_backward_buffers_count():
    w = torch.zeros(MiB // 4, requires_grad=True)  # 1 MiB, allocated before the start
    tracker = TensorPeakTracker()
    tracker.start()
    _SavesAndScratches.apply(w).sum().backward()
    reading = tracker.stop()
    # live together in backward: the forward's output (1 MiB), the saved tensor (2), the scratch (3)
    assert 6 * MiB <= reading.peak < 6 * MiB + SMALL
    assert MiB <= reading.held < MiB + SMALL  # w.grad stays; the rest was freed


def test_optimizer_state_and_temporaries_count():
    p = torch.nn.Parameter(torch.zeros(MiB // 4))
    p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW([p], lr=0.1, foreach=False)
    tracker = TensorPeakTracker()
    tracker.start()
    opt.step()
    reading = tracker.stop()
    assert 2 * MiB <= reading.held < 2 * MiB + SMALL  # exp_avg and exp_avg_sq
    assert reading.peak > reading.held + MiB // 2  # and the step's temporaries on top


def test_no_nested_profiler():
    tracker = TensorPeakTracker()
    tracker.start()
    with pytest.raises(RuntimeError, match="already running"):
        TensorPeakTracker().start()
    tracker.stop()
    with pytest.raises(RuntimeError, match="without start"):
        tracker.stop()


def _module() -> tuple[PrunedDPO, torch.optim.Optimizer]:
    module = PrunedDPO(policy=FromConfig("llama", TINY_LLAMA, seed=0), beta=0.1)
    module.train()
    return module, torch.optim.AdamW(module.policy.parameters(), lr=1e-3)


def _step(module, optimizer, batch) -> None:
    module.step(batch, generator=torch.Generator().manual_seed(0)).estimate.objective.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_meter_on_a_training_step_is_reproducible_and_grows_with_the_batch():
    """A meter that settles picks ``cpu_tensors`` on the CPU; a real step (forward, backward, AdamW) reads the same
    bytes every time, above zero and larger for twice the pairs; nothing is held after it."""
    meter = PeakMemoryMeter(torch.device("cpu"), settle=True)
    assert meter.mode == "cpu_tensors" and meter.intrusive
    assert "tensor storage" in meter.measure and "max_memory_allocated" in meter.measure
    module, optimizer = _module()
    small, large = (make_batch([4] * n, [6] * n, [5] * n) for n in (2, 4))
    _step(module, optimizer, small)  # AdamW's state: allocated once, by the first step
    peaks = {}
    for name, batch in (("small", small), ("large", large)):
        readings = []
        for _ in range(3):
            meter.start()
            _step(module, optimizer, batch)
            readings.append(meter.stop())
        assert all(not r.absolute and r.start == 0 and r.above_start == r.peak for r in readings)
        assert len({r.peak for r in readings}) == 1, readings
        peaks[name] = readings[0].peak
    assert 0 < peaks["small"] < peaks["large"]


def test_rss_stays_its_own_mode():
    assert PeakMemoryMeter(torch.device("cpu"), mode="cpu_tensors").mode == "cpu_tensors"
    rss = PeakMemoryMeter(torch.device("cpu"))  # no settle: the callback's choice, the RSS where readable
    assert rss.mode in ("cpu", "cpu_lifetime", "off") and not rss.intrusive


def test_the_profiler_prints_nothing(capfd):
    """Kineto's profiler_start / profiler_stop lines would be two lines of stderr per metered step."""
    tracker = TensorPeakTracker()
    tracker.start()
    kept = _bytes(MiB)
    tracker.stop()
    print("after", file=sys.stderr)
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "profiler_stop" not in err and "after" in err
    del kept


def test_a_process_that_exits_while_tracing_ends_with_its_own_status():
    # Ctrl-C in a metered step ends the command with sys.exit(130) while the profiler runs: torch crashed at exit
    # (SIGSEGV, status 139 / -11) until the tracker was stopped first
    import subprocess

    code = ("import sys, torch\nfrom lit_prunedpo.callbacks._tensor_peak import TensorPeakTracker\n"
            "TensorPeakTracker().start()\ntorch.randn(64, 64) @ torch.randn(64, 64)\nsys.exit(130)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr[-2000:]
