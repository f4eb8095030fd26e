"""Preemption: on SIGTERM, finish the current step, save a checkpoint on every rank together, stop cleanly.

What Lightning 2.6 does by itself on SIGTERM: it sets ``trainer.received_sigterm`` and raises
``SIGTERMException`` at the next batch, **without saving anything** (and its handler runs a collective
inside the signal handler). On SLURM with ``#SBATCH --signal=SIGUSR1@90`` its ``SLURMEnvironment`` saves an
``hpc_ckpt_*.ckpt`` and requeues the job on the requeue signal; that path is unchanged by this callback.

:class:`PreemptionCheckpoint` replaces the SIGTERM handler for the training loop with one that only sets a
flag (forwarding the signal to the ranks Lightning's launcher started, like Lightning's own handler). At
the end of every training batch the ranks agree on the flag (one tiny all-reduce), then all save
``{dirpath}/{filename}.ckpt`` together (a collective for FSDP's sharded checkpoints) and stop the fit the
way Lightning does on SIGTERM (``SIGTERMException``, a ``SystemExit``: exit status 0).

Resuming: the callback is an ``OnExceptionCheckpoint``, so ``fit`` without ``--ckpt_path`` resumes from the
newest readable checkpoint in this run's checkpoint folders (its own and the ``ModelCheckpoint``'s: give that
one a fixed ``dirpath``, as the DDP/FSDP configs do, since each run gets a log version of its own); when there
is none (the first launch) Lightning warns and starts fresh. ``--ckpt_path last`` looks in every previous run's
checkpoint folder too, and refuses when there is nothing (``lit_prunedpo.checkpoint.resolve_resume``). A
given checkpoint that cannot be read raises (never a silent fresh start).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


class PreemptionCheckpoint(OnExceptionCheckpoint):
    """Save a checkpoint and stop cleanly when the process gets SIGTERM (preemption, ``scancel``, k8s).

    Args:
        dirpath: folder of the checkpoint. ``None``: the trainer's ``ModelCheckpoint`` folder (give that one a
            fixed ``dirpath`` so a requeued job finds it), else ``{default_root_dir}/checkpoints``.
        filename: file name without extension; ``last`` (default) is what ``--ckpt_path last`` looks for in
            the ``ModelCheckpoint`` folder.
    """

    def __init__(self, dirpath: str | None = None, filename: str = "last") -> None:
        super().__init__(dirpath=dirpath or "", filename=filename)
        self._given_dirpath = dirpath
        self.requested = False
        self.saved_path: str | None = None
        self._previous_handler: Any = None
        self._trainer_ref: "pl.Trainer | None" = None
        self._saved_step: int | None = None

    @property
    def ckpt_path(self) -> str | None:  # None while the folder is unknown: Lightning then skips it
        if not self.dirpath:
            return None
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if self._given_dirpath:
            return
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath:
            self.dirpath = str(checkpoint.dirpath)
        else:
            from lit_prunedpo.checkpoint import run_checkpoint_dir

            self.dirpath = str(run_checkpoint_dir(trainer))  # {default_root_dir}/checkpoints or the one claimed
        self.dirpath = trainer.strategy.broadcast(self.dirpath)

    # ------------------------------------------------------------------------------ the signal
    def _handler(self, signum: int, frame: Any) -> None:
        if not self.requested:
            self.requested = True
            launcher = getattr(self._trainer_ref.strategy, "launcher", None) if self._trainer_ref else None
            if launcher is not None and getattr(launcher, "procs", None):
                launcher.kill(signum)  # ranks started by Lightning's launcher (rank 0 only has them)

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # Lightning registers its own SIGTERM handler after on_fit_start; replace it for the loop.
        self._trainer_ref = trainer
        self.requested = False
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._handler)

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._restore_handler()

    def _restore_handler(self) -> None:
        if self._previous_handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_handler)
        self._previous_handler = None

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        # any rank signalled -> all save (the same answer on every rank, or the collectives would hang)
        if not trainer.strategy.reduce_boolean_decision(self.requested, all=False):
            return
        self._save(trainer, reason="SIGTERM")
        # stop the way Lightning does on SIGTERM (a SystemExit, status 0): no end-of-training hooks, so no
        # second "last" checkpoint from ModelCheckpoint while the grace period runs
        raise SIGTERMException()

    def on_exception(self, trainer: "pl.Trainer", *_: Any, **__: Any) -> None:
        # Lightning's own SIGTERM path (a signal before on_train_start); never on other errors, where the
        # ranks may be out of step and the state half-updated.
        exception = _[1] if len(_) > 1 else __.get("exception")
        if isinstance(exception, SIGTERMException) and not trainer.sanity_checking:
            self._save(trainer, reason="SIGTERMException")
        self._restore_handler()

    def _save(self, trainer: "pl.Trainer", reason: str) -> None:
        if self._saved_step == trainer.global_step or self.ckpt_path is None:
            return
        trainer.save_checkpoint(self.ckpt_path, weights_only=False)
        self._saved_step = trainer.global_step
        self.saved_path = self.ckpt_path
        checkpoint = trainer.checkpoint_callback
        if (isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath
                and Path(checkpoint.dirpath) == Path(self.dirpath)):
            checkpoint.last_model_path = self.ckpt_path  # its own next "last" overwrites this one
        rank_zero_info(f"{reason}: saved {self.ckpt_path} at step {trainer.global_step}; stopping")

    def teardown(self, trainer: "pl.Trainer", *_: Any, **__: Any) -> None:
        self._restore_handler()  # keep the checkpoint (OnExceptionCheckpoint would delete it)

    def state_dict(self) -> dict[str, Any]:
        return {}
