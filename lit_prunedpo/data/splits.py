"""Building the training and validation pairs of a :class:`~lit_prunedpo.data.PreferenceDataModule`.

Per split: load (:mod:`~lit_prunedpo.data.sources`) -> detect the format (:mod:`~lit_prunedpo.data.formats`) ->
one cached ``datasets.map`` that checks, renders and tokenizes every row (:mod:`~lit_prunedpo.data.tokenize`)
-> apply the bad-row policy and drop pairs left with an empty response (counted, never silent) -> hold out a
seeded validation share when there is no validation split -> length statistics.

``index`` is unique across the two splits, so that one reference-logprob cache covering both is keyed without
collisions: a training pair's index is its row number in the training split, counted before any row is
dropped (and after ``max_rows``); a validation share held out of the training split keeps the training split's
numbering; a separate ``val_split`` is numbered after the training split, its row number plus the training
split's row count (before drops).

A single file, a saved ``Dataset`` or the generated task has no split names: ``train_split`` names nothing there
and ``val_split`` is replaced by a held-out ``val_fraction``, with a warning (:func:`single_source_val_split`), so
that a config written for a hub dataset with a test split reads a local file as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from lit_prunedpo.data.formats import (BAD_ROW_KINDS, CHAT_FORMATS, DIALOGUE_MESSAGES, IMPLICIT, Columns, count_kinds,
                                       detect_format)
from lit_prunedpo.data.generated import generated_pairs
from lit_prunedpo.data.readable import line_of_row
from lit_prunedpo.data.sources import is_single_split, load_split
from lit_prunedpo.data.lengths import format_stats, summarize, truncation_warnings
from lit_prunedpo.data.tokenize import PairEncoder, encode_split
from lit_prunedpo.fingerprint import content_digest

BATCH_COLUMNS = ["prompt_ids", "chosen_ids", "rejected_ids", "index"]
GENERATED_ROWS = 4096  # pairs of the generated task when max_rows is not set


def single_source_val_split(path: str | None, val_split: str | None, val_fraction: float) -> tuple[str | None, str]:
    """The validation split a source can give, and the warning when that is not ``val_split``.

    A source without split names (one file, a saved ``Dataset``, the generated task) cannot have ``val_split``; a
    config written for a hub dataset names one all the same (``configs/hh_rlhf.yaml``: ``test``). Its rows are then
    split as with ``val_split: null``: ``val_fraction`` held out (seeded), said in a warning naming the override.

    Returns:
        ``(val_split, "")`` when the source can have it (or it is None), else ``(None, warning)``.
    """
    if val_split is None or (path is not None and not is_single_split(path)):
        return val_split, ""
    what = ("the generated task" if path is None else
            f"{path} is a single file" if Path(path).expanduser().is_file() else f"{path} is a saved Dataset")
    instead = (f"validating on val_fraction {val_fraction} of its rows instead (held out of training, seeded)"
               if val_fraction > 0 else "training on all of its rows without validation (val_fraction 0)")
    return None, (
        f"data.init_args.val_split is {val_split!r}, but {what} with no named splits: {instead}. Pass "
        "--data.init_args.val_split null to choose this without the warning; to validate on a split of its own, "
        f"give a DatasetDict folder (DatasetDict.save_to_disk) or a hub dataset that has split {val_split!r}"
    )


@dataclass
class Splits:
    """What one build yields.

    Attributes:
        train: training pairs (``BATCH_COLUMNS``).
        val: validation pairs (possibly empty with ``val_fraction=0``).
        train_lengths: tokens each training pair executes with a shared prompt (prompt + both responses).
        stats: rows, pairs, bad rows by kind, drops, truncations and length summaries per split; ``warnings``: the
            messages of a large share of cut prompts or responses
            (:func:`~lit_prunedpo.data.lengths.truncation_warnings`).
        content: split -> content digest of its source (or its ``datasets`` fingerprint).
    """

    train: datasets.Dataset
    val: datasets.Dataset
    train_lengths: np.ndarray
    stats: dict[str, Any]
    content: dict[str, str]


@dataclass
class SplitBuilder:
    """Builds :class:`Splits` from a source; the fields are ``PreferenceDataModule``'s arguments of the same names
    (documented there), checked there."""

    path: str | None
    tokenizer: PreTrainedTokenizerBase
    columns: Columns
    train_split: str = "train"
    val_split: str | None = None
    val_fraction: float = 0.05
    seed: int = 0
    max_length: int = 512
    max_prompt_length: int = 256
    on_bad_row: str = "error"
    num_proc: int | None = None
    max_rows: int | None = None
    add_bos: bool = True
    truncation: str = "keep_start"
    dialogues: str = "text"
    content: dict[str, str] = field(default_factory=dict)

    @property
    def no_validation(self) -> bool:
        """``val_fraction: 0`` without a validation split: nothing is held out."""
        return self.val_split is None and self.val_fraction == 0

    def source_name(self, split: str) -> str:
        """How messages name the source of ``split``."""
        if self.path is None:
            return "the generated task"
        return self.path if is_single_split(self.path) else f"{self.path} (split {split!r})"

    def build(self) -> Splits:
        """Load, tokenize, filter and split.

        Raises:
            ValueError: a bad row under ``on_bad_row="error"`` (naming source, row, field and kind), an empty
                source, splits in different formats, conversational data without a chat template, or no usable
                pairs left for a split.
        """
        encoded, fmt, source = self._encode(self.train_split)
        cols = _columns(encoded)
        self._check_bad_rows(encoded, cols["bad_kind"], source)
        keep = (cols["bad_kind"] == "") & (cols["chosen"] > 0) & (cols["rejected"] > 0)
        if self.val_split is None:
            train_rows, val_rows = self._hold_out(len(encoded), source)
            val_encoded, val_cols, val_keep = encoded, cols, keep
        else:
            train_rows = np.arange(len(encoded))
            val_encoded, val_fmt, val_source = self._encode(self.val_split)
            if val_fmt != fmt:
                raise ValueError(f"{val_source} is in the {val_fmt} format but {source} in the {fmt} format")
            val_cols = _columns(val_encoded)
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
            "source": self.source_name(self.train_split),
            "format": fmt,
            "train": _split_stats(train_rows, cols, keep),
            "val": _split_stats(val_rows, val_cols, val_keep),
        }
        for split, kept in (("train", train_rows[keep[train_rows]]), ("val", val_rows[val_keep[val_rows]])):
            if kept.size == 0 and not (split == "val" and self.no_validation):
                raise ValueError(f"{source}: no usable pairs left for {split} ({format_stats(stats)})")
        train_kept = train_rows[keep[train_rows]]
        val_kept = val_rows[val_keep[val_rows]]
        both = {name: np.concatenate([cols[name][train_kept], val_cols[name][val_kept]])
                for name in ("prompt_truncated", "prompt_length", "response_truncated", "response_length")}
        stats["warnings"] = truncation_warnings(
            self.source_name(self.train_split), both["prompt_truncated"], both["prompt_length"],
            both["response_truncated"], both["response_length"], max_length=self.max_length,
            max_prompt_length=self.max_prompt_length, truncation=self.truncation,
        )
        return Splits(
            train=encoded.select_columns(BATCH_COLUMNS).select(train_kept),
            val=val,
            # What a pair executes in the shared-prompt layout (prompt once, both responses): similar sums pack tightly.
            train_lengths=cols["prompt"][train_kept] + cols["chosen"][train_kept] + cols["rejected"][train_kept],
            stats=stats,
            content=dict(sorted(self.content.items())),
        )

    def _hold_out(self, num_rows: int, source: str) -> tuple[np.ndarray, np.ndarray]:
        """``(training rows, validation rows)``, both sorted: ``val_fraction`` of ``num_rows`` held out, seeded (at
        least one row, and one left to train on, unless the fraction is 0)."""
        if num_rows < 2 and self.val_fraction > 0:
            raise ValueError(
                f"{source}: {num_rows} row cannot be split into training and validation (val_fraction "
                f"{self.val_fraction} holds out at least one row and leaves one to train on): add rows, or train on "
                "it without validation: val_fraction=0 (--data.init_args.val_fraction 0)")
        order = np.random.default_rng(self.seed).permutation(num_rows)
        n_val = 0 if self.val_fraction == 0 else min(max(1, round(num_rows * self.val_fraction)), num_rows - 1)
        return np.sort(order[n_val:]), np.sort(order[:n_val])

    def _single_split(self) -> bool:
        return self.path is None or is_single_split(self.path)

    def _load(self, split: str) -> datasets.Dataset:
        if self.path is None:
            raw = generated_pairs(num_rows=self.max_rows or GENERATED_ROWS, seed=self.seed)
            self.content[split] = raw._fingerprint
            return raw
        local = Path(self.path).expanduser()
        digest = content_digest(local) if local.exists() else None
        raw = load_split(self.path, split, digest=digest, on_bad_row=self.on_bad_row)
        self.content[split] = digest or raw._fingerprint
        return raw

    def _encode(self, split: str) -> tuple[datasets.Dataset, str, str]:
        """Load a split and run the cached tokenizing map; returns (encoded rows, format, source name)."""
        if split == self.val_split and self._single_split():
            raise ValueError(
                f"{self.source_name(split)} holds a single split, so val_split={split!r} cannot be read from it; pass "
                "val_split=None (--data.init_args.val_split null) to hold out val_fraction of it, or save a "
                "DatasetDict with that split"
            )
        source = self.source_name(split)
        raw = self._load(split)
        if self.max_rows is not None and len(raw) > self.max_rows:
            raw = raw.select(range(self.max_rows))
        if len(raw) == 0:
            raise ValueError(f"{source}: no rows")
        fmt = self._read_as(detect_format(raw.features, self.columns, source), source)
        if fmt in CHAT_FORMATS and not self.tokenizer.chat_template:
            name = self.tokenizer.name_or_path or type(self.tokenizer).__name__
            raise ValueError(
                f"{source} is conversational, but tokenizer {name!r} has no chat template to render it; "
                "pass chat_template (a Jinja template string or file)"
            )
        encoder = PairEncoder(self.tokenizer, fmt, self.columns, self.max_length, self.max_prompt_length,
                              add_bos=self.add_bos, truncation=self.truncation)
        # The content digest joins the map's cache key: whatever datasets keyed the rows by, new bytes re-tokenize.
        raw_key = Hasher.hash([raw._fingerprint, self.content[split]])
        return encode_split(raw, encoder, self.num_proc, desc=f"Tokenizing {source}", parent=raw_key), fmt, source

    def _read_as(self, fmt: str, source: str) -> str:
        """The format the rows are read in: the detected one, or ``dialogue_messages`` for text dialogues read as
        chat messages (``dialogues="messages"``), which only the implicit-prompt text format holds."""
        if self.dialogues == "text":
            return fmt
        if fmt != IMPLICIT:
            raise ValueError(
                f"{source} is in the {fmt} format, but data.init_args.dialogues={self.dialogues!r} reads text "
                "dialogues without a prompt column ('\\n\\nHuman: ...\\n\\nAssistant: ...', HH-RLHF's implicit "
                "format) as chat messages; pass dialogues='text' (the default) for this data"
            )
        return DIALOGUE_MESSAGES

    def _check_bad_rows(self, encoded: datasets.Dataset, bad_kind: np.ndarray, source: str) -> None:
        bad = np.flatnonzero(bad_kind != "")
        if self.on_bad_row == "skip" or bad.size == 0:
            return
        row = encoded[int(bad[0])]
        detail = f": {row['bad_detail']}" if row["bad_detail"] else ""
        more = f"; {bad.size - 1} more bad rows follow" if bad.size > 1 else ""
        local = Path(self.path).expanduser() if self.path is not None else None
        line = line_of_row(local, row["index"]) if local is not None and local.is_file() else None
        where = f"0-based, line {line}" if line is not None else "0-based"
        raise ValueError(
            f"{source}: row {row['index']} ({where}): field {row['bad_field']!r} "
            f"{BAD_ROW_KINDS[row['bad_kind']]} (kind '{row['bad_kind']}'){detail}{more}. "
            "Fix the data, or pass on_bad_row='skip' (--data.init_args.on_bad_row skip) to drop such rows (they are "
            "counted in stats)"
        )


def _columns(encoded: datasets.Dataset) -> dict[str, np.ndarray]:
    """Token counts, bad-row kinds and truncation flags of every encoded row, as numpy arrays."""
    table = encoded.data
    cols = {
        name: pc.list_value_length(table.column(f"{name}_ids")).to_numpy(zero_copy_only=False)
        for name in ("prompt", "chosen", "rejected")
    }
    cols["bad_kind"] = np.asarray(table.column("bad_kind").to_pylist(), dtype=object)
    for flag in ("prompt_truncated", "response_truncated"):
        cols[flag] = table.column(flag).to_numpy(zero_copy_only=False).astype(bool)
    for length in ("prompt_length", "response_length"):
        cols[length] = table.column(length).to_numpy(zero_copy_only=False)
    return cols


def _split_stats(rows: np.ndarray, cols: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, Any]:
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
