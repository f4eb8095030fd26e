"""``PreferenceDataModule``: preference pairs from a file or the hub, tokenized once, batched as ``PreferenceBatch``.

The module wires three units and holds their results: :mod:`~lit_prunedpo.data.splits` builds the training and
validation pairs (load, detect the format, tokenize, apply the bad-row policy, hold out a validation share;
``index`` unique across both splits), :mod:`~lit_prunedpo.data.loaders` builds the DataLoaders (length-grouped
training order, :mod:`~lit_prunedpo.data.length_grouped`), and two short methods implement
:class:`~lit_prunedpo.reference.ReferenceData` for a reference-logprob cache (the pairs in a fixed order and
what they depend on).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Iterator, Literal

import datasets
import numpy as np
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from lit_prunedpo.batch import PreferenceBatch, collate_pairs
from lit_prunedpo.data.formats import Columns
from lit_prunedpo.data.loaders import pair_loader, shortest_first, training_sampler
from lit_prunedpo.data.resumable import ResumableDataMixin
from lit_prunedpo.data.splits import SplitBuilder, single_source_val_split
from lit_prunedpo.data.lengths import format_stats
from lit_prunedpo.data.tokenize import load_tokenizer, read_chat_template, tokenizer_fingerprint


class PreferenceDataModule(ResumableDataMixin, LightningDataModule):
    """Preference pairs (prompt, chosen, rejected) for DPO, batched as :class:`~lit_prunedpo.batch.PreferenceBatch`.

    Reads TRL's formats: explicit prompt ``{"prompt", "chosen", "rejected"}`` strings; implicit
    prompt ``{"chosen", "rejected"}`` full dialogues whose prompt is their shared prefix up to and
    including the last ``"\\n\\nAssistant:"`` (HH-RLHF); conversational, with message lists rendered by the
    tokenizer's chat template (roles system, developer, user, assistant, tool; each response starts with the
    assistant's message), with a ``prompt`` column or without one: then the prompt is the run of whole messages
    both conversations start with (TRL's ``extract_prompt``). The format is detected from the column types;
    ``dialogues="messages"`` reads HH-RLHF's text dialogues as chat messages instead.

    Tokenization runs once in a ``datasets.map`` cached by fingerprint. Prompts keep their end
    (left-truncated to ``max_prompt_length``) and get BOS in front when the tokenizer has one; a prompt
    that tokenizes to nothing becomes the single token BOS, else EOS, else pad. Plain-text responses
    get EOS appended and keep their start, so that prompt + response <= ``max_length``. Pairs left with
    an empty response are dropped and counted in :attr:`stats`.

    Args:
        path: Where the pairs are. None (the default) is the package's generated task, ordered vs. corrupted
            letter sequences (:mod:`~lit_prunedpo.data.generated`, ``max_rows`` pairs or 4096), read
            through the same pipeline as a file. Otherwise a local ``.json``, ``.jsonl``, ``.jsonl.gz``,
            ``.parquet`` or ``.csv`` file (JSON: one row object per line, an array of row objects, or one object of
            equally long column lists, :mod:`~lit_prunedpo.data.columnar`), a directory written by
            ``Dataset.save_to_disk``/``DatasetDict.save_to_disk``, or a hub dataset name
            (``datasets.load_dataset(path, split=...)``).
        tokenizer: Tokenizer name or path for ``AutoTokenizer.from_pretrained``; ``"byt5"`` builds the
            byte-level ``ByT5Tokenizer()``, which needs no files.
        train_split: Split to train on. A single file or saved ``Dataset`` has no splits and is used whole.
        val_split: Split to validate on; None holds out ``val_fraction`` of the training split instead. A single
            file or saved ``Dataset`` has no splits: a ``val_split`` set for it is replaced by the held-out
            ``val_fraction``, with a warning (``configs/hh_rlhf.yaml``'s ``test`` with a local file).
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
        dialogues: How text dialogues without a prompt column (HH-RLHF's ``"\\n\\nHuman: ...\\n\\nAssistant: ..."``)
            are read. "text" (default): as text, the prompt being the text up to the last ``"\\n\\nAssistant:"``.
            "messages": as chat messages, rendered with the tokenizer's chat template as TRL renders conversational
            data (for an instruct model): each Human turn a user message, each Assistant turn an assistant one, the
            last assistant turn the response (:func:`~lit_prunedpo.data.formats.dialogue_messages`); a dialogue
            that does not split into turns, or whose prompt differs from the other's, is a bad row. Other formats
            are refused with "messages".
        on_bad_row: What a bad row (missing field, wrong type, empty string, identical responses or identical
            token ids after truncation, no shared prompt, a message role that is unknown or out of place, an
            unreadable JSON line) does: "error" stops with one message naming the source, row, field and kind;
            "skip" drops such rows and counts them by kind in ``stats``.
        group_by_length: Order training pairs so that each batch holds similar lengths (less padding).
        num_proc: Processes for the tokenizing ``datasets.map``; None uses the main process.
        num_workers: DataLoader worker processes.
        max_rows: Keep only the first N rows of each loaded split (for quick runs), before the hold-out.
        add_bos: Put the tokenizer's BOS in front of every prompt (default). ``False`` is TRL's layout for
            decoder-only models, where ``max_length`` then holds one more real token.
        truncation: "keep_start" (default; also TRL's default ``truncation_mode`` since TRL 0.29) cuts the
            responses' ends to fit ``max_length``; "keep_end" (TRL's default before 0.29, deprecated there since
            1.1) first cuts the prompt's beginning so that prompt + the longer response fit.
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
        dialogues: Literal["text", "messages"] = "text",
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
        _check_args(
            truncation=truncation, val_fraction=val_fraction, batch_size=batch_size, val_batch_size=val_batch_size,
            max_length=max_length, max_prompt_length=max_prompt_length, on_bad_row=on_bad_row, num_proc=num_proc,
            num_workers=num_workers, max_rows=max_rows, columns=(prompt_column, chosen_column, rejected_column),
            dialogues=dialogues,
        )
        self.add_bos, self.truncation, self.dialogues = add_bos, truncation, dialogues
        self.save_hyperparameters()
        self.path, self.train_split = path, train_split
        self.val_split, single_source = single_source_val_split(path, val_split, val_fraction)
        if single_source:
            rank_zero_warn(single_source)
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
            self.tokenizer.chat_template = read_chat_template(chat_template)
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

    def split_builder(self) -> SplitBuilder:
        """What builds this module's pairs, from its current arguments (:mod:`~lit_prunedpo.data.splits`)."""
        return SplitBuilder(
            path=self.path, tokenizer=self.tokenizer, columns=self.columns, train_split=self.train_split,
            val_split=self.val_split, val_fraction=self.val_fraction, seed=self.seed, max_length=self.max_length,
            max_prompt_length=self.max_prompt_length, on_bad_row=self.on_bad_row, num_proc=self.num_proc,
            max_rows=self.max_rows, add_bos=self.add_bos, truncation=self.truncation, dialogues=self.dialogues,
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
            built = self.split_builder().build()
        finally:
            # Reached even when the build fails (bad data): the other processes then build and fail with the same
            # message themselves, instead of with gloo's "Connection closed by peer" while waiting here.
            if strategy is not None and trainer.local_rank == 0:
                strategy.barrier("lit_prunedpo.data.tokenize")
        self.train_dataset, self.val_dataset, self._train_lengths = built.train, built.val, built.train_lengths
        self.stats, self._content = built.stats, built.content
        rank_zero_info(format_stats(self.stats))
        for warning in self.stats["warnings"]:
            rank_zero_warn(warning)

    # -- lit_prunedpo.reference.ReferenceData, for a reference-logprob cache ------------------------------

    def cache_fingerprint(self) -> dict[str, Any]:
        """What a reference-logprob cache of these pairs depends on."""
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
        return {"source": self.split_builder().source_name(self.train_split),
                "content": dict(sorted(self._content.items())), "train_pairs": len(self.train_dataset)}

    def reference_batches(self, batch_size: int | None = None) -> Iterator[PreferenceBatch]:
        """Every training then validation pair once, unshuffled, shortest first within each split (less
        padding, faster build), for a reference-logprob cache."""
        self.setup("fit")
        return shortest_first((self.train_dataset, self.val_dataset), batch_size or self.val_batch_size,
                              self._collate())

    def _collate(self) -> functools.partial:
        return functools.partial(collate_pairs, pad_id=self.pad_token_id)

    def _require_setup(self) -> None:
        if self.train_dataset is None or self.val_dataset is None:
            raise RuntimeError("PreferenceDataModule.setup() must run before its dataloaders are requested")

    def train_dataloader(self) -> DataLoader:
        """Training pairs, length-grouped (or shuffled) with an epoch-seeded order."""
        self._require_setup()
        assert self.train_dataset is not None and self._train_lengths is not None
        sampler = training_sampler(self.train_dataset, self._train_lengths, self.batch_size,
                                   group_by_length=self.group_by_length, seed=self.seed,
                                   trainer=getattr(self, "trainer", None))
        return pair_loader(self.train_dataset, self.batch_size, self._collate(), self.num_workers,
                           sampler=self.resume(sampler, self.batch_size))

    def val_dataloader(self) -> DataLoader | list:
        """Validation pairs in dataset order; none (an empty list: Lightning then skips validation) with
        ``val_fraction: 0``."""
        self._require_setup()
        if self.split_builder().no_validation:
            return []
        return pair_loader(self.val_dataset, self.val_batch_size, self._collate(), self.num_workers)

    def test_dataloader(self) -> DataLoader:
        """The validation pairs: this module reads two splits. To test on a held-out split, name it
        ``val_split`` in a config used with ``lit-prunedpo test``."""
        source = self.split_builder().source_name(self.val_split or self.train_split)
        rank_zero_info(f"testing on the validation pairs of {source}")
        return self.val_dataloader()


def _check_args(
    *,
    truncation: str,
    val_fraction: float,
    batch_size: int,
    val_batch_size: int | None,
    max_length: int,
    max_prompt_length: int,
    on_bad_row: str,
    num_proc: int | None,
    num_workers: int,
    max_rows: int | None,
    columns: tuple[str, str, str],
    dialogues: str,
) -> None:
    """Fail fast on arguments out of range, naming the argument."""
    if truncation not in ("keep_start", "keep_end"):
        raise ValueError(f"truncation must be 'keep_start' or 'keep_end', got {truncation!r}")
    if dialogues not in ("text", "messages"):
        raise ValueError(f"dialogues must be 'text' or 'messages', got {dialogues!r}")
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
    if len(set(columns)) < 3:
        prompt_column, chosen_column, rejected_column = columns
        raise ValueError(
            f"prompt_column, chosen_column and rejected_column must differ, got "
            f"{prompt_column!r}, {chosen_column!r}, {rejected_column!r}"
        )
