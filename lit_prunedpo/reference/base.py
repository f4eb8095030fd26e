"""The seam between the training step and the frozen reference: :class:`ReferenceSource` and what it is handed.

A source returns, for every row group of a plan, the reference log-probs at exactly the group's scored
positions of exactly its executed prefixes. Its lifecycle, in call order:

1. ``configure(policy, scorer)``: once, in ``PrunedDPO.__init__``, with the freshly built policy (to copy it)
   and the module's scorer (so that a memory-efficient scorer serves the reference too).
2. ``prepare(policy, data, runtime)``: on every process at set-up (``PrunedDPO.setup``, or
   ``lit-prunedpo-cache``), with the policy still at its initial weights, the run's pairs (a
   :class:`ReferenceData`, already set up, or ``None``) and a :class:`ReferenceRuntime` (device, ranks,
   precision). A source that needs the pairs (a cache) reads them here; it never sets up or drives the data.
3. ``shard(mesh)``: under a device mesh (FSDP2), shards the frozen models the source owns (:meth:`models`).
4. every step, the step's executor (:class:`lit_prunedpo.step.execute.StepExecutor`)
   asks :meth:`~ReferenceSource.online_model`: a source that runs a frozen model hands it over (with its scorer) and the
   executor runs it on the policy's layout, one no-grad forward of every row of the plan; any other source answers
   ``token_logps(batch, plan)``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.distributed import shard_causal_lm
from lit_prunedpo.step.plan import StepPlan
from lit_prunedpo.scoring import TokenScorer


@runtime_checkable
class ReferenceData(Protocol):
    """What a source that precomputes reference log-probs needs from the data: which pairs, and what they depend on.

    ``PreferenceDataModule`` and ``SyntheticPreferenceData`` implement it; any data module may, by defining the
    two methods (no base class to inherit).
    """

    def cache_fingerprint(self) -> dict[str, Any]:
        """A JSON-able description of everything that changes the pairs (source, splits, tokenizer, lengths...)."""

    def reference_batches(self, batch_size: int | None = None) -> Iterable[PreferenceBatch]:
        """Every training and validation pair once, unshuffled, with ``index`` unique across the splits."""


def _no_barrier(name: str) -> None:
    """One process has no peers to wait for."""


def _one_process(obj: Any) -> list[Any]:
    """One process's objects are its own."""
    return [obj]


def _all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``torch.distributed.all_gather_object`` on the default group); this
    process's alone while no process group is up (a strategy configured for several devices but not launched)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


@dataclass
class ReferenceRuntime:
    """Where a source's set-up runs: device, peers and precision. The defaults are one process on the CPU in
    full precision (a module used without a trainer).

    Args:
        device: the device this process computes on.
        root_dir: the run's directory (where a cache goes by default).
        precision: the trainer's precision, as Lightning names it (``32-true``, ``bf16-mixed``...).
        forward_context: a context factory every forward runs under (the precision plugin's autocast).
        world_size: processes in the run.
        rank: this process's global rank.
        barrier: waits until every process calls it with the same name.
        gather: every process's (picklable) object, in rank order; every process calls it.
    """

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    root_dir: str = "."
    precision: str = "32-true"
    forward_context: Callable[[], ContextManager] = contextlib.nullcontext
    world_size: int = 1
    rank: int = 0
    barrier: Callable[[str], None] = _no_barrier
    gather: Callable[[Any], list[Any]] = _one_process

    @classmethod
    def of(cls, trainer: Any | None) -> "ReferenceRuntime":
        """The runtime of a ``lightning.Trainer``'s strategy; the defaults when ``trainer`` is ``None``."""
        if trainer is None:
            return cls()
        strategy = trainer.strategy
        plugin = strategy.precision_plugin
        return cls(
            device=strategy.root_device,
            root_dir=str(trainer.default_root_dir),
            precision=str(plugin.precision),
            forward_context=plugin.forward_context,
            world_size=int(strategy.world_size),
            rank=int(strategy.global_rank),
            barrier=strategy.barrier,
            gather=_all_gather_objects if int(strategy.world_size) > 1 else _one_process,
        )


class ReferenceSource(nn.Module, ABC):
    """Reference log-probs for the scored positions of a plan. An ``nn.Module`` so that Lightning moves whatever
    state it holds. Subclasses implement :meth:`token_logps`; every other step of the lifecycle has a default."""

    def configure(self, policy: nn.Module, scorer: TokenScorer) -> None:
        """Called once in ``PrunedDPO.__init__`` with the freshly built policy and the module's scorer."""

    def prepare(self, policy: nn.Module, data: ReferenceData | None, runtime: ReferenceRuntime) -> None:
        """Called on every process at set-up, before any checkpoint loads (``policy`` has its initial weights).

        Args:
            policy: the policy (e.g. to compute a cache from).
            data: the run's pairs, set up; ``None`` when the trainer has no data module.
            runtime: device, ranks and precision of this process.
        """

    def models(self) -> list[nn.Module]:
        """The frozen models this source owns and runs (none by default): what :meth:`shard` shards and what
        the shared-prompt attention check inspects."""
        return []

    def shard(self, mesh: Any) -> None:
        """Shard :meth:`models` with FSDP2 over the 1-D data-parallel ``mesh`` (``PrunedDPO.configure_model``),
        so that a frozen model costs ``1/N`` of a replica per rank."""
        for model in self.models():
            shard_causal_lm(model, mesh, reshard_after_forward=True)

    @abstractmethod
    def token_logps(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        """One ``[K_g]`` tensor per group of ``plan``, aligned with the group's scored positions."""

    def token_lse(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        """The reference's log-sum-exp over the vocabulary at every scored position of every group of ``plan``, one
        ``[K_g]`` tensor per group: the baseline of :class:`~lit_prunedpo.samplers.ReferenceLogSumExp`. Only a source
        that has them at no cost can give them (a cache that stores them); the default refuses
        (:meth:`check_token_lse`)."""
        self.check_token_lse()
        raise NotImplementedError(f"{type(self).__name__}.check_token_lse accepts, but token_lse is not implemented")

    def check_token_lse(self) -> None:
        """Raise ``ValueError`` naming the fix unless :meth:`token_lse` can answer (called at set-up, before any step).
        The default refuses: a reference that runs a model would run its whole LM head at every executed position."""
        raise ValueError(
            f"ReferenceLogSumExp needs the reference's log-sum-exp at every executed position, which "
            f"{type(self).__name__} cannot give without running its whole LM head there (what position pruning "
            "skips): use the cached reference (model.reference: lit_prunedpo.reference.CachedReference), or the "
            "ExactTargetLogits estimator, which works with any reference"
        )

    def online_model(self) -> ContextManager[tuple[nn.Module, TokenScorer]] | None:
        """For a source that scores a frozen model on the step's own inputs: a context that yields ``(model,
        scorer)`` while the step's executor runs the reference forward. ``None`` (default): the executor calls
        :meth:`token_logps` instead."""
        return None
