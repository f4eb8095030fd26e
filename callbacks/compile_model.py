"""``torch.compile`` as a callback: the policy's and an online reference's bodies compiled before the first step, and
the graphs compiled since logged every step, so that recompilation under changing shapes shows in the logs.

Why a callback and not a module argument: compiling is a choice about how to run a model, not about the objective,
and Lightning's own advice is to compile after the strategy has wrapped and sharded the model (FSDP2's
``fully_shard`` per layer), which ``on_fit_start`` follows (``configure_model`` and the strategy's set-up run
before it). What is compiled and why: :mod:`lit_prunedpo.compiling`. In a config::

    trainer:
      callbacks:
        - class_path: lit_prunedpo.callbacks.CompileModel
          init_args: {dynamic: true, recompile_limit: 8}
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lit_prunedpo.compiling import CompileOptions, compile_bodies, graphs_compiled


class CompileModel(Callback):
    """Compile the bodies of the module's policy and online reference once, when fit, validate or predict starts,
    after the module's layout is resolved (its conformance probe runs eagerly, once).

    Logs ``compile/graphs`` each training step: the graphs compiled since this callback compiled the bodies (a
    number that stops growing after the first steps when shapes are handled dynamically). A count still growing after
    ``warn_after_steps`` steps is warned about once, naming the count: each new graph is a compile paid during training.

    Args: ``backend``, ``mode``, ``dynamic``, ``fullgraph``, ``recompile_limit`` as
    :class:`~lit_prunedpo.compiling.CompileOptions`; ``warn_after_steps``: the step after which a new graph is warned.

    Raises:
        ValueError: for options :class:`~lit_prunedpo.compiling.CompileOptions` refuses, or ``warn_after_steps < 1``.
    """

    def __init__(self, backend: str = "inductor", mode: str | None = None, dynamic: bool | None = True,
                 fullgraph: bool = False, recompile_limit: int = 8, warn_after_steps: int = 10) -> None:
        super().__init__()
        self.options = CompileOptions(backend, mode, dynamic, fullgraph, recompile_limit)
        if not (isinstance(warn_after_steps, int) and warn_after_steps >= 1):
            raise ValueError(f"CompileModel warn_after_steps: an integer >= 1, got {warn_after_steps!r}")
        self.warn_after_steps = warn_after_steps
        self._graphs_before: int | None = None
        self._graphs_at_warn_step: int | None = None
        self._warned = False

    def _compile(self, pl_module: pl.LightningModule) -> None:
        if self._graphs_before is not None:
            return
        models = [pl_module.policy, *pl_module.reference.models()]
        self._graphs_before = graphs_compiled()
        bodies = compile_bodies(models, self.options, before=pl_module.resolved_layout)
        rank_zero_info(f"CompileModel: {len(bodies)} model bod{'y' if len(bodies) == 1 else 'ies'} compiled "
                       f"({', '.join(f'{k}={v}' for k, v in self.options.kwargs().items())}, "
                       f"recompile_limit={self.options.recompile_limit}); the first steps pay the compilation")

    @property
    def graphs(self) -> int:
        """Graphs compiled since the bodies were (0 before)."""
        return 0 if self._graphs_before is None else graphs_compiled() - self._graphs_before

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._compile(pl_module)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._compile(pl_module)

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._compile(pl_module)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        graphs = self.graphs
        pl_module.log("compile/graphs", float(graphs), on_step=True, on_epoch=False, sync_dist=False)
        step = trainer.global_step
        if step == self.warn_after_steps:
            self._graphs_at_warn_step = graphs
        elif (step > self.warn_after_steps and not self._warned and self._graphs_at_warn_step is not None
              and graphs > self._graphs_at_warn_step):
            self._warned = True
            rank_zero_warn(f"CompileModel: {graphs - self._graphs_at_warn_step} graph(s) compiled after step "
                           f"{self.warn_after_steps} (now {graphs}): shapes are still recompiling; run with "
                           "TORCH_LOGS=recompiles to see why, or set dynamic=true")
