import statistics
import time
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lit_prunedpo.callbacks import StepTimeMonitor
from lit_prunedpo.callbacks.step_time import _quantile

THROUGHPUT = StepTimeMonitor.THROUGHPUT_KEYS


class StatsModel(BoringModel):
    """BoringModel that sets ``step_stats`` every training step (when given counts) and can sleep."""

    def __init__(self, tokens_executed=None, positions_scored=None, sleep_s=0.0):
        super().__init__()
        self.counts = None if tokens_executed is None else (tokens_executed, positions_scored)
        self.sleep_s = sleep_s

    def training_step(self, batch, batch_idx):
        if self.counts is not None:
            self.step_stats = SimpleNamespace(tokens_executed=self.counts[0], positions_scored=self.counts[1])
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return super().training_step(batch, batch_idx)


def _trainer(callbacks, max_steps, **kwargs):
    return Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        limit_val_batches=0,
        logger=False,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **kwargs,
    )


def _metrics(trainer):
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_keys_values_and_warmup_excluded():
    cb = StepTimeMonitor(window=20, warmup_steps=2)
    trainer = _trainer([cb], max_steps=7)
    trainer.fit(StatsModel(sleep_s=0.002))
    m = _metrics(trainer)
    assert set(StepTimeMonitor.KEYS) <= set(m)
    assert not set(THROUGHPUT) & set(m)  # no step_stats: no throughput keys
    assert cb.steps == 7 and cb.timed_steps == 5
    times = cb.window_times
    assert len(times) == 7 - 2  # the warm-up steps are not in the window
    assert all(0.002 <= t < 10 for t in times)
    assert m["time/step_s"] == pytest.approx(times[-1])
    assert m["time/step_median_s"] == pytest.approx(statistics.median(times))
    assert statistics.median(times) <= m["time/step_p90_s"] <= max(times)
    assert cb.mean_s == pytest.approx(sum(times) / len(times))


def test_nothing_logged_during_warmup():
    cb = StepTimeMonitor(warmup_steps=3)
    trainer = _trainer([cb], max_steps=3)
    trainer.fit(BoringModel())
    assert cb.steps == 3 and cb.timed_steps == 0 and cb.median_s is None
    assert not any(k.startswith(("time/", "throughput/")) for k in trainer.callback_metrics)


def test_throughput_from_step_stats():
    cb = StepTimeMonitor(warmup_steps=1)
    trainer = _trainer([cb], max_steps=4)
    trainer.fit(StatsModel(tokens_executed=1000, positions_scored=250))
    m = _metrics(trainer)
    assert m["throughput/tokens_executed_per_s"] == pytest.approx(1000 / m["time/step_s"], rel=1e-5)
    assert m["throughput/tokens_supervised_per_s"] == pytest.approx(250 / m["time/step_s"], rel=1e-5)


def test_window_slides_and_accumulation_spans_micro_batches():
    cb = StepTimeMonitor(window=3, warmup_steps=0)
    trainer = _trainer([cb], max_steps=5, accumulate_grad_batches=2)
    trainer.fit(StatsModel(tokens_executed=100, positions_scored=10, sleep_s=0.002))
    assert cb.steps == 5 and len(cb.window_times) == 3
    assert all(t >= 2 * 0.002 for t in cb.window_times)  # two micro-batches per optimizer step
    m = _metrics(trainer)
    # the tokens of both micro-batches are counted
    assert m["throughput/tokens_executed_per_s"] * m["time/step_s"] == pytest.approx(200, rel=1e-4)


@pytest.mark.parametrize(
    "kwargs, name",
    [({"window": 0}, "window"), ({"window": 2.0}, "window"), ({"warmup_steps": -1}, "warmup_steps")],
)
def test_argument_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StepTimeMonitor(**kwargs)


def test_state_dict_round_trip(tmp_path):
    cb = StepTimeMonitor(window=4, warmup_steps=1)
    trainer = _trainer([cb], max_steps=6)
    trainer.fit(BoringModel())
    state = cb.state_dict()
    assert state["steps"] == 6 and state["timed_steps"] == 5 and len(state["window"]) == 4
    restored = StepTimeMonitor(window=4, warmup_steps=1)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.median_s == cb.median_s and restored.mean_s == cb.mean_s

    # through a real checkpoint: counters and window carry on, the warm-up applies again
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed = StepTimeMonitor(window=4, warmup_steps=1)
    _trainer([resumed], max_steps=9).fit(BoringModel(), ckpt_path=ckpt)
    assert resumed.steps == 9
    assert resumed.timed_steps == 5 + (3 - 1)
    assert resumed.window_times[:2] == cb.window_times[-2:]


def test_quantile_matches_torch():
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4]
    for q in (0.0, 0.5, 0.9, 1.0):
        expected = torch.quantile(torch.tensor(values, dtype=torch.float64), q).item()
        assert _quantile(values, q) == pytest.approx(expected)
    assert _quantile([2.0], 0.9) == 2.0
