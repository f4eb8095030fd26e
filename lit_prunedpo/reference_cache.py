"""A cached, per-token reference: ``log pi_ref`` of every response token of every pair, computed once, on disk.

TRL caches one sum per response, which cannot serve a pruned step: the estimator needs the reference at
exactly the scored positions of exactly the executed prefixes. This cache keeps *every* response token
(chosen and rejected) of every training and validation pair, so a step of any pruning mode gathers its
positions from it, and the reference model is never loaded while training.

Pieces, in the order data flows:

* :func:`compute_reference_logps` (in :mod:`~lit_prunedpo.reference_store`) runs the reference once, under
  ``no_grad``, through the same :func:`~lit_prunedpo.plan.plan_step` (full prefixes, all positions, both branches),
  :func:`~lit_prunedpo.scoring.group_inputs` and :class:`~lit_prunedpo.scoring.TokenScorer` as
  :class:`~lit_prunedpo.reference.OnlineReference`, so the values are what the online reference computes.
* :class:`ReferenceLogpStore` (same module) holds them flat (``values`` float32 ``[total_tokens]``) with per
  (row, branch) ``offsets``/``lengths`` and the sorted dataset keys (``batch.index``), and gathers at any positions.
* :class:`CachedReference` is the :class:`~lit_prunedpo.reference.ReferenceSource`: at ``setup`` it loads
  the file when its fingerprint matches the run, builds it otherwise (rank-sharded under DDP), and refuses
  a stale, non-finite or misshapen one, naming what is wrong.

**Storage.** One safetensors file: ``values`` float32 (4 bytes, i.e. **4 MB per million response tokens**),
plus ``keys`` ``[N]``, ``offsets`` and ``lengths`` ``[N, 2]`` int64 (40 bytes per pair: +0.4 MB per
million tokens at HH-RLHF lengths, ~94 response tokens a pair). The fingerprint is a JSON string in the
file's metadata.
``examples/measure_cache.py`` measures size, build time and step time.

**The data protocol.** The cache asks the data module for two things:

* ``datamodule.cache_fingerprint() -> dict``: a JSON-able description of everything that changes the pairs
  (source, splits, tokenizer and a hash of it, max lengths, chat template, ``datasets`` fingerprints...);
* ``datamodule.reference_batches(batch_size=None) -> Iterable[PreferenceBatch]``: every training and
  validation pair once, in any order, unshuffled, with ``index`` unique across the splits.

``SyntheticPreferenceData`` and ``PreferenceDataModule`` implement both.

**Fingerprint.** ``data`` (the above), ``reference`` (the model source's arguments, or "the policy's initial
weights", and a BLAKE2 hash of the weights), ``scorer``, ``precision`` and the format version. Hashing
weights reads every parameter once at set-up (about 1 s per GB); a ``ModelSource`` reference is built at
set-up for that, then freed.

Departures from the online reference, and how they are handled:

* Values agree with the online reference up to float round-off (different batch composition and padding
  change the matmul shapes), not bitwise: about 1e-7 in float32; the tests use ``atol=1e-6``.
* Mixed precision: the build runs under the trainer's precision context (autocast), as the online
  reference would; with ``*-true`` half precisions the policy is still float32 at set-up, so the cache then
  holds float32 log-probs (more exact than the online reference would be).
* Multi-node training needs ``path`` on a file system every node sees.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Mapping

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.lora import adapters_off
from lit_prunedpo.models import ModelSource
from lit_prunedpo.plan import StepPlan
from lit_prunedpo.reference import ReferenceSource
from lit_prunedpo.reference_store import (  # noqa: F401  (re-exported: the documented API lives here)
    FORMAT,
    VERSION,
    ReferenceLogpStore,
    compute_reference_logps,
    model_device,
    read_fingerprint,
)
from lit_prunedpo.scoring import TokenScorer

DEFAULT_FILENAME = "reference_logps.safetensors"


# --------------------------------------------------------------------------------------------- fingerprints
def weights_hash(model: nn.Module) -> str:
    """BLAKE2b of every state-dict tensor's name, dtype, shape and bytes (the weights' identity)."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _jsonable(value: Any) -> Any:
    """``value`` made JSON-able: containers recursively, anything else by ``str``."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def reference_identity(source: ModelSource | None, model: nn.Module) -> dict[str, Any]:
    """The reference part of a fingerprint: where the model comes from and its weights' hash."""
    if source is None:
        origin: dict[str, Any] = {"source": "policy initial weights", "class": type(model).__name__}
    else:
        origin = {"source": f"{type(source).__module__}.{type(source).__qualname__}", "args": _jsonable(vars(source))}
    return {**origin, "weights": weights_hash(model)}


_ABSENT = object()


def fingerprint_diff(cached: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted fields whose values differ, each as ``field (cache: X, now: Y)``; a sub-dict present on
    one side only is one field."""

    def show(v: Any) -> str:
        if v is _ABSENT:
            return "<absent>"
        text = json.dumps(v, sort_keys=True)
        return text if len(text) <= 80 else text[:77] + "..."

    out = []
    for key in sorted(set(cached) | set(current)):
        a, b = cached.get(key, _ABSENT), current.get(key, _ABSENT)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(fingerprint_diff(a, b, f"{prefix}{key}."))
        elif a != b:
            out.append(f"{prefix}{key} (cache: {show(a)}, now: {show(b)})")
    return out


# ------------------------------------------------------------------------------------ the data protocol
def cache_fingerprint(datamodule: Any) -> dict[str, Any]:
    """``datamodule.cache_fingerprint()``, made JSON-able.

    Raises:
        TypeError: the data module does not implement the protocol.
    """
    if not hasattr(datamodule, "cache_fingerprint"):
        raise TypeError(_protocol_error(datamodule, "cache_fingerprint()"))
    return _jsonable(datamodule.cache_fingerprint())


def reference_batches(datamodule: Any, batch_size: int | None = None) -> Iterable[PreferenceBatch]:
    """``datamodule.reference_batches(batch_size)``.

    Raises:
        TypeError: the data module does not implement the protocol.
    """
    if not hasattr(datamodule, "reference_batches"):
        raise TypeError(_protocol_error(datamodule, "reference_batches(batch_size)"))
    return datamodule.reference_batches(batch_size)


def _protocol_error(datamodule: Any, method: str) -> str:
    return (
        f"CachedReference needs the data module to implement {method}; {type(datamodule).__name__} does not "
        "(see lit_prunedpo.reference_cache: cache_fingerprint() and reference_batches(batch_size))"
    )


# ------------------------------------------------------------------------------------- the seam
@dataclass
class _Runtime:
    """What a build needs from the run: where it runs, with how many peers, under which precision."""

    device: torch.device
    root_dir: str
    precision: str
    forward_context: Callable[[], ContextManager]
    world_size: int = 1
    rank: int = 0
    barrier: Callable[[str], None] = lambda name: None

    @classmethod
    def of(cls, trainer: L.Trainer) -> "_Runtime":
        strategy = trainer.strategy
        plugin = strategy.precision_plugin
        return cls(
            device=strategy.root_device,
            root_dir=str(trainer.default_root_dir),
            precision=str(plugin.precision),
            forward_context=plugin.forward_context,
            world_size=int(strategy.world_size),
            rank=int(strategy.global_rank),
            barrier=lambda name: strategy.barrier(name),
        )


class CachedReference(ReferenceSource):
    """Reference log-probs gathered from an on-disk per-token cache: no reference model runs while training.

    Args:
        path: the safetensors cache file; ``None`` is ``<trainer.default_root_dir>/reference_logps.safetensors``.
        model: the reference model to cache; ``None`` is the policy's initial weights (``module.policy`` at
            set-up, before any checkpoint loads).
        recompute: rebuild the cache even when one exists (also when its fingerprint differs).
        batch_size: pairs per forward pass while building.

    Raises:
        ValueError: on ``batch_size < 1``; at set-up, on a stale cache (naming the differing fields), a
            non-finite one or one whose rows/lengths do not match the data.

    Example (build ahead of time, then train; both read the same config)::

        lit-prunedpo-cache --config configs/cached.yaml
        lit-prunedpo fit --config configs/cached.yaml
    """

    def __init__(
        self, path: str | None = None, model: ModelSource | None = None, recompute: bool = False, batch_size: int = 16
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"CachedReference: batch_size must be >= 1, got {batch_size!r}")
        self.path = path
        self.source = model
        self.recompute = recompute
        self.batch_size = batch_size
        self.scorer = TokenScorer()
        self.store: ReferenceLogpStore | None = None  # a plain attribute: never moved to GPU, never checkpointed
        self.builds = 0  # how many times this source computed the cache (tests, logs)

    @classmethod
    def from_store(cls, store: ReferenceLogpStore) -> "CachedReference":
        """A source serving ``store`` as is: ``prepare`` neither loads nor checks anything."""
        ref = cls()
        ref.store = store
        return ref

    def configure(self, policy: nn.Module, scorer: TokenScorer) -> None:
        """Nothing to do: no copy of the policy is kept (the cache replaces it)."""

    def resolve_path(self, root_dir: str) -> Path:
        """The cache file: ``path``, or the default name under ``root_dir``."""
        return Path(self.path).expanduser() if self.path is not None else Path(root_dir) / DEFAULT_FILENAME

    # -- set-up --------------------------------------------------------------------------------------
    def prepare(self, module: L.LightningModule, stage: str) -> None:
        """Load the cache if its fingerprint matches the run, else build it (sharded over ranks); see :meth:`ensure`."""
        if self.store is not None:
            return  # from_store, or an earlier stage of this process (the policy may have trained since)
        datamodule = getattr(module.trainer, "datamodule", None)
        if datamodule is None:
            raise ValueError(
                "CachedReference needs a LightningDataModule (implementing cache_fingerprint() and "
                "reference_batches()) passed to the trainer, to know which pairs to cache"
            )
        self.ensure(module.policy, datamodule, _Runtime.of(module.trainer))

    def ensure(self, policy: nn.Module, datamodule: Any, runtime: _Runtime) -> ReferenceLogpStore:
        """Load, or build and save, the cache for ``datamodule`` and this reference; returns the store.

        Every rank calls this. A build runs every ``world_size``-th batch on each rank, writes
        ``<path>.rank<r>``; rank 0 merges the shards into ``path``; then every rank loads it.

        Raises:
            ValueError: a stale cache without ``recompute``, or a cache failing its checks.
        """
        path = self.resolve_path(runtime.root_dir)
        model = self.source.build() if self.source is not None else policy
        fingerprint = {
            "version": VERSION,
            "data": cache_fingerprint(datamodule),
            "reference": reference_identity(self.source, model),
            "scorer": f"{type(self.scorer).__module__}.{type(self.scorer).__qualname__}",
            "precision": runtime.precision,
        }
        if path.exists() and not self.recompute:
            cached = read_fingerprint(path)
            if cached != fingerprint:
                differ = "; ".join(fingerprint_diff(cached, fingerprint))
                raise ValueError(
                    f"reference cache {path} is stale: it was built for a different run. Fields that differ: "
                    f"{differ}. Delete it, point model.reference.init_args.path elsewhere, or rebuild it with "
                    "model.reference.init_args.recompute=true"
                )
        else:
            self._build(model, datamodule, fingerprint, path, runtime)
        del model  # a ModelSource reference is freed here; the policy is only borrowed
        if runtime.device.type == "cuda":
            torch.cuda.empty_cache()
        store = ReferenceLogpStore.load(path)
        index, lengths = _data_rows(datamodule, self.batch_size)
        store.check_against(index, lengths, what=f"the data module's pairs ({type(datamodule).__name__})")
        self.store = store
        return store

    def _build(self, model: nn.Module, datamodule: Any, fingerprint: dict[str, Any], path: Path, runtime: _Runtime) -> None:
        start = time.perf_counter()
        original_device = model_device(model)
        batches = (
            b for i, b in enumerate(reference_batches(datamodule, self.batch_size))
            if i % runtime.world_size == runtime.rank
        )
        model.to(runtime.device)
        try:
            with adapters_off(model):  # a LoRA policy's reference is its base model
                shard = compute_reference_logps(model, batches, self.scorer, runtime.forward_context)
        finally:
            model.to(original_device)  # the policy goes back where the strategy expects to find it
        self.builds += 1
        shard.fingerprint = fingerprint
        if runtime.world_size == 1:
            shard.save(path)
        else:
            shard.save(_shard_path(path, runtime.rank))
            runtime.barrier("lit_prunedpo.reference_cache.shards")
            if runtime.rank == 0:
                shards = [_shard_path(path, r) for r in range(runtime.world_size)]
                ReferenceLogpStore.merge(ReferenceLogpStore.load(p) for p in shards).save(path)
                for p in shards:
                    p.unlink()
            runtime.barrier("lit_prunedpo.reference_cache.merged")
        if runtime.rank == 0:
            rank_zero_info(
                f"reference cache: built {path} in {time.perf_counter() - start:.1f}s ({path.stat().st_size / 1e6:.2f} MB)"
            )

    # -- the step ------------------------------------------------------------------------------------
    def token_logps(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        """Gather each group's scored positions; refuses a batch whose lengths differ from the cache's."""
        if self.store is None:
            raise RuntimeError(
                "CachedReference has no cache: prepare() runs at trainer set-up (or use CachedReference.from_store)"
            )
        index = batch.index.cpu()
        cached = self.store.lengths_of(index)
        actual = batch.response_lengths.cpu()
        if not torch.equal(cached, actual):
            i = int((cached != actual).any(-1).nonzero()[0])
            raise ValueError(
                f"reference cache {self.store.source}: pair {int(index[i])} has response lengths "
                f"{cached[i].tolist()} in the cache but {actual[i].tolist()} in the batch; rebuild it (recompute=True)"
            )
        device = batch.prompt_ids.device
        out = []
        for group in plan.groups:
            row = group.scored_row.cpu()
            values = self.store.gather(index[group.pair.cpu()][row], group.branch.cpu()[row], group.scored_t.cpu())
            out.append(values.to(device, non_blocking=True))
        return out

    def tokens_executed(self, plan: StepPlan) -> int:
        return 0


def _shard_path(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.name}.rank{rank}")


def _data_rows(datamodule: Any, batch_size: int) -> tuple[Tensor, Tensor]:
    """``index [n]`` and ``response_lengths [n, 2]`` of every pair the data module will serve."""
    index, lengths = [], []
    for batch in reference_batches(datamodule, batch_size):
        index.append(batch.index.cpu())
        lengths.append(batch.response_lengths.cpu())
    return torch.cat(index), torch.cat(lengths)
