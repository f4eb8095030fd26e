"""Peak memory of every training step, measured (not estimated) on CUDA and on the CPU.

Lightning ships no callback for this: :class:`~lightning.pytorch.callbacks.DeviceStatsMonitor` logs
instantaneous device stats (and on the CPU only system-wide ``psutil`` percentages), never a per-step
peak, so this one is written from scratch. It measures with :class:`._memory.PeakMemoryMeter`, the unit the
benchmark measures its steps with too; this file adds the step boundaries, the agreement and reduction over
ranks, and the logging.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from . import _memory


class PeakMemoryMonitor(Callback):
    """Log the peak memory of each optimizer step.

    A *step* runs from ``on_train_batch_start`` of its first micro-batch to ``on_train_batch_end``
    of the micro-batch whose optimizer step moved ``trainer.global_step`` (so with gradient
    accumulation a step covers all its micro-batches). Values are in MiB (2**20 bytes).

    Logged keys (``pl_module.log(..., on_step=True)``), each the maximum over ranks and over all
    steps since the previous log (see ``log_every_n_steps``):

    * CUDA root device: ``memory/peak_allocated_mb`` (``torch.cuda.max_memory_allocated``, memory held
      by live tensors) and ``memory/peak_reserved_mb`` (``max_memory_reserved``, what the caching
      allocator took from the driver). The counters are reset with ``reset_peak_memory_stats`` at
      each step start, which also resets them for any other code reading them.
    * Any other root device, Linux: ``memory/peak_rss_mb``, the peak resident set size of the
      process: the step start writes ``"5"`` to ``/proc/self/clear_refs`` (resets the kernel's mark
      to the current RSS) and the step end reads ``VmHWM`` from ``/proc/self/status``. Caveats: RSS
      is the whole process (other threads, the allocator's cached-but-free memory, shared pages such
      as mapped libraries and files, all count), memory freed back to the OS lowers it, swapped-out
      pages do not count, and DataLoader worker processes are not included. The reset is not local to
      this callback: ``clear_refs`` lowers the kernel's one high-water mark, so after a run with this
      callback the *lifetime* peak that ``getrusage(RUSAGE_SELF).ru_maxrss``, ``VmHWM`` and
      ``/usr/bin/time -v`` ("Maximum resident set size") report is only the peak since the last step start,
      not the process's. Read the run's peak from :attr:`run_max_mb` (or leave this callback out when
      measuring a whole process from outside, as ``lab/scripts/lora_memory.py`` does).
    * If ``clear_refs`` is not writable on some rank (e.g. a restricted container):
      ``on_unresettable="raise"`` raises at setup; ``"warn"`` (default) warns and logs
      ``memory/lifetime_peak_rss_mb`` instead, the non-resettable peak RSS since the process
      started, which is NOT a per-step value (it only ever grows).
    * No ``/proc`` (not Linux): ``"raise"`` raises at setup; ``"warn"`` warns and logs nothing.

    With ``per_rank=True`` every key is also logged per rank as ``{key}_rank{r}``.

    Summary attributes (this rank's own values, one entry per step, for benchmarks):
    :attr:`run_max_mb` (key -> max over the run), :attr:`history` (the per-step dicts of the last
    ``history_size`` steps), :attr:`primary_key` and :attr:`max_peak_mb` (run max of the primary
    key: allocated on CUDA, RSS on the CPU). Steps counted and the run maxima survive a restart
    through ``state_dict``.

    Args:
        log_every_n_steps: reduce over ranks and log every this many optimizer steps. ``None``
            (default): on the steps where the trainer's loggers write (``Trainer(log_every_n_steps)``,
            read through the same ``trainer._logger_connector.should_update_logs`` that Lightning's
            ``ThroughputMonitor`` uses), so every logger row covers all steps since the previous row.
            Memory is measured every step either way; between logs Lightning's loggers repeat the
            last logged value, so pass an int only if you read ``trainer.callback_metrics``.
        per_rank: also log each rank's value.
        history_size: how many per-step values :attr:`history` keeps.
        on_unresettable: ``"warn"`` or ``"raise"``, see above.

    Raises:
        ValueError: if an argument is out of range.
        RuntimeError: at setup, with ``on_unresettable="raise"``, if the CPU peak cannot be reset.

    Example::

        monitor = PeakMemoryMonitor(per_rank=True)
        trainer = Trainer(callbacks=[monitor], max_steps=100)
        trainer.fit(model)
        print(monitor.primary_key, monitor.max_peak_mb)
    """

    def __init__(
        self,
        log_every_n_steps: Optional[int] = None,
        per_rank: bool = False,
        history_size: int = 100,
        on_unresettable: Literal["warn", "raise"] = "warn",
    ) -> None:
        super().__init__()
        if log_every_n_steps is not None and (not isinstance(log_every_n_steps, int) or log_every_n_steps < 1):
            raise ValueError(f"`log_every_n_steps` must be None or an int >= 1, got {log_every_n_steps!r}")
        if not isinstance(history_size, int) or history_size < 1:
            raise ValueError(f"`history_size` must be an int >= 1, got {history_size!r}")
        if on_unresettable not in ("warn", "raise"):
            raise ValueError(f"`on_unresettable` must be 'warn' or 'raise', got {on_unresettable!r}")
        self.log_every_n_steps = log_every_n_steps
        self.per_rank = bool(per_rank)
        self.history_size = history_size
        self.on_unresettable = on_unresettable

        self.mode: _memory.Mode = "off"
        self.steps = 0
        self.run_max_mb: dict[str, float] = {}
        self.history: deque[dict[str, float]] = deque(maxlen=history_size)
        self._device: Optional[torch.device] = None
        self._meter: Optional[_memory.PeakMemoryMeter] = None
        self._step_start: Optional[int] = None  # global_step when the current step began
        self._interval: dict[str, float] = {}  # max since the last log

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys this monitor logs in its current mode (without ``_rank{r}`` suffixes)."""
        return {
            "cuda": ("memory/peak_allocated_mb", "memory/peak_reserved_mb"),
            "cpu": ("memory/peak_rss_mb",),
            "cpu_lifetime": ("memory/lifetime_peak_rss_mb",),
            "off": (),
        }[self.mode]

    @property
    def primary_key(self) -> Optional[str]:
        """The headline key: peak allocated on CUDA, peak RSS on the CPU; None when off."""
        return self.keys[0] if self.keys else None

    @property
    def max_peak_mb(self) -> Optional[float]:
        """Run maximum of :attr:`primary_key` on this rank, None before the first step."""
        return self.run_max_mb.get(self.primary_key) if self.primary_key else None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._device = trainer.strategy.root_device
        self._choose_mode(trainer)
        self._meter = _memory.PeakMemoryMeter(self._device, mode=self.mode)

    def _choose_mode(self, trainer: pl.Trainer) -> None:
        if self._device.type == "cuda":
            self.mode = "cuda"
            return
        status = _memory.cpu_peak_rss_status()
        # every rank must pick the same mode: the keys and the collectives must match
        available = trainer.strategy.reduce_boolean_decision(status != "unavailable", all=True)
        resettable = trainer.strategy.reduce_boolean_decision(status == "resettable", all=True)
        if resettable:
            self.mode = "cpu"
            rank_zero_info("PeakMemoryMonitor: per-step peak RSS via /proc/self/clear_refs + VmHWM.")
            return
        why = "/proc/self/status is not readable (not Linux?)" if not available else (
            "/proc/self/clear_refs is not writable, so the peak-RSS mark cannot be reset"
        )
        if self.on_unresettable == "raise":
            raise RuntimeError(f"PeakMemoryMonitor cannot measure a per-step CPU peak: {why}.")
        if not available:
            self.mode = "off"
            rank_zero_warn(f"PeakMemoryMonitor: {why}; it logs nothing.")
        else:
            self.mode = "cpu_lifetime"
            rank_zero_warn(
                f"PeakMemoryMonitor: {why}; logging `memory/lifetime_peak_rss_mb`, the peak RSS since the"
                " process started, which is NOT a per-step peak."
            )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step_start = None
        self._interval = {}

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.mode == "off" or self._step_start is not None:
            return  # off, or a later micro-batch of the same optimizer step
        self._step_start = trainer.global_step
        self._meter.start()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._step_start is None or trainer.global_step == self._step_start:
            return  # off, or still accumulating gradients
        self._step_start = None
        values = self._read()
        self.steps += 1
        self.history.append(values)
        for key, v in values.items():
            self.run_max_mb[key] = max(v, self.run_max_mb.get(key, v))
            self._interval[key] = max(v, self._interval.get(key, v))
        if self._should_log(trainer):
            self._log(trainer, pl_module)

    def _should_log(self, trainer: pl.Trainer) -> bool:
        # the same answer on every rank: it depends on step counters only
        if self.log_every_n_steps is not None:
            return self.steps % self.log_every_n_steps == 0
        return bool(getattr(trainer._logger_connector, "should_update_logs", True))

    def _read(self) -> dict[str, float]:
        reading = self._meter.stop()
        if self.mode == "cuda":
            return {self.keys[0]: reading.peak / _memory.MB, self.keys[1]: reading.reserved / _memory.MB}
        return {self.keys[0]: (reading.peak if reading is not None else 0) / _memory.MB}

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        keys = list(self._interval)
        local = torch.tensor([self._interval[k] for k in keys], dtype=torch.float64, device=self._device)
        self._interval = {}
        if self.per_rank:
            per_rank = trainer.strategy.all_gather(local).reshape(-1, len(keys))  # [world, keys]
            overall = per_rank.max(dim=0).values
        else:
            overall = trainer.strategy.reduce(local, reduce_op="max")
        metrics = {k: float(v) for k, v in zip(keys, overall.tolist())}
        if self.per_rank:
            for r, row in enumerate(per_rank.tolist()):
                metrics.update({f"{k}_rank{r}": float(v) for k, v in zip(keys, row)})
        for name, value in metrics.items():
            pl_module.log(name, value, on_step=True, on_epoch=False, sync_dist=False)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "run_max_mb": dict(self.run_max_mb), "history": list(self.history)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict.get("steps", 0))
        self.run_max_mb = dict(state_dict.get("run_max_mb", {}))
        self.history = deque(state_dict.get("history", []), maxlen=self.history_size)
