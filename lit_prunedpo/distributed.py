"""Multi-process training helpers: FSDP2 sharding of the policy and the online reference, a strategy that
shards over every process (its checkpoint folders written atomically, its loads naming the checkpoint they could
not read), the ranks' agreement on a sharded step's forwards, and the teardown of the process groups at the end of
a process. How checkpoints are written, checked and resumed from is :mod:`lit_prunedpo.checkpoint`.

Why the sharding units are what they are: :class:`~lit_prunedpo.scoring.TokenScorer` never calls the root
``*ForCausalLM`` forward; it calls the body (``model.base_model``) and the LM head
(``model.get_output_embeddings()``) separately. FSDP2 all-gathers a unit's parameters in that unit's forward
pre-hook, so every unit must be a module that is *called*: each decoder layer, the body (embeddings and final
norm) and the head. Tied embeddings (one weight shared by the input embedding and the head) must live in one
unit; they are grouped with ``fully_shard([body, head])`` under a parameter-less root.
"""

from __future__ import annotations

import gc
import warnings
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from lit_prunedpo.checkpoint.io import remove, replace_folder, sharded_save_names
from lit_prunedpo.step.plan import StepPlan
from lit_prunedpo.scoring import split_causal_lm

__all__ = [
    "FSDP2Strategy",
    "agree_on_forwards",
    "decoder_layers",
    "destroy_process_groups",
    "is_sharded",
    "shard_causal_lm",
    "shard_pruned_dpo",
]


# ------------------------------------------------------------------------------------------ sharding
def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a ``transformers`` causal LM, in order.

    Found by the classes named in ``model._no_split_modules`` (what ``transformers`` itself uses for
    device maps), else as the children of the body's ``layers`` or ``h`` ``ModuleList``.

    Raises:
        ValueError: when neither finds any layer.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        body = getattr(model, "base_model", model)
        for attr in ("layers", "h"):
            stack = getattr(body, attr, None)
            if isinstance(stack, nn.ModuleList) and len(stack):
                layers = list(stack)
                break
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(model).__name__}: no module of the classes in "
            f"_no_split_modules={sorted(names)} and no `layers`/`h` ModuleList in its body"
        )
    return layers


def is_sharded(model: nn.Module) -> bool:
    """Whether ``fully_shard`` was already applied to ``model`` or one of its submodules."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def _tied(body: nn.Module, head: nn.Module, model: nn.Module) -> bool:
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head_params = {id(p) for p in head.parameters()}
    return embed is not None and any(id(p) in head_params for p in embed.parameters())


def shard_causal_lm(model: nn.Module, mesh: Any, *, reshard_after_forward: bool = True) -> nn.Module:
    """Apply FSDP2 (``fully_shard``) to a causal LM in units that the scorer calls: each decoder layer, the
    body (embeddings + final norm) and the LM head; body and head form one unit when their weights are tied.

    Works for frozen models too (the online reference: its forward only all-gathers, nothing is reduced).
    Idempotent: an already sharded model is returned unchanged.

    Args:
        model: a ``transformers`` ``*ForCausalLM``.
        mesh: a 1-D data-parallel ``DeviceMesh``.
        reshard_after_forward: free the gathered parameters after each unit's forward (FSDP's ZeRO-3);
            ``False`` keeps them until backward (ZeRO-2-like: more memory, fewer all-gathers).
    """
    from torch.distributed.fsdp import fully_shard

    if is_sharded(model):
        return model
    body, head = split_causal_lm(model)
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    if not _tied(body, head, model):
        fully_shard(body, **kwargs)
        fully_shard(head, **kwargs)
        return model
    # Tied weights: one unit for body and head, under the (never called) root, which must be initialised
    # here because the first forward to run (the body's) belongs to a multi-module unit that cannot be root.
    fully_shard([body, head], **kwargs)
    fully_shard(model, **kwargs)
    state = getattr(model, "_get_fsdp_state", lambda: None)()
    lazy_init = getattr(state, "_lazy_init", None)
    if lazy_init is None:  # pragma: no cover - depends on the torch version
        raise RuntimeError(
            f"{type(model).__name__} has tied input/output embeddings, which need torch's FSDP2 internals "
            f"(FSDPState._lazy_init) that torch {torch.__version__} lacks; untie them "
            "(config tie_word_embeddings: false) or train with DDP"
        )
    lazy_init()
    return model


class ShardsItsModels(Protocol):
    """A reference source, as sharding sees it (``lit_prunedpo.reference.ReferenceSource.shard``)."""

    def shard(self, mesh: Any) -> None: ...


def shard_pruned_dpo(policy: nn.Module, reference: ShardsItsModels, mesh: Any, *,
                     reshard_after_forward: bool = True) -> None:
    """Shard ``policy``, then let the reference source shard the frozen models it owns
    (:meth:`~lit_prunedpo.reference.ReferenceSource.shard`: an ``OnlineReference``'s model, so a frozen
    reference costs ``1/N`` of a replica per rank; a cached reference has nothing to shard).

    Args:
        policy: a ``PrunedDPO``'s policy.
        reference: its reference source.
        mesh: the strategy's device mesh: a 1-D mesh, or a 2-D one with dimensions ``data_parallel`` and
            ``tensor_parallel`` of size 1 (``ModelParallelStrategy``'s).

    Raises:
        ValueError: on a tensor-parallel size other than 1 (not supported).
    """
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if "tensor_parallel" in names and mesh["tensor_parallel"].size() != 1:
        raise ValueError(
            "lit_prunedpo shards with FSDP2 only: tensor_parallel_size must be 1, got "
            f"{mesh['tensor_parallel'].size()} (use lit_prunedpo.distributed.FSDP2Strategy, or "
            "ModelParallelStrategy(tensor_parallel_size=1))"
        )
    dp_mesh = mesh["data_parallel"] if "data_parallel" in names else mesh
    shard_causal_lm(policy, dp_mesh, reshard_after_forward=reshard_after_forward)
    reference.shard(dp_mesh)


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as plain FSDP2: one data-parallel dimension over every process
    of every node (``tensor_parallel_size=1``), so ``--trainer.devices`` and ``--trainer.num_nodes`` alone
    size it. Loading a missing or unreadable checkpoint raises an error that names it. A second
    ``fit``/``validate``/``test`` with the same trainer keeps the device mesh (and its process groups) of the first.

    Args:
        save_distributed_checkpoint: each rank writes its shard into a checkpoint *folder* (default);
            ``False`` gathers full weights on rank 0 into one file.
        process_group_backend: ``nccl`` / ``gloo``; ``None`` picks by device.
        timeout: collective timeout.
    """

    def __init__(self, save_distributed_checkpoint: bool = True, process_group_backend: str | None = None,
                 timeout: Any = None) -> None:
        from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

        super().__init__(
            data_parallel_size="auto", tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=default_pg_timeout if timeout is None else timeout,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        if self._device_mesh is None:
            super().setup_environment()
            return
        # A second fit/validate/test on this strategy. Lightning would build a new device mesh and drop the old
        # one; the old mesh's gloo process groups are then destroyed whenever the garbage collector gets to them,
        # which now and then aborts the process ("terminate called without an active exception"). The process
        # group and the world are the same as before, so the mesh is kept.
        super(ModelParallelStrategy, self).setup_environment()
        self._setup_distributed()
        self.lightning_module._device_mesh = self._device_mesh

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Write a sharded checkpoint folder atomically: every rank writes its shards into a temporary sibling
        folder, and once all have finished, rank 0 renames it into place. A crash mid-save leaves the previous
        ``path`` whole (and a temporary folder, which :func:`~lit_prunedpo.checkpoint.resolve_resume`
        names and ignores), never a torn folder under the name a resume looks for. Single-file saves
        (``save_distributed_checkpoint=False``) go through the checkpoint IO as usual."""
        path = Path(self.broadcast(filepath))
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, path, storage_options)
        tmp, old = sharded_save_names(path)
        if self.global_rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove(tmp)  # left by a save that was killed
        self.barrier("lit_prunedpo_save_start")
        super().save_checkpoint(checkpoint, tmp, storage_options)
        # Rank 0 writes Lightning's meta.pt after the shards; every rank's shards are complete only here.
        self.barrier("lit_prunedpo_save_written")
        if self.global_rank == 0:
            replace_folder(tmp, path, old)
        self.barrier("lit_prunedpo_save_renamed")

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(checkpoint_path))
        if not path.exists():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        try:
            return super().load_checkpoint(path, weights_only=weights_only)
        except Exception as err:
            raise RuntimeError(f"cannot load checkpoint {path} (missing shards or corrupt?): {err}") from err


# ------------------------------------------------------------------------------------- teardown
def destroy_process_groups() -> None:
    """Destroy the process groups and free them now, not during interpreter shutdown. Call it last in a process.

    ``torch.distributed.destroy_process_group`` shuts the groups down, but a group object that is still referenced
    when the interpreter exits is freed during the shutdown, and with gloo that aborts a process whose run ended
    fine now and then ("terminate called without an active exception", exit status -6). Device meshes hold their
    groups (``DeviceMesh._pg_registry``) and DTensor's sharding caches hold the meshes for the life of the process
    (every FSDP2 run leaves some), so the meshes still alive let go of their groups here. Measured with torch 2.13,
    two gloo processes and a 2-D mesh alive at exit: 12 of 28 launches aborted after ``destroy_process_group``,
    0 of 28 after this. Does nothing when no process group is initialized.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    from torch.distributed.device_mesh import DeviceMesh

    dist.destroy_process_group()
    gc.collect()  # runs, modules and FSDP states in reference cycles free their groups while the interpreter is whole
    with warnings.catch_warnings():
        # isinstance on torch's deprecated torch.distributed.reduce_op object, one of the objects listed, would warn
        # "reduce_op is deprecated" at the end of every multi-process run: code of neither the user nor this package
        warnings.simplefilter("ignore", FutureWarning)
        for obj in gc.get_objects():
            if isinstance(obj, DeviceMesh) and isinstance(getattr(obj, "_pg_registry", None), dict):
                obj._pg_registry.clear()


# ------------------------------------------------------------------------ same forwards on all ranks
def group_signature(plan: StepPlan) -> tuple[bool, bool]:
    """``(has a gradient group, has a no-grad group)``."""
    return any(g.requires_grad for g in plan.groups), any(not g.requires_grad for g in plan.groups)


def agree_on_forwards(strategy: Any) -> Callable[[tuple[bool, bool]], tuple[bool, bool]]:
    """The ranks' agreement on which forwards a step runs, for :class:`~lit_prunedpo.step.execute.StepExecutor`'s
    ``agree``: FSDP's all-gathers and reduce-scatters pair up across ranks by call order, so one rank running a
    no-grad forward that another skips desyncs them.

    Every shipped branch sampler already gives every rank the same forwards (``BothBranches``: one gradient
    forward; ``RandomBranch``/``AntitheticBranch``: one gradient and one no-grad forward, since each pair has
    exactly one branch of each kind). A custom sampler may not; then the ranks agree (one all-reduce of two
    flags) and the executor runs a one-row placeholder forward that scores nothing where a rank has none.
    """
    import torch.distributed as dist

    def agree(local: tuple[bool, bool]) -> tuple[bool, bool]:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return local
        flags = torch.tensor([int(local[0]), int(local[1])], device=strategy.root_device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1])

    return agree
