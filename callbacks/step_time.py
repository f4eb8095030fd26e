"""Wall time of every optimizer step, its median and p90 over a sliding window, and token throughput.

Why not Lightning's own callbacks: :class:`~lightning.pytorch.callbacks.Timer` only measures whole
stages (for ``max_time``), with no per-step times. :class:`~lightning.pytorch.callbacks.ThroughputMonitor`
runs its hooks on rank zero only (so it cannot report the slowest rank), counts samples and lengths
from the *batch* through ``batch_size_fn``/``length_fn`` (but the tokens a pruned DPO step really
executes are decided inside ``training_step``, not visible in the batch), and reports averages of
cumulative counters, not per-step median/p90. We reuse its practice of ``torch.cuda.synchronize()``
before reading the clock, and take the token counts from the module's ``step_stats`` instead.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lit_prunedpo.intervals import quantile as _quantile


class StepTimeMonitor(Callback):
    """Log the wall time of each optimizer step and the tokens processed per second.

    A *step* runs from ``on_train_batch_start`` of its first micro-batch to ``on_train_batch_end``
    of the micro-batch whose optimizer step moved ``trainer.global_step`` (so gradient accumulation,
    forward, backward and ``optimizer.step`` are all inside; validation and checkpointing after the
    step are not). On CUDA the clock is read after ``torch.cuda.synchronize()``.

    The first ``warmup_steps`` steps of every ``fit`` call (CUDA context, allocator growth,
    compilation...) are timed but neither logged nor put in the window or the run summary. After
    them, each step logs (``pl_module.log(..., on_step=True)``):

    * ``time/step_s``: this step's time on the slowest rank (max over ranks);
    * ``time/step_median_s``, ``time/step_p90_s``: median and 90th percentile (linear interpolation)
      of ``time/step_s`` over the last ``window`` post-warm-up steps;
    * if the LightningModule has a ``step_stats`` attribute with int ``tokens_executed`` and
      ``positions_scored`` for the step just run (summed over micro-batches):
      ``throughput/tokens_executed_per_s`` and ``throughput/tokens_supervised_per_s``, the tokens of
      all ranks (sum) divided by ``time/step_s``. Without ``step_stats`` these keys are skipped.

    Under DDP/FSDP one ``trainer.strategy.all_gather`` of a 4-float tensor per step gives the max
    time and the token sums.

    Summary attributes (values as logged): :attr:`last_step_s`, :attr:`window_times`,
    :attr:`median_s`, :attr:`p90_s`, :attr:`timed_steps` and :attr:`mean_s` over the run (after
    warm-up). The window, the run totals and the step counter survive a restart through
    ``state_dict``; the warm-up applies again after a restart (a new process warms up again).

    Args:
        window: number of post-warm-up steps the median and p90 are computed over.
        warmup_steps: steps excluded at the start of each ``fit``.

    Raises:
        ValueError: if ``window < 1`` or ``warmup_steps < 0``.

    Example::

        monitor = StepTimeMonitor(window=50, warmup_steps=5)
        trainer = Trainer(callbacks=[monitor], max_steps=200)
        trainer.fit(model)
        print(monitor.median_s, monitor.p90_s, monitor.mean_s)
    """

    KEYS = ("time/step_s", "time/step_median_s", "time/step_p90_s")
    THROUGHPUT_KEYS = ("throughput/tokens_executed_per_s", "throughput/tokens_supervised_per_s")

    def __init__(self, window: int = 20, warmup_steps: int = 2) -> None:
        super().__init__()
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"`window` must be an int >= 1, got {window!r}")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"`warmup_steps` must be an int >= 0, got {warmup_steps!r}")
        self.window = window
        self.warmup_steps = warmup_steps

        self.steps = 0  # all optimizer steps seen, warm-up included
        self.timed_steps = 0  # post-warm-up steps in the run summary
        self.total_time_s = 0.0
        self.last_step_s: Optional[float] = None
        self._window: deque[float] = deque(maxlen=window)
        self._fit_steps = 0  # steps of the current fit call, for the warm-up
        self._t0: Optional[float] = None
        self._step_start: Optional[int] = None
        self._tokens = [0, 0]
        self._has_stats = True

    @property
    def window_times(self) -> list[float]:
        """The post-warm-up step times (slowest rank) in the window, oldest first."""
        return list(self._window)

    @property
    def median_s(self) -> Optional[float]:
        return statistics.median(self._window) if self._window else None

    @property
    def p90_s(self) -> Optional[float]:
        return _quantile(list(self._window), 0.9) if self._window else None

    @property
    def mean_s(self) -> Optional[float]:
        return self.total_time_s / self.timed_steps if self.timed_steps else None

    @staticmethod
    def _sync(trainer: pl.Trainer) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_steps = 0
        self._t0 = self._step_start = None

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._t0 is not None:
            return  # a later micro-batch of the same optimizer step
        self._sync(trainer)  # keep earlier queued work (validation, last step's logging) out
        self._step_start = trainer.global_step
        self._tokens = [0, 0]
        self._has_stats = True
        self._t0 = time.perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._t0 is None:
            return
        stats = getattr(pl_module, "step_stats", None)
        if stats is None:
            self._has_stats = False
        else:
            self._tokens[0] += int(stats.tokens_executed)
            self._tokens[1] += int(stats.positions_scored)
        if trainer.global_step == self._step_start:
            return  # still accumulating gradients
        self._sync(trainer)
        elapsed = time.perf_counter() - self._t0
        self._t0 = self._step_start = None
        self.steps += 1
        self._fit_steps += 1
        if self._fit_steps <= self.warmup_steps:
            return  # same count on every rank: all skip the collective together
        self._record(trainer, pl_module, elapsed)

    def _record(self, trainer: pl.Trainer, pl_module: pl.LightningModule, elapsed: float) -> None:
        local = torch.tensor(
            [elapsed, *self._tokens, float(self._has_stats)], dtype=torch.float64, device=trainer.strategy.root_device
        )
        rows = trainer.strategy.all_gather(local).reshape(-1, 4)  # [world, 4]
        step_s = float(rows[:, 0].max())
        self.last_step_s = step_s
        self._window.append(step_s)
        self.timed_steps += 1
        self.total_time_s += step_s
        metrics = {"time/step_s": step_s, "time/step_median_s": self.median_s, "time/step_p90_s": self.p90_s}
        if bool(rows[:, 3].min() > 0) and step_s > 0:
            executed, supervised = rows[:, 1].sum().item(), rows[:, 2].sum().item()
            metrics["throughput/tokens_executed_per_s"] = executed / step_s
            metrics["throughput/tokens_supervised_per_s"] = supervised / step_s
        for name, value in metrics.items():
            pl_module.log(name, value, on_step=True, on_epoch=False, sync_dist=False)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "timed_steps": self.timed_steps,
            "total_time_s": self.total_time_s,
            "window": list(self._window),
            "last_step_s": self.last_step_s,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict.get("steps", 0))
        self.timed_steps = int(state_dict.get("timed_steps", 0))
        self.total_time_s = float(state_dict.get("total_time_s", 0.0))
        self._window = deque(state_dict.get("window", []), maxlen=self.window)
        self.last_step_s = state_dict.get("last_step_s")
