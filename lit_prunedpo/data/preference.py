"""``PreferenceDataModule``: preference pairs from a file or the hub, tokenized once, batched as ``PreferenceBatch``.

The pipeline per split: load (:mod:`~lit_prunedpo.data.sources`) -> detect the format
(:mod:`~lit_prunedpo.data.formats`) -> one cached ``datasets.map`` that checks, renders and tokenizes
every row (:mod:`~lit_prunedpo.data.tokenize`) -> apply the bad-row policy and drop pairs left with an
empty response (counted, never silent) -> hold out a seeded validation share when there is no
validation split -> length statistics, logged once -> DataLoaders (length-grouped order for training,
:mod:`~lit_prunedpo.data.length_grouped`).

``index`` in every batch is unique across the module's splits, so that one reference-logprob cache
(:mod:`lit_prunedpo.reference_cache`) covering training and validation is keyed without collisions: a
training pair's index is its row number in the training split, counted before any row is dropped (and
after ``max_rows``); a validation share held out of the training split keeps the training split's
numbering; a separate ``val_split`` is numbered after the training split, its row number plus the
training split's row count (before drops).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

import datasets
import numpy as np
import pyarrow.compute as pc
from datasets.fingerprint import Hasher
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from lit_prunedpo.batch import PreferenceBatch, collate_pairs
from lit_prunedpo.data.generated import generated_pairs
from lit_prunedpo.data.formats import BAD_ROW_KINDS, CONVERSATIONAL, Columns, count_kinds, detect_format
from lit_prunedpo.data.length_grouped import LengthGroupedSampler
from lit_prunedpo.data.resumable import ResumableDataMixin, ResumableSampler
from lit_prunedpo.data.sources import is_single_split, load_split
from lit_prunedpo.data.stats import format_stats, summarize
from lit_prunedpo.data.tokenize import PairEncoder, encode_split, load_tokenizer, tokenizer_fingerprint
from lit_prunedpo.fingerprint import content_digest

BATCH_COLUMNS = ["prompt_ids", "chosen_ids", "rejected_ids", "index"]
GENERATED_ROWS = 4096  # pairs of the generated task when max_rows is not set


@dataclass
class _Built:
    """What one pass of the pipeline yields: the two splits, training lengths and statistics."""

    stats: dict[str, Any]
    train: datasets.Dataset
    val: datasets.Dataset
    train_lengths: np.ndarray


class PreferenceDataModule(ResumableDataMixin, LightningDataModule):
    """Preference pairs (prompt, chosen, rejected) for DPO, batched as :class:`~lit_prunedpo.batch.PreferenceBatch`.

    Reads TRL's three formats: explicit prompt ``{"prompt", "chosen", "rejected"}`` strings; implicit
    prompt ``{"chosen", "rejected"}`` full dialogues whose prompt is their shared prefix up to and
    including the last ``"\\n\\nAssistant:"`` (HH-RLHF); conversational, with message lists rendered by the
    tokenizer's chat template. The format is detected from the column types.

    Tokenization runs once in a ``datasets.map`` cached by fingerprint. Prompts keep their end
    (left-truncated to ``max_prompt_length``) and get BOS in front when the tokenizer has one; a prompt
    that tokenizes to nothing becomes the single token BOS, else EOS, else pad. Plain-text responses
    get EOS appended and keep their start, so that prompt + response <= ``max_length``. Pairs left with
    an empty response are dropped and counted in :attr:`stats`.

    Args:
        path: Where the pairs are. None (the default) is the package's generated task, ordered vs. corrupted
            letter sequences (:mod:`~lit_prunedpo.data.generated`, ``max_rows`` pairs or 4096), read
            through the same pipeline as a file. Otherwise a local ``.json``, ``.jsonl``, ``.jsonl.gz``, ``.parquet`` or ``.csv``
            file, a directory written by ``Dataset.save_to_disk``/``DatasetDict.save_to_disk``, or a hub
            dataset name (``datasets.load_dataset(path, split=...)``).
        tokenizer: Tokenizer name or path for ``AutoTokenizer.from_pretrained``; ``"byt5"`` builds the
            byte-level ``ByT5Tokenizer()``, which needs no files.
        train_split: Split to train on. A single file or saved ``Dataset`` has no splits and is used whole.
        val_split: Split to validate on; None holds out ``val_fraction`` of the training split instead.
        val_fraction: Share of the training split held out for validation (seeded) when ``val_split`` is None;
            in [0, 1). ``0`` trains on every row and validates on nothing (no validation runs).
        seed: Seed of the validation hold-out and of the training order (with the epoch).
        batch_size: Pairs per training batch (per device).
        val_batch_size: Pairs per validation batch; None uses ``batch_size``.
        max_length: Most tokens of a prompt plus one response.
        max_prompt_length: Most prompt tokens (a longer prompt keeps its end); must be < ``max_length``.
        prompt_column: Column holding the prompt (absent in the implicit-prompt format).
        chosen_column: Column holding the preferred response.
        rejected_column: Column holding the dispreferred response.
        chat_template: Jinja chat template (or a path to a file holding one) for conversational data whose
            tokenizer has none; it replaces the tokenizer's own.
        on_bad_row: What a bad row (missing field, wrong type, empty string, identical responses or identical
            token ids after truncation, no shared prompt, an unreadable JSON line) does: "error" stops with one
            message naming the source, row, field and kind; "skip" drops such rows and counts them by kind in
            ``stats``.
        group_by_length: Order training pairs so that each batch holds similar lengths (less padding).
        num_proc: Processes for the tokenizing ``datasets.map``; None uses the main process.
        num_workers: DataLoader worker processes.
        max_rows: Keep only the first N rows of each loaded split (for quick runs), before the hold-out.
        add_bos: Put the tokenizer's BOS in front of every prompt (default). ``False`` is TRL's layout for
            decoder-only models, where ``max_length`` then holds one more real token.
        truncation: "keep_start" (default) cuts responses to fit ``max_length``; "keep_end" (TRL's default
            ``truncation_mode``) first cuts the prompt's beginning so that prompt + the longer response fit.
        resume_with_changed_data: Resume from a checkpoint even though its data (by content fingerprint)
            differs from this run's; the data position then counts batches of other pairs. Off: such a resume
            is refused (:mod:`~lit_prunedpo.data.resumable`).

    Raises:
        ValueError: an argument is out of range, or the chat template file is unreadable.

    Example:
        >>> dm = PreferenceDataModule("pairs.jsonl", tokenizer="byt5", max_rows=100)  # doctest: +SKIP
        >>> dm.setup("fit"); batch = next(iter(dm.train_dataloader()))  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | None = None,
        tokenizer: str = "byt5",
        train_split: str = "train",
        val_split: str | None = None,
        val_fraction: float = 0.05,
        seed: int = 0,
        batch_size: int = 8,
        val_batch_size: int | None = None,
        max_length: int = 512,
        max_prompt_length: int = 256,
        prompt_column: str = "prompt",
        chosen_column: str = "chosen",
        rejected_column: str = "rejected",
        chat_template: str | None = None,
        on_bad_row: Literal["error", "skip"] = "error",
        group_by_length: bool = True,
        num_proc: int | None = None,
        num_workers: int = 0,
        max_rows: int | None = None,
        add_bos: bool = True,
        truncation: Literal["keep_start", "keep_end"] = "keep_start",
        resume_with_changed_data: bool = False,
    ) -> None:
        super().__init__()
        if truncation not in ("keep_start", "keep_end"):
            raise ValueError(f"truncation must be 'keep_start' or 'keep_end', got {truncation!r}")
        self.add_bos = add_bos
        self.truncation = truncation
        _check_args(
            val_fraction=val_fraction,
            batch_size=batch_size,
            val_batch_size=val_batch_size,
            max_length=max_length,
            max_prompt_length=max_prompt_length,
            on_bad_row=on_bad_row,
            num_proc=num_proc,
            num_workers=num_workers,
            max_rows=max_rows,
        )
        if len({prompt_column, chosen_column, rejected_column}) < 3:
            raise ValueError(
                f"prompt_column, chosen_column and rejected_column must differ, got "
                f"{prompt_column!r}, {chosen_column!r}, {rejected_column!r}"
            )
        self.save_hyperparameters()
        self.path = path
        self.train_split = train_split
        self.val_split = val_split
        self.val_fraction = val_fraction
        self.seed = seed
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.max_length = max_length
        self.max_prompt_length = max_prompt_length
        self.columns = Columns(prompt_column, chosen_column, rejected_column)
        self.on_bad_row = on_bad_row
        self.group_by_length = group_by_length
        self.num_proc = num_proc
        self.num_workers = num_workers
        self.max_rows = max_rows
        self.resume_with_changed_data = resume_with_changed_data
        self._content: dict[str, str] = {}  # split -> content digest of its source (or its datasets fingerprint)
        self.tokenizer = load_tokenizer(tokenizer)
        if chat_template is not None:
            self.tokenizer.chat_template = _read_template(chat_template)
        self.train_dataset: datasets.Dataset | None = None
        self.val_dataset: datasets.Dataset | None = None
        self.stats: dict[str, Any] = {}
        self._train_lengths: np.ndarray | None = None

    @property
    def pad_token_id(self) -> int:
        """The id batches are padded with: the tokenizer's pad, else EOS, else 0 (masks mark real tokens)."""
        for token_id in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if token_id is not None:
                return int(token_id)
        return 0

    @property
    def vocab_size(self) -> int:
        """``len(tokenizer)``: base vocabulary plus added tokens, the embedding rows a model needs."""
        return len(self.tokenizer)

    # -- building the splits -------------------------------------------------------------------------

    def _source_name(self, split: str) -> str:
        if self.path is None:
            return "the generated task"
        return self.path if is_single_split(self.path) else f"{self.path} (split {split!r})"

    def _single_split(self) -> bool:
        return self.path is None or is_single_split(self.path)

    def _load(self, split: str) -> datasets.Dataset:
        if self.path is None:
            raw = generated_pairs(num_rows=self.max_rows or GENERATED_ROWS, seed=self.seed)
            self._content[split] = raw._fingerprint
            return raw
        local = Path(self.path).expanduser()
        digest = content_digest(local) if local.exists() else None
        raw = load_split(self.path, split, digest=digest, on_bad_row=self.on_bad_row)
        self._content[split] = digest or raw._fingerprint
        return raw

    def _encode(self, split: str) -> tuple[datasets.Dataset, str, str]:
        """Load a split and run the cached tokenizing map; returns (encoded rows, format, source name)."""
        if split == self.val_split and self._single_split():
            raise ValueError(
                f"{self._source_name(split)} holds a single split, so val_split={split!r} cannot be read from it; leave "
                "val_split unset to hold out val_fraction of it, or save a DatasetDict with that split"
            )
        source = self._source_name(split)
        raw = self._load(split)
        if self.max_rows is not None and len(raw) > self.max_rows:
            raw = raw.select(range(self.max_rows))
        if len(raw) == 0:
            raise ValueError(f"{source}: no rows")
        fmt = detect_format(raw.features, self.columns, source)
        if fmt == CONVERSATIONAL and not self.tokenizer.chat_template:
            name = self.tokenizer.name_or_path or type(self.tokenizer).__name__
            raise ValueError(
                f"{source} is conversational, but tokenizer {name!r} has no chat template to render it; "
                "pass chat_template (a Jinja template string or file)"
            )
        encoder = PairEncoder(self.tokenizer, fmt, self.columns, self.max_length, self.max_prompt_length,
                              add_bos=self.add_bos, truncation=self.truncation)
        # The content digest joins the map's cache key: whatever datasets keyed the rows by, new bytes re-tokenize.
        raw_key = Hasher.hash([raw._fingerprint, self._content[split]])
        return encode_split(raw, encoder, self.num_proc, desc=f"Tokenizing {source}", parent=raw_key), fmt, source

    def _check_bad_rows(self, encoded: datasets.Dataset, bad_kind: np.ndarray, source: str) -> None:
        bad = np.flatnonzero(bad_kind != "")
        if self.on_bad_row == "skip" or bad.size == 0:
            return
        row = encoded[int(bad[0])]
        detail = f": {row['bad_detail']}" if row["bad_detail"] else ""
        more = f"; {bad.size - 1} more bad rows follow" if bad.size > 1 else ""
        raise ValueError(
            f"{source}: row {row['index']} (0-based): field {row['bad_field']!r} "
            f"{BAD_ROW_KINDS[row['bad_kind']]} (kind '{row['bad_kind']}'){detail}{more}. "
            "Fix the data, or pass on_bad_row='skip' to drop such rows (they are counted in stats)"
        )

    def _split_stats(self, rows: np.ndarray, cols: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, Any]:
        """Statistics of the split made of ``rows`` (positions in the encoded table)."""
        good = rows[cols["bad_kind"][rows] == ""]
        kept = rows[keep[rows]]
        return {
            "rows": int(rows.size),
            "pairs": int(kept.size),
            "bad_rows": count_kinds(cols["bad_kind"][rows].tolist()),
            "dropped_empty_response": int(good.size - kept.size),
            "truncated_prompts": int(cols["prompt_truncated"][kept].sum()),
            "truncated_responses": int(cols["response_truncated"][kept].sum()),
            "prompt_tokens": summarize(cols["prompt"][kept]),
            "response_tokens": summarize(np.concatenate([cols["chosen"][kept], cols["rejected"][kept]])),
        }

    def _columns(self, encoded: datasets.Dataset) -> dict[str, np.ndarray]:
        table = encoded.data
        cols = {
            name: pc.list_value_length(table.column(f"{name}_ids")).to_numpy(zero_copy_only=False)
            for name in ("prompt", "chosen", "rejected")
        }
        cols["bad_kind"] = np.asarray(table.column("bad_kind").to_pylist(), dtype=object)
        for flag in ("prompt_truncated", "response_truncated"):
            cols[flag] = table.column(flag).to_numpy(zero_copy_only=False).astype(bool)
        return cols

    def _build(self) -> _Built:
        encoded, fmt, source = self._encode(self.train_split)
        cols = self._columns(encoded)
        self._check_bad_rows(encoded, cols["bad_kind"], source)
        keep = (cols["bad_kind"] == "") & (cols["chosen"] > 0) & (cols["rejected"] > 0)
        rows = np.arange(len(encoded))
        if self.val_split is None:
            if len(encoded) < 2:
                raise ValueError(f"{source}: {len(encoded)} row cannot be split into training and validation")
            order = np.random.default_rng(self.seed).permutation(len(encoded))
            n_val = 0 if self.val_fraction == 0 else min(max(1, round(len(encoded) * self.val_fraction)), len(encoded) - 1)
            val_rows, train_rows = np.sort(order[:n_val]), np.sort(order[n_val:])
            val_encoded, val_cols, val_keep = encoded, cols, keep
        else:
            train_rows = rows
            val_encoded, val_fmt, val_source = self._encode(self.val_split)
            if val_fmt != fmt:
                raise ValueError(f"{val_source} is in the {val_fmt} format but {source} in the {fmt} format")
            val_cols = self._columns(val_encoded)
            self._check_bad_rows(val_encoded, val_cols["bad_kind"], val_source)
            val_keep = (val_cols["bad_kind"] == "") & (val_cols["chosen"] > 0) & (val_cols["rejected"] > 0)
            val_rows = np.arange(len(val_encoded))
        val = val_encoded.select_columns(BATCH_COLUMNS).select(val_rows[val_keep[val_rows]])
        if self.val_split is not None:
            # A separate split numbers its rows from 0 too: shift them past the training split's rows so that
            # `index` keys a reference cache over both splits without collisions.
            shifted = (np.asarray(val["index"], dtype=np.int64) + len(encoded)).tolist()
            val = val.remove_columns("index").add_column("index", shifted)
        stats = {
            "source": self._source_name(self.train_split),
            "format": fmt,
            "train": self._split_stats(train_rows, cols, keep),
            "val": self._split_stats(val_rows, val_cols, val_keep),
        }
        for split, kept in (("train", train_rows[keep[train_rows]]), ("val", val_rows[val_keep[val_rows]])):
            if kept.size == 0 and not (split == "val" and self._no_validation):
                raise ValueError(f"{source}: no usable pairs left for {split} ({format_stats(stats)})")
        train_kept = train_rows[keep[train_rows]]
        return _Built(
            stats=stats,
            train=encoded.select_columns(BATCH_COLUMNS).select(train_kept),
            val=val,
            # What a pair executes in the shared-prompt layout (prompt once, both responses): similar sums pack tightly.
            train_lengths=cols["prompt"][train_kept] + cols["chosen"][train_kept] + cols["rejected"][train_kept],
        )

    # -- LightningDataModule hooks -------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        """Build the training and validation pairs and log their statistics once.

        Under several processes the first process of each node tokenizes first and the others then read its
        ``datasets`` cache. This is done here with the strategy's barrier rather than in ``prepare_data``:
        Lightning wraps ``prepare_data`` in a throw-away gloo group whose barrier-then-destroy occasionally
        aborts a process ("terminate called without an active exception").
        """
        if self.train_dataset is not None:
            return
        trainer = getattr(self, "trainer", None)
        strategy = trainer.strategy if trainer is not None and trainer.world_size > 1 else None
        if strategy is not None and trainer.local_rank != 0:
            strategy.barrier("lit_prunedpo.data.tokenize")  # wait for the node's first process
        try:
            built = self._build()
        finally:
            # Reached even when the build fails (bad data): the other processes then build and fail with the same
            # message themselves, instead of with gloo's "Connection closed by peer" while waiting here.
            if strategy is not None and trainer.local_rank == 0:
                strategy.barrier("lit_prunedpo.data.tokenize")
        self.train_dataset, self.val_dataset, self._train_lengths = built.train, built.val, built.train_lengths
        self.stats = built.stats
        rank_zero_info(format_stats(self.stats))

    # -- the reference-cache protocol (lit_prunedpo.reference_cache) --------------------------------------

    def cache_fingerprint(self) -> dict[str, Any]:
        """What a reference-logprob cache of these pairs depends on (``lit_prunedpo.reference_cache``)."""
        self.setup("fit")
        template = self.tokenizer.chat_template
        return {
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "path": self.path, "train_split": self.train_split, "val_split": self.val_split,
            "val_fraction": self.val_fraction if self.val_split is None else None, "seed": self.seed,
            "max_rows": self.max_rows, "max_length": self.max_length, "max_prompt_length": self.max_prompt_length,
            "columns": [self.columns.prompt, self.columns.chosen, self.columns.rejected],
            "on_bad_row": self.on_bad_row, "tokenizer": self.tokenizer.name_or_path,
            "tokenizer_hash": tokenizer_fingerprint(self.tokenizer),
            "chat_template": hashlib.sha256(template.encode()).hexdigest()[:16] if isinstance(template, str) else None,
            "train_dataset": self.train_dataset._fingerprint, "val_dataset": self.val_dataset._fingerprint,
            "content": dict(sorted(self._content.items())),
        }

    def data_identity(self) -> dict[str, Any]:
        """What a checkpoint's data position refers to (:mod:`~lit_prunedpo.data.resumable`): the sources'
        content digests and the pairs built from them."""
        self.setup("fit")
        assert self.train_dataset is not None
        return {"source": self._source_name(self.train_split), "content": dict(sorted(self._content.items())),
                "train_pairs": len(self.train_dataset)}

    def reference_batches(self, batch_size: int | None = None) -> Iterator[PreferenceBatch]:
        """Every training then validation pair once, unshuffled, shortest first within each split (less
        padding, faster build), for a reference-logprob cache."""
        self.setup("fit")
        collate, size = self._collate(), batch_size or self.val_batch_size
        for ds in (self.train_dataset, self.val_dataset):
            table = ds.with_format("arrow")[:]  # applies the split's row selection
            prompt, chosen, rejected = (pc.list_value_length(table.column(c)).to_numpy(zero_copy_only=False)
                                        for c in ("prompt_ids", "chosen_ids", "rejected_ids"))
            order = np.argsort(prompt + np.maximum(chosen, rejected), kind="stable")
            for start in range(0, len(order), size):
                columns = ds[order[start : start + size].tolist()]
                yield collate([dict(zip(columns, row)) for row in zip(*columns.values())])

    def _collate(self) -> functools.partial:
        return functools.partial(collate_pairs, pad_id=self.pad_token_id)

    def _require_setup(self) -> None:
        if self.train_dataset is None or self.val_dataset is None:
            raise RuntimeError("PreferenceDataModule.setup() must run before its dataloaders are requested")

    def _distributed(self) -> tuple[int, int]:
        """(num_replicas, rank) when a trainer runs a distributed strategy, else (1, 0)."""
        trainer = getattr(self, "trainer", None)
        kwargs = getattr(trainer, "distributed_sampler_kwargs", None) if trainer is not None else None
        if not kwargs:
            return 1, 0
        return int(kwargs.get("num_replicas", 1)), int(kwargs.get("rank", 0))

    def train_dataloader(self) -> DataLoader:
        """Training pairs, length-grouped (or shuffled) with an epoch-seeded order."""
        self._require_setup()
        assert self.train_dataset is not None and self._train_lengths is not None
        num_replicas, rank = self._distributed()
        sampler: ResumableSampler
        if self.group_by_length:
            sampler = LengthGroupedSampler(
                self._train_lengths.tolist(), self.batch_size, seed=self.seed, num_replicas=num_replicas, rank=rank
            )
        else:
            sampler = ResumableSampler(self.train_dataset, num_replicas=num_replicas, rank=rank, seed=self.seed)
        return DataLoader(
            self.train_dataset,
            batch_size=self.batch_size,
            sampler=self.resume(sampler, self.batch_size),
            collate_fn=self._collate(),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    @property
    def _no_validation(self) -> bool:
        return self.val_split is None and self.val_fraction == 0

    def val_dataloader(self) -> DataLoader | list:
        """Validation pairs in dataset order; none (an empty list: Lightning then skips validation) with
        ``val_fraction: 0``."""
        self._require_setup()
        if self._no_validation:
            return []
        return DataLoader(
            self.val_dataset,
            batch_size=self.val_batch_size,
            shuffle=False,
            collate_fn=self._collate(),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def test_dataloader(self) -> DataLoader:
        """The validation pairs: this module reads two splits. To test on a held-out split, name it
        ``val_split`` in a config used with ``lit-prunedpo test``."""
        rank_zero_info(f"testing on the validation pairs of {self._source_name(self.val_split or self.train_split)}")
        return self.val_dataloader()


def _check_args(
    *,
    val_fraction: float,
    batch_size: int,
    val_batch_size: int | None,
    max_length: int,
    max_prompt_length: int,
    on_bad_row: str,
    num_proc: int | None,
    num_workers: int,
    max_rows: int | None,
) -> None:
    """Fail fast on arguments out of range, naming the argument."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1) (0: no validation split), got {val_fraction}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if val_batch_size is not None and val_batch_size < 1:
        raise ValueError(f"val_batch_size must be >= 1 or None, got {val_batch_size}")
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    if max_prompt_length >= max_length:
        raise ValueError(
            f"max_prompt_length ({max_prompt_length}) must be < max_length ({max_length}) to leave room for responses"
        )
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    if num_proc is not None and num_proc < 1:
        raise ValueError(f"num_proc must be >= 1 or None, got {num_proc}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")


def _read_template(chat_template: str) -> str:
    """A template given as a path to an existing file is read; anything else is the template itself."""
    if "{" not in chat_template:
        path = Path(chat_template).expanduser()
        if path.is_file():
            return path.read_text()
        raise ValueError(f"chat_template {chat_template!r} is neither a Jinja template nor an existing file")
    return chat_template
