import csv
import statistics
import sys
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger

from lit_prunedpo.callbacks import PeakMemoryMonitor, StepTimeMonitor
from lit_prunedpo.callbacks import _memory

MiB = 2**20
LINUX = sys.platform.startswith("linux")
needs_clear_refs = pytest.mark.skipif(
    _memory.cpu_peak_rss_status() != "resettable", reason="needs Linux with a writable /proc/self/clear_refs"
)


class AllocModel(BoringModel):
    """BoringModel whose training step allocates and touches ``extra_mb`` MiB, kept alive until the step ends."""

    def __init__(self, extra_mb: int = 0, extra_mb_rank1: int = 0):
        super().__init__()
        self.extra_mb = extra_mb
        self.extra_mb_rank1 = extra_mb_rank1
        self._buf = None

    def training_step(self, batch, batch_idx):
        mb = self.extra_mb + (self.extra_mb_rank1 if self.global_rank == 1 else 0)
        self.step_stats = SimpleNamespace(tokens_executed=100 * (self.global_rank + 1), positions_scored=10)
        if mb:
            self._buf = torch.ones(mb * MiB // 4)  # torch.ones writes every page
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):  # runs after the callbacks' hook
        self._buf = None


def _fit(model, callbacks, max_steps=5, ckpt_path=None, **kwargs):
    kwargs.setdefault("logger", False)
    kwargs.setdefault("log_every_n_steps", 1)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **kwargs,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer


@needs_clear_refs
def test_cpu_keys_and_plausible_values():
    cb = PeakMemoryMonitor()
    trainer = _fit(BoringModel(), [cb])
    assert cb.mode == "cpu" and cb.primary_key == "memory/peak_rss_mb"
    peak = float(trainer.callback_metrics["memory/peak_rss_mb"])
    rss_now = _memory.read_rss_bytes() / MiB
    assert 10 < peak < 65536  # a python+torch process: tens of MiB to a few GiB
    assert peak >= 0.5 * rss_now  # the peak of a step is not far below what the process holds
    assert "memory/peak_rss_mb_rank0" not in trainer.callback_metrics
    assert cb.steps == 5 and len(cb.history) == 5
    assert cb.max_peak_mb == max(h["memory/peak_rss_mb"] for h in cb.history) > 0


@needs_clear_refs
def test_cpu_peak_sees_a_known_allocation():
    n_mb = 200
    base, alloc = PeakMemoryMonitor(), PeakMemoryMonitor()
    _fit(AllocModel(0), [base], max_steps=4)
    _fit(AllocModel(n_mb), [alloc], max_steps=4)
    per_step = lambda cb: [h["memory/peak_rss_mb"] for h in cb.history]  # noqa: E731
    diff = statistics.median(per_step(alloc)) - statistics.median(per_step(base))
    assert diff >= 0.9 * n_mb, (per_step(base), per_step(alloc))
    # the mark is reset every step: a step without the allocation does not inherit the previous peak
    assert diff < 2 * n_mb


def _csv_rows(trainer, key):
    with open(f"{trainer.logger.log_dir}/metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r.get(key)]


@needs_clear_refs
def test_per_rank_and_logging_cadence(tmp_path):
    # default: log on the steps the trainer's logger writes, the max over all steps since the last row
    cb = PeakMemoryMonitor(per_rank=True)
    trainer = _fit(BoringModel(), [cb], max_steps=7, logger=CSVLogger(tmp_path, name="a"), log_every_n_steps=3)
    key = "memory/peak_rss_mb"
    assert float(trainer.callback_metrics[key + "_rank0"]) == float(trainer.callback_metrics[key])
    rows = _csv_rows(trainer, key)
    history = [h[key] for h in cb.history]
    assert len(history) == 7 and len(rows) == 2  # steps 3 and 6
    assert float(rows[0][key]) == pytest.approx(max(history[0:3]))
    assert float(rows[1][key]) == pytest.approx(max(history[3:6]))

    # an explicit cadence: every 2 steps (Lightning repeats the last value on the rows in between)
    cb = PeakMemoryMonitor(log_every_n_steps=2)
    trainer = _fit(BoringModel(), [cb], max_steps=4, logger=CSVLogger(tmp_path, name="b"), log_every_n_steps=1)
    by_step = {int(r["step"]): float(r[key]) for r in _csv_rows(trainer, key)}
    history = [h[key] for h in cb.history]
    assert 0 not in by_step  # nothing logged after the first step
    assert by_step[1] == pytest.approx(max(history[0:2]))
    assert by_step[3] == pytest.approx(max(history[2:4]))
    assert "memory/peak_rss_mb_rank0" not in trainer.callback_metrics


@pytest.mark.skipif(not LINUX, reason="needs /proc")
def test_unresettable_fallbacks(monkeypatch):
    monkeypatch.setattr(_memory, "reset_peak_rss", lambda: False)
    with pytest.raises(RuntimeError, match="clear_refs"):
        _fit(BoringModel(), [PeakMemoryMonitor(on_unresettable="raise")], max_steps=1)
    cb = PeakMemoryMonitor()
    with pytest.warns(UserWarning, match="NOT a per-step peak"):
        trainer = _fit(BoringModel(), [cb], max_steps=2)
    assert cb.mode == "cpu_lifetime"
    assert "memory/peak_rss_mb" not in trainer.callback_metrics
    assert float(trainer.callback_metrics["memory/lifetime_peak_rss_mb"]) > 10

    monkeypatch.setattr(_memory, "read_peak_rss_bytes", lambda: None)
    cb = PeakMemoryMonitor()
    with pytest.warns(UserWarning, match="logs nothing"):
        trainer = _fit(BoringModel(), [cb], max_steps=2)
    assert cb.mode == "off" and cb.steps == 0
    assert not any(k.startswith("memory/") for k in trainer.callback_metrics)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"log_every_n_steps": 0}, "log_every_n_steps"),
        ({"log_every_n_steps": 1.5}, "log_every_n_steps"),
        ({"history_size": 0}, "history_size"),
        ({"on_unresettable": "ignore"}, "on_unresettable"),
    ],
)
def test_argument_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PeakMemoryMonitor(**kwargs)


@needs_clear_refs
def test_state_dict_round_trip(tmp_path):
    cb = PeakMemoryMonitor(history_size=3)
    trainer = _fit(BoringModel(), [cb], max_steps=4)
    assert len(cb.history) == 3  # the last 3 of 4 steps
    state = cb.state_dict()
    restored = PeakMemoryMonitor(history_size=3)
    restored.load_state_dict(state)
    assert restored.state_dict() == state and restored.max_peak_mb is None  # mode is set at setup

    # through a real checkpoint: the step count and run max carry on
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed = PeakMemoryMonitor(history_size=3)
    _fit(BoringModel(), [resumed], max_steps=6, ckpt_path=ckpt)
    assert resumed.steps == 6
    assert resumed.max_peak_mb >= cb.max_peak_mb


@needs_clear_refs
@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_ddp_max_over_ranks_and_per_rank():
    """Two CPU processes (gloo): rank 1 allocates 150 MiB more; the logged value is the max over ranks."""
    if torch.cuda.is_initialized():
        pytest.skip("ddp_fork cannot run once CUDA is initialized in this process")
    mem, timer = PeakMemoryMonitor(per_rank=True), StepTimeMonitor(warmup_steps=1)
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=3, limit_val_batches=0, logger=False,
        log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[mem, timer],
    )
    trainer.fit(AllocModel(0, extra_mb_rank1=150))
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}  # sent back from rank 0
    assert m["memory/peak_rss_mb_rank1"] - m["memory/peak_rss_mb_rank0"] >= 0.9 * 150
    assert m["memory/peak_rss_mb"] == m["memory/peak_rss_mb_rank1"]
    assert m["time/step_s"] > 0 and m["time/step_median_s"] > 0
    # tokens of both ranks (100 + 200 executed, 10 + 10 scored) over the slowest rank's time
    assert m["throughput/tokens_executed_per_s"] * m["time/step_s"] == pytest.approx(300, rel=1e-4)
    assert m["throughput/tokens_supervised_per_s"] * m["time/step_s"] == pytest.approx(20, rel=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_allocator_peak():
    class CudaAlloc(BoringModel):
        def training_step(self, batch, batch_idx):
            self._buf = torch.ones(64 * MiB // 4, device=self.device)
            return super().training_step(batch, batch_idx)

        def on_train_batch_end(self, *args):
            self._buf = None

    cb = PeakMemoryMonitor()
    trainer = Trainer(
        accelerator="cuda", devices=1, max_steps=3, limit_val_batches=0, logger=False, enable_checkpointing=False,
        log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
    )
    trainer.fit(CudaAlloc())
    assert cb.mode == "cuda"
    allocated = float(trainer.callback_metrics["memory/peak_allocated_mb"])
    assert allocated >= 64
    assert float(trainer.callback_metrics["memory/peak_reserved_mb"]) >= allocated


@needs_clear_refs
@pytest.mark.parametrize("settle", [False, True])
def test_meter_sees_a_known_allocation(settle):
    """The meter both the callback and the benchmark measure with: a 64 MiB buffer written and freed between
    start and stop shows in the peak above the start, not in the start."""
    meter = _memory.PeakMemoryMeter(torch.device("cpu"), mode="cpu", settle=settle)  # settle alone picks tensors
    assert meter.mode == "cpu" and meter.measure == "peak RSS (VmHWM reset by clear_refs)"
    meter.start()
    buf = torch.ones(64 * MiB // 4)  # torch.ones writes every page
    del buf
    reading = meter.stop()
    assert reading.reserved is None and reading.peak >= reading.start > 10 * MiB
    assert 0.9 * 64 * MiB <= reading.above_start < 4 * 64 * MiB


def test_meter_modes(monkeypatch):
    assert _memory.PeakMemoryMeter(torch.device("cpu"), mode="off").stop() is None
    with pytest.raises(ValueError, match="mode must be one of"):
        _memory.PeakMemoryMeter(torch.device("cpu"), mode="gpu")
    monkeypatch.setattr(_memory, "read_peak_rss_bytes", lambda: None)  # no /proc: what the probe finds, named
    meter = _memory.PeakMemoryMeter(torch.device("cpu"))
    assert meter.mode == "off" and meter.measure == "unavailable"
