"""A cached, per-token reference: ``log pi_ref`` of every response token of every pair, computed once, on disk.

TRL caches one sum per response, which cannot serve a pruned step: the estimator needs the reference at
exactly the scored positions of exactly the executed prefixes. This cache keeps *every* response token
(chosen and rejected) of every training and validation pair, so a step of any pruning mode gathers its
positions from it, and the reference model is never loaded while training.

Pieces, in the order data flows:

* :func:`~lit_prunedpo.reference.build.compute_reference_logps` (:mod:`lit_prunedpo.reference.build`) runs the
  reference once, under ``no_grad``, through the same :func:`~lit_prunedpo.step.plan.exact_plan` (full prefixes, all
  positions, both branches), :class:`~lit_prunedpo.scoring.TokenScorer` as
  :class:`~lit_prunedpo.reference.OnlineReference`, each response in its own right-padded row
  (:class:`~lit_prunedpo.layout.RightPaddedLayout`, exact for any causal LM), so the values are what the model's
  plain forward of each response alone computes. The LM head and its log-softmax run on ``LOGITS_PER_CHUNK``
  logits at a time (:func:`~lit_prunedpo.reference.build.score_in_chunks`), never on a whole batch's
  ``[tokens, vocabulary]``: at GPT-2's vocabulary those are gigabytes while the body needs megabytes.
* :class:`~lit_prunedpo.reference.store.ReferenceLogpStore` holds them flat (``values`` float32
  ``[total_tokens]``) with per (row, branch) ``offsets``/``lengths`` and the sorted dataset keys
  (``batch.index``), and gathers at any positions.
* :class:`CachedReference` is the :class:`~lit_prunedpo.reference.ReferenceSource`: at ``prepare`` it loads
  the file when its fingerprint (:mod:`~lit_prunedpo.reference.fingerprint`) matches the run, builds it
  otherwise (rank-sharded under DDP), and refuses a stale, non-finite or misshapen one, naming what is wrong.

**Storage.** One safetensors file: ``values`` float32 (4 bytes, i.e. **4 MB per million response tokens**),
``lse`` float32, the reference's log-sum-exp over the vocabulary at each token (another 4 MB per million: the
baseline of :class:`~lit_prunedpo.samplers.ReferenceLogSumExp`; ``z_t - logp_t``, the target logit one row of the
head, so the build's head runs once), plus ``keys`` ``[N]``, ``offsets`` and ``lengths`` ``[N, 2]`` int64 (40 bytes
per pair: +0.4 MB per million tokens at HH-RLHF lengths, ~94 response tokens a pair). The fingerprint is a JSON
string in the file's metadata. A file written before ``lse`` was stored loads as it is (every estimator but
``ReferenceLogSumExp`` works with it; that one is refused, naming the file and the fix: rebuild).
``lab/scripts/measure_cache.py`` measures size, build time and step time.

**The data.** ``prepare`` is handed the run's pairs as a :class:`~lit_prunedpo.reference.ReferenceData`
(``cache_fingerprint()`` and ``reference_batches(batch_size)``), already set up;
``SyntheticPreferenceData`` and ``PreferenceDataModule`` implement it.

Departures from the online reference, and how they are handled:

* Values agree with the online reference up to float round-off (different batch composition and padding
  change the matmul shapes), not bitwise: about 1e-7 in float32; the tests use ``atol=1e-6``.
* Mixed precision: the build runs under the trainer's precision context (autocast), as the online
  reference would; with ``*-true`` half precisions the policy is still float32 at set-up, so the cache then
  holds float32 log-probs (more exact than the online reference would be).
* Multi-node training needs ``path`` on a file system every node sees.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.lora import adapters_off
from lit_prunedpo.models import ModelSource
from lit_prunedpo.step.plan import StepPlan
from lit_prunedpo.reference.base import ReferenceData, ReferenceRuntime, ReferenceSource
# compute_reference_logps is looked up in this module when a cache is built: tests count the builds by replacing it here
from lit_prunedpo.reference.build import BuildProgress, compute_reference_logps, model_device
from lit_prunedpo.reference.fingerprint import (
    cache_file_name, fingerprint_diff, jsonable, reference_identity, template_fields,
)
from lit_prunedpo.reference.store import VERSION, ReferenceLogpStore, read_fingerprint
from lit_prunedpo.scoring import TokenScorer

DEFAULT_FILENAME = "reference_logps.safetensors"
#: The file a folder path names inside it: the reference model's name and 12 hex digits of the run's fingerprint.
FOLDER_TEMPLATE = "ref-{model}-{fingerprint}.safetensors"


class CachedReference(ReferenceSource):
    """Reference log-probs gathered from an on-disk per-token cache: no reference model runs while training.

    Args:
        path: the safetensors cache file, used and checked as named; or a template holding ``{fingerprint}`` (and
            ``{model}``), e.g. ``runs/cache/ref-{model}-{fingerprint}.safetensors``, which names one file per run's
            settings (12 hex digits of the fingerprint, the reference model's name), so another model, data set,
            tokenizer, length or precision gets another file and the same settings reuse theirs; or a folder (ending
            in ``/``, or an existing directory): ``FOLDER_TEMPLATE`` inside it. ``None`` is
            ``<trainer.default_root_dir>/reference_logps.safetensors``. The file chosen is :attr:`cache_path` once
            ``prepare`` ran, and a log line says which and why.
        model: the reference model to cache; ``None`` is the policy's initial weights (``module.policy`` at
            set-up, before any checkpoint loads).
        recompute: rebuild the cache even when one exists (also when its fingerprint differs).
        batch_size: pairs per forward pass while building: it sizes the body's activations only, since the LM head
            runs on ``LOGITS_PER_CHUNK`` logits at a time whatever the batch.

    Raises:
        ValueError: on ``batch_size < 1`` or a template with another placeholder or without ``{fingerprint}``; at
        set-up, on a stale cache (naming the differing fields), a
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
        if path is not None:
            template_fields(os.path.expanduser(path))  # a template's placeholders, checked before anything runs
        self.path = path
        self.source = model
        self.recompute = recompute
        self.batch_size = batch_size
        self.scorer = TokenScorer()
        self.store: ReferenceLogpStore | None = None  # a plain attribute: never moved to GPU, never checkpointed
        self.builds = 0  # how many times this source computed the cache (tests, logs)
        self.cache_path: Path | None = None  # the file prepare() chose (a template's name is known only then)

    @classmethod
    def from_store(cls, store: ReferenceLogpStore) -> "CachedReference":
        """A source serving ``store`` as is: ``prepare`` neither loads nor checks anything."""
        ref = cls()
        ref.store = store
        return ref

    def configure(self, policy: nn.Module, scorer: TokenScorer) -> None:
        """Nothing to do: no copy of the policy is kept (the cache replaces it)."""

    def path_template(self, root_dir: str) -> tuple[str, bool]:
        """The cache path as configured, and whether it is a template named by the fingerprint: ``path`` (a folder,
        one ending in ``/`` or an existing directory, is ``FOLDER_TEMPLATE`` inside it), or the default file under
        ``root_dir``."""
        if self.path is None:
            return str(Path(root_dir) / DEFAULT_FILENAME), False
        path = os.path.expanduser(self.path)
        if path.endswith(("/", os.sep)) or Path(path).is_dir():
            path = str(Path(path) / FOLDER_TEMPLATE)
        return path, bool(template_fields(path))

    def resolve_path(self, root_dir: str, fingerprint: Mapping[str, Any] | None = None,
                     model: nn.Module | None = None) -> Path:
        """The cache file: ``path``; a template's placeholders filled in from ``fingerprint`` and ``model``
        (:func:`~lit_prunedpo.reference.fingerprint.cache_file_name`); or the default name under ``root_dir``.

        Raises:
            ValueError: ``path`` is a template (or a folder) and ``fingerprint`` or ``model`` is not given.
        """
        template, derived = self.path_template(root_dir)
        if not derived:
            return Path(template)
        if fingerprint is None or model is None:
            raise ValueError(f"CachedReference: path {template!r} is named by the run's fingerprint, known once "
                             "prepare() has hashed the model and the data; the file chosen is cache_path after it")
        return Path(cache_file_name(template, fingerprint, model))

    def _fingerprint(self, model: nn.Module, data: ReferenceData, runtime: ReferenceRuntime) -> dict[str, Any]:
        """What the cache depends on; under DDP every rank's must be the same (it names and checks one file)."""
        fingerprint = {
            "version": VERSION,
            "data": jsonable(data.cache_fingerprint()),
            "reference": reference_identity(self.source, model),
            "scorer": f"{type(self.scorer).__module__}.{type(self.scorer).__qualname__}",
            "precision": runtime.precision,
        }
        if runtime.world_size > 1:
            ranks = runtime.gather(fingerprint)
            for rank, other in enumerate(ranks):
                if other != ranks[0]:  # every rank holds all of them, so every rank raises the same error
                    differ = "; ".join(fingerprint_diff(ranks[0], other, labels=("rank 0", f"rank {rank}")))
                    raise ValueError(
                        f"reference cache: rank {rank} computed another fingerprint than rank 0, so the ranks would "
                        f"not build or check the same cache. Fields that differ: {differ}. Every rank must start from "
                        "the same reference weights and data (seed the model, or load it from one file)"
                    )
        return fingerprint

    def _log_choice(self, path: Path, runtime: ReferenceRuntime, reuse: bool) -> None:
        """One line on rank 0: which file, why that name, and whether it is reused or built."""
        template, derived = self.path_template(runtime.root_dir)
        if derived:
            why = (f"named by the fingerprint of the reference model, data, tokenizer, lengths and precision "
                   f"(model.reference.init_args.path {template})")
        elif self.path is None:
            why = "the default file under trainer.default_root_dir (model.reference.init_args.path unset)"
        else:
            why = "the file model.reference.init_args.path names"
        if reuse:
            action = "found, with this run's fingerprint: reusing it"
        else:
            action = "recompute=true: rebuilding it" if self.recompute and path.exists() else "none yet: building it"
        rank_zero_info(f"reference cache: {path}, {why}; {action}")

    # -- set-up --------------------------------------------------------------------------------------
    def prepare(self, policy: nn.Module, data: ReferenceData | None, runtime: ReferenceRuntime) -> None:
        """Load the cache if its fingerprint matches the run, else build and save it; then check it against every
        pair ``data`` serves.

        Every rank calls this. A build runs every ``world_size``-th batch on each rank, writes
        ``<path>.rank<r>``; rank 0 merges the shards into ``path``; then every rank loads it. A source that
        already holds a store (:meth:`from_store`, or an earlier stage of this process, after which the policy
        may have trained) keeps it.

        Raises:
            ValueError: no ``data``; a stale cache without ``recompute``, or a cache failing its checks.
            TypeError: ``data`` does not implement :class:`~lit_prunedpo.reference.ReferenceData`.
            DiskFull: the disk filled while the cache (or a rank's shard) was written; nothing half-written is left
                under its name (:meth:`ReferenceLogpStore.save`).
        """
        if self.store is not None:
            return
        if data is None:
            raise ValueError(
                "CachedReference needs a LightningDataModule (implementing cache_fingerprint() and "
                "reference_batches()) passed to the trainer, to know which pairs to cache"
            )
        if not isinstance(data, ReferenceData):
            raise TypeError(
                f"CachedReference needs the data module to implement cache_fingerprint() and "
                f"reference_batches(batch_size) (lit_prunedpo.reference.ReferenceData); {type(data).__name__} does not"
            )
        model = self.source.build() if self.source is not None else policy
        fingerprint = self._fingerprint(model, data, runtime)  # hashes the weights: once per prepare
        path = self.resolve_path(runtime.root_dir, fingerprint, model)
        self.cache_path = path
        # decided once: under DDP another rank may write the file while this one is still on its way to the build
        reuse = path.exists() and not self.recompute
        if reuse:
            cached = read_fingerprint(path)
            if cached != fingerprint:
                differ = "; ".join(fingerprint_diff(cached, fingerprint))
                raise ValueError(
                    f"reference cache {path} is stale: it was built for a different run. Fields that differ: "
                    f"{differ}. Delete it, point model.reference.init_args.path elsewhere (a path template with "
                    "{fingerprint} names one file per run's settings), or rebuild it with "
                    "model.reference.init_args.recompute=true"
                )
        self._log_choice(path, runtime, reuse)
        index, lengths = _data_rows(data, self.batch_size)
        if not reuse:
            self._build(model, data, fingerprint, path, runtime, total_pairs=len(index))
        del model  # a ModelSource reference is freed here; the policy is only borrowed
        if runtime.device.type == "cuda":
            torch.cuda.empty_cache()
        store = ReferenceLogpStore.load(path)
        store.check_against(index, lengths, what=f"the data module's pairs ({type(data).__name__})")
        self.store = store

    def _build(self, model: nn.Module, data: ReferenceData, fingerprint: dict[str, Any], path: Path,
               runtime: ReferenceRuntime, total_pairs: int | None = None) -> None:
        start = time.perf_counter()
        if total_pairs is None:
            total_pairs = len(_data_rows(data, self.batch_size)[0])
        original_device = model_device(model)
        batches = (
            b for i, b in enumerate(data.reference_batches(self.batch_size))
            if i % runtime.world_size == runtime.rank
        )
        model.to(runtime.device)
        try:
            with adapters_off(model):  # a LoRA policy's reference is its base model
                progress = BuildProgress(total_pairs, runtime.world_size, str(path))
                shard = compute_reference_logps(model, batches, self.scorer, runtime.forward_context, progress,
                                                with_lse=True)
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
                f"reference cache: built {path} in {time.perf_counter() - start:.1f}s ({path.stat().st_size / 1e6:.2f} "
                "MB)"
            )

    # -- the step ------------------------------------------------------------------------------------
    def token_logps(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        """Gather each group's scored positions; refuses a batch whose lengths differ from the cache's."""
        return self._gather(batch, plan)

    def _gather(self, batch: PreferenceBatch, plan: StepPlan, lse: bool = False) -> list[Tensor]:
        """The cached log-probs (``lse``: log-sum-exps) at each group's scored positions, on the batch's device."""
        if self.store is None:
            raise RuntimeError(
                "CachedReference has no cache: prepare() runs at trainer set-up (or use CachedReference.from_store)"
            )
        gather = self.store.gather_lse if lse else self.store.gather
        index = batch.index.cpu()
        self.store.check_lengths(index, batch.response_lengths, what="the batch")
        device = batch.prompt_ids.device
        out = []
        for group in plan.groups:
            row = group.scored_row.cpu()
            values = gather(index[group.pair.cpu()][row], group.branch.cpu()[row], group.scored_t.cpu())
            out.append(values.to(device, non_blocking=True))
        return out

    def token_lse(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        """The cached log-sum-exps at each group's scored positions (as :meth:`token_logps` gathers the log-probs)."""
        self.check_token_lse()
        return self._gather(batch, plan, lse=True)

    def check_token_lse(self) -> None:
        """Refuses a loaded cache written before log-sum-exps were cached, naming the file and the fix (a source not
        prepared yet passes: ``prepare`` loads or builds it, and the step checks again)."""
        if self.store is not None:
            self.store.check_lse()

    def tokens_executed(self, plan: StepPlan) -> int:
        return 0


def _shard_path(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.name}.rank{rank}")


def _data_rows(data: ReferenceData, batch_size: int) -> tuple[Tensor, Tensor]:
    """``index [n]`` and ``response_lengths [n, 2]`` of every pair the data will serve."""
    index, lengths = [], []
    for batch in data.reference_batches(batch_size):
        index.append(batch.index.cpu())
        lengths.append(batch.response_lengths.cpu())
    return torch.cat(index), torch.cat(lengths)
