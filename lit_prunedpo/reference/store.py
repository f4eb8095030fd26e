"""The on-disk store of per-token reference log-probabilities (storage only: :mod:`~lit_prunedpo.reference.cached`
computes and checks it against the run).

:class:`ReferenceLogpStore` holds the reference log-prob of every response token of every pair flat
(``values`` float32 ``[total_tokens]``) with per (row, branch) ``offsets``/``lengths`` and the sorted dataset
keys (``batch.index``); it gathers at any positions and saves to / loads from one safetensors file (4 bytes
per token plus 40 bytes per pair) whose metadata carries a fingerprint and a BLAKE2b checksum of the tensors'
bytes: a file whose values were altered after it was written is refused on load, naming it.

Beside each log-prob it holds the reference's log-sum-exp over the vocabulary at that position (``lse`` float32,
same offsets, 4 more bytes a token): the baseline of :class:`~lit_prunedpo.samplers.ReferenceLogSumExp`. A file
written before (no ``lse`` tensor) still loads and serves every other estimator, with its checksum as written
(the checksum covers ``lse`` where the file has it); :meth:`ReferenceLogpStore.gather_lse` refuses it, naming the
file and the fix, and checks the shape and finiteness of those it reads when first asked.

A file is written whole or not at all: :meth:`ReferenceLogpStore.save` writes ``<path>.partial-<pid>`` and renames
it into place only once complete, so a killed build leaves at most that sibling, which nothing loads (a file cut
short under the cache's own name, e.g. copied in part, fails safetensors' header check or the checksum on load).
A write that fails because the disk is full (``ENOSPC``) or the file too large for its file system (``EFBIG``)
removes the partial file and raises :class:`DiskFull`, one line naming the cache and saying so
(:func:`disk_full_errno` also recognises the errors of safetensors' and tokenizers' Rust writers, which carry no
errno). ``lit_prunedpo.export`` reports a full disk with the same two.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from lit_prunedpo.batch import BRANCH_NAMES
from lit_prunedpo.full_disk import DiskFull, describe_full, disk_full_errno, partial_path

FORMAT = "lit_prunedpo.reference_cache"
# 2: a checksum of the tensors in the metadata. The optional ``lse`` tensor left it at 2: files without it still load
VERSION = 2
TENSORS = ("values", "keys", "offsets", "lengths")
#: Tensors a file may lack (written before they were cached); the checksum covers those it has.
OPTIONAL_TENSORS = ("lse",)


# ----------------------------------------------------------------------------------------------- the store
class ReferenceLogpStore:
    """Per-token reference log-probs of every response token of every pair, keyed by ``batch.index``.

    Pair ``keys[r]``'s branch ``b`` has ``lengths[r, b]`` tokens whose log-probs are
    ``values[offsets[r, b] : offsets[r, b] + lengths[r, b]]``. Everything lives on the CPU.

    Args:
        values: float32 ``[total_tokens]``, all log-probs, flat.
        keys: ``[N]`` long, the dataset index of each row, strictly increasing.
        offsets: ``[N, 2]`` long, start of each (row, branch) in ``values``.
        lengths: ``[N, 2]`` long, response length of each (row, branch), >= 1.
        fingerprint: what the values were computed from (see :mod:`~lit_prunedpo.reference.fingerprint`).
        source: where the store comes from (a file's path), for messages.
        lse: float32 ``[total_tokens]``, the log-sum-exp of the reference's logits at each token, laid out as
            ``values``; ``None``: not cached (a file written before they were).

    Raises:
        ValueError: the tensors are inconsistent (shapes, ordering, offsets past the end) or hold NaN/Inf
            or positive log-probs.
    """

    def __init__(
        self, values: Tensor, keys: Tensor, offsets: Tensor, lengths: Tensor,
        fingerprint: Mapping[str, Any] | None = None, source: str = "in memory", lse: Tensor | None = None,
    ) -> None:
        self.values = values.detach().to("cpu", torch.float32).contiguous()
        self.keys = keys.detach().to("cpu", torch.long).contiguous()
        self.offsets = offsets.detach().to("cpu", torch.long).contiguous()
        self.lengths = lengths.detach().to("cpu", torch.long).contiguous()
        self.lse = None if lse is None else lse.detach().to("cpu", torch.float32).contiguous()
        self._lse_checked = False
        self.fingerprint: dict[str, Any] = dict(fingerprint or {})
        self.source = source
        self._check()

    # -- checks --------------------------------------------------------------------------------------
    def _check(self) -> None:
        where = f"reference cache {self.source}"
        N = self.keys.numel()
        if self.keys.ndim != 1 or self.offsets.shape != (N, 2) or self.lengths.shape != (N, 2) or self.values.ndim != 1:
            raise ValueError(
                f"{where}: wrong shapes: keys {tuple(self.keys.shape)}, offsets {tuple(self.offsets.shape)}, "
                f"lengths {tuple(self.lengths.shape)}, values {tuple(self.values.shape)}; expected [N], [N, 2], "
                "[N, 2] and [total_tokens]"
            )
        if N and bool((self.keys[1:] <= self.keys[:-1]).any()):
            raise ValueError(f"{where}: keys (dataset indices) are not strictly increasing: duplicated or unsorted "
                             "rows")
        if bool((self.lengths < 1).any()):
            raise ValueError(f"{where}: a response has length < 1")
        flat_len, flat_off = self.lengths.reshape(-1), self.offsets.reshape(-1)
        expected = torch.cat([torch.zeros(1, dtype=torch.long), flat_len.cumsum(0)[:-1]]) if N else flat_off
        if not torch.equal(flat_off, expected) or int(flat_len.sum()) != self.values.numel():
            raise ValueError(
                f"{where}: offsets/lengths do not tile values: {int(flat_len.sum())} tokens listed, "
                f"{self.values.numel()} values stored"
            )
        bad = ~torch.isfinite(self.values)
        if bool(bad.any()):
            raise ValueError(
                f"{where}: {int(bad.sum())} of {self.values.numel()} log-probs are NaN or infinite "
                f"(first in pair {self._key_of_value(int(bad.nonzero()[0]))}); rebuild it (recompute=True)"
            )
        if bool((self.values > 0).any()):
            raise ValueError(f"{where}: holds positive log-probabilities; it is not a log-prob cache")

    def _check_lse(self) -> None:
        # checked when first read (check_lse), not at load: a file's log-sum-exps matter only to the estimator that
        # reads them, and the checksum already refuses a file altered after it was written
        where = f"reference cache {self.source}"
        if self.lse.shape != self.values.shape:
            raise ValueError(f"{where}: wrong shapes: lse {tuple(self.lse.shape)}, values {tuple(self.values.shape)}; "
                             "expected one log-sum-exp per log-prob; rebuild it (recompute=True)")
        bad = ~torch.isfinite(self.lse)
        if bool(bad.any()):
            raise ValueError(
                f"{where}: {int(bad.sum())} of {self.lse.numel()} log-sum-exps are NaN or infinite "
                f"(first in pair {self._key_of_value(int(bad.nonzero()[0]))}); rebuild it (recompute=True)"
            )

    def _key_of_value(self, position: int) -> int:
        row = int(torch.searchsorted(self.offsets.reshape(-1), torch.tensor(position), right=True)) - 1
        return int(self.keys[row // 2])

    def check_against(self, index: Tensor, lengths: Tensor, what: str = "the data") -> None:
        """Refuse a store that does not hold exactly the pairs ``index`` (``[n]``) with response lengths
        ``lengths`` (``[n, 2]``): the set-up check against every pair the data will serve.

        Raises:
            ValueError: the pair counts differ, a pair of the data is missing, or its response lengths differ.
        """
        if index.numel() != self.num_rows:
            raise ValueError(
                f"reference cache {self.source} holds {self.num_rows} pairs but {what} has {index.numel()}: it was "
                "built for other data; rebuild it (recompute=True)"
            )
        missing = self._rows(index.cpu(), strict=False) < 0
        if bool(missing.any()):
            keys = index.cpu()[missing][:8].tolist()
            raise ValueError(
                f"reference cache {self.source} has no entry for {int(missing.sum())} pairs of {what} "
                f"(dataset indices {keys}...): it was built for other data; rebuild it (recompute=True)"
            )
        self.check_lengths(index, lengths, what)

    def check_lengths(self, index: Tensor, lengths: Tensor, what: str = "the batch") -> None:
        """Refuse pairs ``index`` whose response lengths ``lengths`` (``[n, 2]``) differ from the cached ones.

        Raises:
            KeyError: an ``index`` is not in the cache.
            ValueError: a pair's response lengths differ (other data or another tokenization).
        """
        index = index.reshape(-1).cpu()
        cached, actual = self.lengths[self._rows(index)], lengths.cpu()
        differ = (cached != actual).any(-1)
        if bool(differ.any()):
            i = int(differ.nonzero()[0])
            raise ValueError(
                f"reference cache {self.source}: pair {int(index[i])} has response lengths {cached[i].tolist()} in "
                f"the cache but {actual[i].tolist()} in {what}: it was built for other data or another "
                "tokenization; rebuild it (recompute=True)"
            )

    # -- lookup --------------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return self.keys.numel()

    @property
    def num_tokens(self) -> int:
        return self.values.numel()

    @property
    def size_bytes(self) -> int:
        """Bytes of the tensors (what the file holds, less its small header)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def tensors(self) -> dict[str, Tensor]:
        """The tensors a file holds, by name (``lse`` where cached)."""
        tensors = {"values": self.values, "keys": self.keys, "offsets": self.offsets, "lengths": self.lengths}
        return tensors if self.lse is None else {**tensors, "lse": self.lse}

    def _rows(self, index: Tensor, strict: bool = True) -> Tensor:
        """Rows of dataset keys ``index``; -1 for unknown keys unless ``strict`` (then ``KeyError``)."""
        index = index.to("cpu", torch.long).contiguous()
        rows = torch.searchsorted(self.keys, index).clamp(max=max(self.num_rows - 1, 0))
        found = self.keys[rows] == index if self.num_rows else torch.zeros_like(index, dtype=torch.bool)
        if bool((~found).any()):
            if strict:
                unknown = index[~found].unique()[:8].tolist()
                raise KeyError(
                    f"reference cache {self.source} has no pair with dataset index {unknown}: the cache covers "
                    f"{self.num_rows} pairs of other data; rebuild it (recompute=True)"
                )
            rows = torch.where(found, rows, -1)
        return rows

    def gather(self, index: Tensor, branch: Tensor, t: Tensor) -> Tensor:
        """Log-probs at dataset keys ``index``, branches ``branch`` (0 chosen), 0-based response positions ``t``.

        All three broadcast together; the result is a float32 CPU tensor of their shape.

        Raises:
            KeyError: an ``index`` is not in the cache.
            IndexError: a position ``t`` is beyond its response's cached length.
        """
        return self.values[self._flat(index, branch, t)]

    def gather_lse(self, index: Tensor, branch: Tensor, t: Tensor) -> Tensor:
        """The log-sum-exps at the positions :meth:`gather` reads.

        Raises:
            ValueError: the store holds none (a file written before they were cached), naming it and the fix.
            KeyError, IndexError: as :meth:`gather`.
        """
        self.check_lse()
        return self.lse[self._flat(index, branch, t)]

    def check_lse(self) -> None:
        """Raise ``ValueError`` naming the file and the fix unless the store holds the reference's log-sum-exps, one
        finite number per log-prob."""
        if self.lse is None:
            raise ValueError(
                f"reference cache {self.source} holds no log-sum-exps (it was written before they were cached), which "
                "ReferenceLogSumExp needs: rebuild it (model.reference.init_args.recompute=true, or delete the file)"
            )
        if not self._lse_checked:
            self._check_lse()
            self._lse_checked = True

    def _flat(self, index: Tensor, branch: Tensor, t: Tensor) -> Tensor:
        """Positions in ``values`` of keys ``index``, branches ``branch``, response positions ``t``
        (see :meth:`gather`)."""
        index, branch, t = torch.broadcast_tensors(index.cpu().long(), branch.cpu().long(), t.cpu().long())
        rows = self._rows(index)
        length = self.lengths[rows, branch]
        beyond = (t < 0) | (t >= length)
        if bool(beyond.any()):
            i = beyond.reshape(-1).nonzero()[0]
            k, b, p, n = (int(x.reshape(-1)[i]) for x in (index, branch, t, length))
            raise IndexError(
                f"reference cache {self.source}: position {p} of pair {k} ({BRANCH_NAMES[b]}) is beyond its cached "
                f"length {n}: the batch's responses are longer than those the cache was built from"
            )
        return self.offsets[rows, branch] + t

    def lengths_of(self, index: Tensor) -> Tensor:
        """``[n, 2]`` cached response lengths of dataset keys ``index``."""
        return self.lengths[self._rows(index.reshape(-1))]

    # -- building and merging ------------------------------------------------------------------------
    @classmethod
    def from_rows(cls, keys: list[int], lengths: list[tuple[int, int]], values: list[Tensor],
                  fingerprint: Mapping[str, Any] | None = None,
                  lse: list[Tensor] | None = None) -> "ReferenceLogpStore":
        """Assemble from per-pair parts (any order): ``values[i]`` is chosen then rejected, ``sum(lengths[i])`` long;
        ``lse[i]``, where given, the log-sum-exps laid out as ``values[i]``.

        Raises:
            ValueError: a dataset index occurs twice (train and val must be numbered uniquely).
        """
        if not keys:  # e.g. a rank's shard when there are fewer batches than ranks; the merge checks the total
            empty = torch.zeros(0, 2, dtype=torch.long)
            return cls(torch.zeros(0), torch.zeros(0, dtype=torch.long), empty, empty, fingerprint,
                       lse=None if lse is None else torch.zeros(0))
        key_t = torch.tensor(keys, dtype=torch.long)
        order = torch.argsort(key_t)
        key_t = key_t[order]
        dup = key_t[1:] == key_t[:-1]
        if bool(dup.any()):
            raise ValueError(
                f"the data yields dataset index {int(key_t[1:][dup][0])} more than once: the cache is keyed by "
                "batch.index, which must be unique across the training and validation splits"
            )
        len_t = torch.tensor(lengths, dtype=torch.long).reshape(-1, 2)[order]
        flat = torch.cat([values[i].float().cpu() for i in order.tolist()])
        flat_lse = None if lse is None else torch.cat([lse[i].float().cpu() for i in order.tolist()])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), len_t.reshape(-1).cumsum(0)[:-1]]).reshape(-1, 2)
        return cls(flat, key_t, offsets, len_t, fingerprint, lse=flat_lse)

    @classmethod
    def merge(cls, stores: Iterable["ReferenceLogpStore"]) -> "ReferenceLogpStore":
        """One store holding the rows of all ``stores`` (rank shards), which must not overlap."""
        stores = list(stores)
        if not sum(s.num_rows for s in stores):
            raise ValueError("no pairs to cache: the data module yielded no reference batches")
        keys, lengths, values, lse = [], [], [], []
        with_lse = all(s.lse is not None for s in stores)  # shards of one build all have them or none
        for s in stores:
            for r in range(s.num_rows):
                keys.append(int(s.keys[r]))
                lengths.append(tuple(s.lengths[r].tolist()))
                start, n = int(s.offsets[r, 0]), int(s.lengths[r].sum())
                values.append(s.values[start : start + n])
                if with_lse:
                    lse.append(s.lse[start : start + n])
        return cls.from_rows(keys, lengths, values, stores[0].fingerprint if stores else None,
                             lse=lse if with_lse else None)

    # -- files ---------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write a safetensors file atomically: into ``<path>.partial-<pid>``, renamed into place once complete.

        Raises:
            DiskFull: the disk is full or the file too large for it; the partial file is removed, ``path`` is left
                as it was.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = partial_path(path)
        tensors = self.tensors()
        metadata = {"format": FORMAT, "version": str(VERSION),
                    "fingerprint": json.dumps(self.fingerprint, sort_keys=True),
                    "checksum": tensors_checksum(tensors)}
        try:
            save_file(tensors, str(tmp), metadata=metadata)
            os.replace(tmp, path)
        except BaseException as err:
            tmp.unlink(missing_ok=True)  # nothing half-written stays behind, whatever stopped the write
            code = disk_full_errno(err)
            if code is None:
                raise
            raise DiskFull(
                f"reference cache {path}: {describe_full(code)} while writing it (as {tmp.name}, now removed; "
                f"{path.name} is as it was): free space on that disk, or point model.reference.init_args.path at "
                "another one", code,
            ) from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ReferenceLogpStore":
        """Read a file written by :meth:`save`.

        Raises:
            ValueError: the file is not a reference cache of this version, lacks a tensor, does not match its
                checksum, or fails the checks.
        """
        fingerprint = read_fingerprint(path)
        tensors = {}
        with safe_open(str(path), framework="pt") as f:
            stored = (f.metadata() or {}).get("checksum")
            for name in TENSORS:
                if name not in f.keys():
                    raise ValueError(f"reference cache {path}: no tensor {name!r}")
                tensors[name] = f.get_tensor(name)
            for name in OPTIONAL_TENSORS:
                if name in f.keys():
                    tensors[name] = f.get_tensor(name)
        actual = tensors_checksum(tensors)
        if stored != actual:
            raise ValueError(
                f"reference cache {path}: its tensors do not match the checksum written with them (stored "
                f"{stored}, computed {actual}): the file was altered or corrupted after it was built. Delete it or "
                "rebuild it (model.reference.init_args.recompute=true)"
            )
        return cls(fingerprint=fingerprint, source=str(path), **tensors)

    def __repr__(self) -> str:
        return (f"ReferenceLogpStore({self.num_rows} pairs, {self.num_tokens} tokens, {self.size_bytes} bytes, "
                f"{self.source})")


def tensors_checksum(tensors: Mapping[str, Tensor]) -> str:
    """BLAKE2b of the named tensors' dtypes, shapes and bytes, in :data:`TENSORS` order, then the
    :data:`OPTIONAL_TENSORS` present (so a file written without them keeps its checksum)."""
    h = hashlib.blake2b(digest_size=16)
    for name in TENSORS + tuple(n for n in OPTIONAL_TENSORS if n in tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the buffer itself: no copy
    return h.hexdigest()


def read_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """The fingerprint in a cache file's metadata, without reading its tensors.

    Raises:
        ValueError: the file is not a reference cache of this format version.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as err:  # safetensors raises its own error types for non-safetensors files
        # a file cut short (copied in part, a disk that filled under another writer) ends here: never loaded
        raise ValueError(f"reference cache {path}: not a readable safetensors file (cut short or not a cache?): "
                         f"{err}; delete it or rebuild it (model.reference.init_args.recompute=true)") from err
    if meta.get("format") != FORMAT or meta.get("version") != str(VERSION):
        raise ValueError(
            f"reference cache {path}: format {meta.get('format')!r} version {meta.get('version')!r}, expected "
            f"{FORMAT!r} version {VERSION}; delete it or rebuild it (recompute=True)"
        )
    return json.loads(meta.get("fingerprint", "{}"))
