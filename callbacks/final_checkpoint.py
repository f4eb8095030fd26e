"""The trained model out: every ``fit`` ends with a checkpoint of its last step, and a summary that says where.

Why not ``ModelCheckpoint`` alone: it saves after a validation or every ``n`` steps, so ``max_steps: 50`` with
validation every 40 steps leaves the step-40 weights, and a run shorter than one interval leaves nothing.
:class:`FinalCheckpoint` saves ``{dirpath}/last.ckpt`` at the end of training (``max_steps``, ``max_epochs``,
``max_time``, early stop; mid-epoch ends are written as mid-epoch, so that a resume continues the same data
order) and on Lightning's own ``SIGTERMException``, through ``trainer.save_checkpoint`` (so
the strategy's checkpoint format and I/O apply: a folder of shards under FSDP2). The name is ``last`` on purpose:
Lightning's implicit resume (with an ``OnExceptionCheckpoint``) looks for ``last*.ckpt`` in the ``ModelCheckpoint``
folder, which is this one's folder by default; ``--ckpt_path last`` finds it as the newest checkpoint of the
previous runs (``lit_prunedpo.checkpoint.resolve_resume``). With :class:`~lit_prunedpo.callbacks.PreemptionCheckpoint`
in the callbacks, a SIGTERM is saved by that callback (to the same file); this one then only reports it.

The last lines of the log are a summary: the checkpoint, the last validation's metrics and its step, the
median step time (``StepTimeMonitor``) and the peak memory (``PeakMemoryMonitor``) when those callbacks run,
and the Hugging Face folder when ``export_dir`` is set (written by :func:`lit_prunedpo.export.export`), else the
``lit-prunedpo export`` command that writes one from the checkpoint. Each validation prints one line (step,
``val/loss``, ``val/rewards/accuracies``, ``val/rewards/margins``).

Ctrl-C (SIGINT) is handled like a preemption: the first one finishes the current step, saves it as ``last.ckpt``,
prints the summary and ends the process with status 130 (128 + SIGINT, what a shell reports for a program Ctrl-C
stopped, so that ``fit && export`` does not go on); every rank stops at the same step. A second Ctrl-C stops at
once (Lightning's own handling) and the log says which checkpoint was kept, and of which step, or that none was.
SIGINTs within :data:`CTRL_C_BURST_S` of the first (a burst), or once the stop is saving, are that same Ctrl-C.
After a SIGTERM stop, further SIGTERMs (a scheduler's burst) are ignored while the process exits, so that its exit
status stays the clean stop's 0 instead of a kill's 143.

The ``lit-prunedpo`` command adds this callback to every ``fit`` (its options are ``--final.*``). A trainer with
``enable_checkpointing=False`` (no ``ModelCheckpoint`` among its callbacks) gets no checkpoint from it either: it
says so in one line when ``fit`` starts, and keeps the rest (the summary, Ctrl-C); ``export_dir`` is then refused.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override


#: The line the last fit stopped at once by Ctrl-C ended with (what it kept), for the command's closing line.
KEPT_AFTER_INTERRUPT: Optional[str] = None

#: Seconds after a Ctrl-C within which another SIGINT is the same Ctrl-C (a burst), not a second one.
CTRL_C_BURST_S = 0.5


class StoppedByCtrlC(SystemExit):
    """Ends a fit that Ctrl-C stopped after its checkpoint was saved: exit status 130 (128 + SIGINT)."""

    def __init__(self) -> None:
        super().__init__(130)


# the metrics of the one line each validation prints (all of them are in the logs and the final summary)
_VALIDATION_LINE = ("val/loss", "val/rewards/accuracies", "val/rewards/margins")


def export_command(checkpoint: str, trainer: pl.Trainer) -> str:
    """The ``lit-prunedpo export`` command line that writes ``checkpoint`` as a Hugging Face folder: ``hf`` beside
    the run's ``checkpoints`` folder (a LoRA policy is written merged, the export's default)."""
    out = Path(checkpoint).parent.parent / "hf" if Path(checkpoint).parent.name.startswith("checkpoints") else (
        Path(trainer.default_root_dir) / "hf")
    return f"lit-prunedpo export --ckpt_path {shlex.quote(str(checkpoint))} --out {shlex.quote(str(out))}"


class FinalCheckpoint(Callback):
    """Save the last step's weights when ``fit`` ends, optionally export them, and log a run summary.

    Args:
        dirpath: folder of the checkpoint; ``None``: the trainer's ``ModelCheckpoint`` folder (so that
            ``--ckpt_path last`` finds it), else ``{default_root_dir}/checkpoints`` (``checkpoints-N`` for a run
            without a logger when another run has that one, see ``lit_prunedpo.checkpoint.claims``).
        filename: file name without extension; must start with ``last`` for ``--ckpt_path last`` to see it.
        export_dir: also write a Hugging Face folder (policy + tokenizer) there at the end of ``fit``.
        export_adapter: for a LoRA policy, ``merged`` writes full merged weights, ``adapter`` peft's adapter
            folder alone (ignored without LoRA).

    Raises:
        ValueError: on an empty ``filename`` or an unknown ``export_adapter``.

    Example::

        lit-prunedpo fit --config configs/quickstart.yaml --trainer.max_steps 3 --final.export_dir model/
    """

    def __init__(
        self,
        dirpath: Optional[str] = None,
        filename: str = "last",
        export_dir: Optional[str] = None,
        export_adapter: Literal["merged", "adapter"] = "merged",
    ) -> None:
        if not filename or "/" in filename or filename.endswith(".ckpt"):
            raise ValueError(f"filename must be a bare name without '/' or '.ckpt', got {filename!r}")
        if export_adapter not in ("merged", "adapter"):
            raise ValueError(f"export_adapter must be 'merged' or 'adapter', got {export_adapter!r}")
        self.dirpath = dirpath
        self.filename = filename
        self.export_dir = export_dir
        self.export_adapter = export_adapter
        self.saved_path: Optional[str] = None
        self.exported_dir: Optional[str] = None
        self._saved_step: Optional[int] = None
        self._val_step: Optional[int] = None
        self._checkpointing = True  # False under trainer.enable_checkpointing=False (set-up): nothing is saved
        self._saving = False
        self._finished = False
        self._interrupt_requested = self._stopping = False
        self._interrupted_at = 0.0
        self._previous_sigint: Any = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.saved_path = self.exported_dir = None
        self._saved_step = self._val_step = None
        self._finished = False
        # Lightning adds a ModelCheckpoint to every trainer unless enable_checkpointing=False (and refuses one then)
        self._checkpointing = bool(trainer.checkpoint_callbacks)
        if self._checkpointing or stage != "fit":
            return
        if self.export_dir is not None:
            raise ValueError(f"final.export_dir {self.export_dir}: the export is written from the final checkpoint, "
                             "but trainer.enable_checkpointing is false; enable checkpointing, or leave export_dir "
                             "unset")
        rank_zero_info("trainer.enable_checkpointing is false: no checkpoint is written, not even the final last.ckpt "
                       "(the trained weights are not kept; enable it to keep them)")

    def _folder(self, trainer: pl.Trainer) -> str:
        if self.dirpath:
            return self.dirpath
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath:
            return str(checkpoint.dirpath)
        from lit_prunedpo.checkpoint import run_checkpoint_dir

        return str(run_checkpoint_dir(trainer))  # {default_root_dir}/checkpoints, or the one this run claimed

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_sigint()
        self._save(trainer)
        if self.export_dir is not None:
            self._export(trainer)
        self._finished = True  # the summary waits for teardown, after a progress bar's (placed before this callback)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore_sigint()
        if self._finished:
            self._finished = False
            self._summary(trainer, reason="finished")

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore_sigint()
        if isinstance(exception, KeyboardInterrupt):
            global KEPT_AFTER_INTERRUPT
            KEPT_AFTER_INTERRUPT = self._kept_after_interrupt(trainer)
            rank_zero_info(KEPT_AFTER_INTERRUPT)
            return
        # Only Lightning's SIGTERM path: after other errors the ranks may be out of step and the state half-updated.
        if not isinstance(exception, SIGTERMException) or trainer.sanity_checking:
            return
        self._save(trainer)
        self._summary(trainer, reason="stopped by SIGTERM")
        _ignore_later_sigterms(trainer)

    # ------------------------------------------------------------------------------------ Ctrl-C
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._interrupt_requested = self._stopping = False
        # only over Python's own handler: a handler the user installed stays theirs
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # one Ctrl-C: SIGINTs within CTRL_C_BURST_S of the first are the same one (a burst: whether it was one or two
        # depended on whether a step ended between them), and so are those once the stop is saving
        if self._interrupt_requested and (self._stopping or time.monotonic() - self._interrupted_at < CTRL_C_BURST_S):
            return
        if self._interrupt_requested:  # the second Ctrl-C: stop at once
            self._restore_sigint()
            raise KeyboardInterrupt
        self._interrupt_requested, self._interrupted_at = True, time.monotonic()
        sys.stderr.write("\nCtrl-C: stopping after this step and saving it (Ctrl-C again stops at once, keeping only "
                         "the checkpoints already written)\n")

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
        self._previous_sigint = None

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        requested = self._interrupt_requested
        if trainer.world_size > 1:  # any rank interrupted -> all stop at this step (the checkpoint is collective)
            requested = trainer.strategy.reduce_boolean_decision(requested, all=False)
        if not requested:
            return
        self._stopping = True  # a Ctrl-C from here on is the one being handled (on_exception restores the handler)
        self._save(trainer)
        self._summary(trainer, reason="stopped by Ctrl-C")
        raise StoppedByCtrlC()

    def _kept_after_interrupt(self, trainer: pl.Trainer) -> str:
        """The line a run stopped at once by Ctrl-C ends with: what was kept."""
        if not trainer.training and trainer.global_step == 0:
            return "interrupted by Ctrl-C before training started: nothing was trained, nothing saved"
        head = f"interrupted by Ctrl-C at step {trainer.global_step}, without saving it"
        kept = [(-1 if step is None else step, path) for step, path in self._written(trainer) if os.path.exists(path)]
        if not kept:
            return f"{head}; no checkpoint was written before: the {trainer.global_step} steps trained are lost"
        step, path = max(kept)
        return f"{head}; kept: {path} (step {step}), which --ckpt_path last resumes"

    def _written(self, trainer: pl.Trainer, model_checkpoints: bool = True) -> list[tuple[Optional[int], str]]:
        """(step, path) of the last checkpoint each other callback wrote: a ``ModelCheckpoint``'s ``last`` (left
        out with ``model_checkpoints=False``), a ``PreemptionCheckpoint``'s."""
        written = []
        for callback in trainer.callbacks:
            if isinstance(callback, ModelCheckpoint):
                if model_checkpoints and callback.last_model_path:
                    written.append((getattr(callback, "_last_global_step_saved", None), str(callback.last_model_path)))
            elif callback is not self and getattr(callback, "saved_path", None):
                written.append((getattr(callback, "_saved_step", None), str(callback.saved_path)))
        return written

    # ------------------------------------------------------------------------------------ saving
    def _already_saved(self, trainer: pl.Trainer) -> Optional[str]:
        """A ``last*`` checkpoint of this very step written by another callback (ModelCheckpoint's save_last,
        PreemptionCheckpoint), so that the same weights are not written twice. A ModelCheckpoint's file of a fit
        that ends mid-epoch does not count: saved after the last validation, it holds that epoch as completed (see
        ``on_save_checkpoint``), so a resume would start the next epoch; this callback writes the step over it."""
        mid_epoch = not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        for step, path in self._written(trainer, model_checkpoints=not mid_epoch):
            if step == trainer.global_step and Path(path).name.startswith("last") and os.path.exists(path):
                return path
        return None

    def _save(self, trainer: pl.Trainer) -> None:
        if self._saved_step == trainer.global_step or not self._checkpointing:
            return
        existing = trainer.strategy.broadcast(self._already_saved(trainer))
        if existing is not None:
            self.saved_path = existing
        else:
            path = trainer.strategy.broadcast(os.path.join(self._folder(trainer), self.filename + ".ckpt"))
            self._saving = True
            try:
                trainer.save_checkpoint(path, weights_only=False)
            finally:
                self._saving = False
            self.saved_path = path
            checkpoint = trainer.checkpoint_callback
            if (isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath
                    and Path(checkpoint.dirpath) == Path(path).parent):
                checkpoint.last_model_path = path  # its own next save_last replaces this file instead of adding one
        self._saved_step = trainer.global_step

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # When max_steps (or max_time, or a stop request) ends the fit in the middle of an epoch, Lightning has
        # already counted that epoch as completed by on_train_end; a checkpoint saved there would resume with
        # the *next* epoch (a new shuffle), not the next batch. Write the epoch as still running, exactly as a
        # ModelCheckpoint saved after the same batch does, so the resume continues the same data order.
        if not self._saving or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress")
        if progress is None:
            return
        for counts in (progress["total"], progress["current"]):
            if counts["completed"] == counts["started"]:
                counts["processed"] = counts["completed"] = counts["started"] - 1

    def _export(self, trainer: pl.Trainer) -> None:
        from lit_prunedpo.export import export

        trainer.strategy.barrier("final-export")  # every shard of the checkpoint is on disk
        if trainer.is_global_zero:
            export(self.saved_path, self.export_dir, adapter=self.export_adapter)
        trainer.strategy.barrier("final-export-done")
        self.exported_dir = self.export_dir

    # ----------------------------------------------------------------------------------- summary
    def _summary(self, trainer: pl.Trainer, reason: str) -> None:
        lines = [f"run {reason} at step {trainer.global_step}"]
        val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if val:
            shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(val.items()))
            lines.append(f"last validation (step {self._val_step}): {shown}")
        else:
            lines.append("no validation ran")
        for callback in trainer.callbacks:
            median = getattr(callback, "median_s", None)
            if type(callback).__name__ == "StepTimeMonitor" and median is not None:
                lines.append(f"median step time: {median:.4g} s over the last {len(callback.window_times)} timed steps")
            peak = getattr(callback, "max_peak_mb", None)
            if type(callback).__name__ == "PeakMemoryMonitor" and peak is not None:
                lines.append(f"peak memory ({callback.primary_key}, this rank): {peak:.1f} MB")
        lines.append(f"final checkpoint: {self.saved_path}" if self._checkpointing
                     else "final checkpoint: none (trainer.enable_checkpointing is false)")
        if reason.startswith("stopped") and self.saved_path is not None:
            lines.append("continue it: the same command with --ckpt_path last")
        if self.exported_dir is not None:
            lines.append(f"Hugging Face folder: {self.exported_dir}")
        elif self.saved_path is not None:
            lines.append(f"export it: {export_command(self.saved_path, trainer)}")
        rank_zero_info("\n".join(lines))

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._val_step = trainer.global_step
        # one line per validation, also without a progress bar (a log file, a batch job)
        metrics = trainer.callback_metrics
        shown = [f"{k} {float(metrics[k]):.4g}" for k in _VALIDATION_LINE if k in metrics]
        if not shown:
            return
        line = f"validation at step {trainer.global_step}: {', '.join(shown)}"
        bar = trainer.progress_bar_callback
        if bar is not None and getattr(bar, "is_enabled", False):
            bar.print(line)  # above a live bar (a log line would be written into it), on rank zero only
        else:
            rank_zero_info(line)

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # Lightning then ends the fit at once ("max_steps reached"), which does not say that nothing was trained
        step = checkpoint.get("global_step")
        if trainer.state.fn == "fit" and isinstance(step, int) and 0 <= trainer.max_steps <= step:
            rank_zero_warn(f"resume: the checkpoint is at step {step} >= trainer.max_steps {trainer.max_steps}: "
                           f"nothing to train; to train more, raise --trainer.max_steps above {step}")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {}


def _ignore_later_sigterms(trainer: pl.Trainer) -> None:
    """After a SIGTERM stop, make SIGTERM ignored for the rest of the process: Lightning's teardown restores the
    handler the process had before ``fit`` (the default, which kills with status 143), and a scheduler that sends
    several SIGTERMs would then kill a run that has already saved and stopped cleanly."""
    originals = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", None)
    if isinstance(originals, dict) and signal.SIGTERM in originals:
        originals[signal.SIGTERM] = signal.SIG_IGN  # what Lightning's teardown restores
    elif threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
