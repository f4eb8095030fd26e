"""Your own data in the benchmark: ``--data FILE`` read by :class:`~lit_prunedpo.data.PreferenceDataModule`, the
pipeline training runs, and what a report records of it.

The benchmark's batches are the data module's first training batches, in its training order (length-grouped,
seeded by ``--seed``, after its validation hold-out), exactly as ``train_dataloader()`` yields them in a run's first
epoch: the same tokenizer, truncation, BOS/EOS and padding, so that a benchmark on HH-RLHF with SmolLM2 times the
steps training would run. Round ``r`` runs batch ``r``; the data must give at least warm-up + measured steps
batches.

``--tokenizer`` (default: the ``--model``'s own), ``--max-length``, ``--max-prompt-length`` and ``--batch-size``
are the data module's arguments of those names; any other of its ``__init__`` arguments is passed as
``--data-option key=value`` (the value read as YAML: ``max_rows=500``, ``val_fraction=0``, ``add_bos=false``,
``chat_template=template.jinja``), so an option the data module gains (a conversational rendering, say) needs no new
flag here. An unknown key is refused, naming the valid ones.
"""

from __future__ import annotations

import inspect
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench.own_model import file_sha256
from lit_prunedpo.data import PreferenceDataModule

#: The data module's arguments the benchmark's own flags set (``--data-option`` refuses them).
OWN_FLAGS = {"path": "--data", "tokenizer": "--tokenizer", "batch_size": "--batch-size", "max_length": "--max-length",
             "max_prompt_length": "--max-prompt-length", "seed": "--seed"}


def data_module_arguments() -> list[str]:
    """``PreferenceDataModule.__init__``'s arguments that ``--data-option`` may set."""
    names = inspect.signature(PreferenceDataModule.__init__).parameters
    return [n for n in names if n != "self" and n not in OWN_FLAGS]


def parse_data_options(items: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` as keyword arguments of the data module, each value read as a YAML scalar.

    Raises:
        ValueError: an item without ``=``, a key given twice, one a benchmark flag sets, or one the data module does
            not take (naming the valid keys).
    """
    allowed, options = data_module_arguments(), {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"--data-option {item!r}: write key=value (e.g. max_rows=500)")
        if key in OWN_FLAGS:
            raise ValueError(f"--data-option {key}: set it with {OWN_FLAGS[key]}")
        if key not in allowed:
            raise ValueError(f"--data-option {key}: not an argument of PreferenceDataModule; its arguments: "
                             f"{', '.join(allowed)}")
        if key in options:
            raise ValueError(f"--data-option {key} is given twice")
        options[key] = yaml.safe_load(text) if text.strip() else None
    return options


@dataclass(frozen=True)
class DataSpec:
    """What ``--data`` and its options ask for.

    Attributes:
        path: the file (or ``save_to_disk`` folder) of preference pairs.
        tokenizer: a tokenizer name or path (``load_tokenizer``'s), by default the model's.
        batch_size: pairs per batch.
        max_length: most tokens of a prompt plus one response.
        max_prompt_length: most prompt tokens.
        seed: the hold-out's and the training order's seed.
        options: the data module's other arguments (``--data-option``).
    """

    path: str
    tokenizer: str
    batch_size: int = 4
    max_length: int = 512
    max_prompt_length: int = 256
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not Path(self.path).expanduser().exists():
            raise FileNotFoundError(f"--data {self.path}: no such file or folder (give a .jsonl, .jsonl.gz, .json, "
                                    ".parquet or .csv file of preference pairs, or a save_to_disk folder)")
        for name, flag in (("batch_size", "--batch-size"), ("max_length", "--max-length"),
                           ("max_prompt_length", "--max-prompt-length")):
            if getattr(self, name) < 1:
                raise ValueError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if self.max_prompt_length >= self.max_length:
            raise ValueError(f"--max-prompt-length ({self.max_prompt_length}) must be < --max-length "
                             f"({self.max_length}), to leave room for the responses")

    def data_module(self) -> PreferenceDataModule:
        """The data module training would build from these arguments (not yet set up).

        Raises:
            ValueError: naming ``--tokenizer`` or ``--data-option`` when the data module refuses its arguments.
        """
        try:
            return PreferenceDataModule(
                str(Path(self.path).expanduser()), tokenizer=self.tokenizer, batch_size=self.batch_size,
                max_length=self.max_length, max_prompt_length=self.max_prompt_length, seed=self.seed, **self.options,
            )
        except (ValueError, TypeError, OSError) as err:
            raise ValueError(f"--data {self.path} with --tokenizer {self.tokenizer!r} and data options "
                             f"{self.options}: {err}") from err


def data_batches(data: PreferenceDataModule, count: int) -> list[PreferenceBatch]:
    """The data module's first ``count`` training batches, in its training order (it is set up first).

    Raises:
        ValueError: the data gives fewer than ``count`` batches, naming how many it gives.
    """
    data.setup("fit")
    batches = list(itertools.islice(iter(data.train_dataloader()), count))
    if len(batches) < count:
        pairs = data.data_identity()["train_pairs"]
        raise ValueError(
            f"--data {data.path}: {pairs} training pairs make {len(batches)} batch(es) of {data.batch_size}, the "
            f"benchmark runs {count} (warm-up rounds + measured steps, one batch each): lower --steps, --warmup or "
            "--batch-size, or give more pairs"
        )
    return batches


def check_fits(data: PreferenceDataModule, vocab_size: int, positions: int | None) -> None:
    """Refuse data whose tokens or lengths the model cannot take (as training's set-up does).

    Raises:
        ValueError: the tokenizer has more tokens than the model's embedding, or ``--max-length`` is beyond its
            positions.
    """
    if data.vocab_size > vocab_size:
        raise ValueError(f"--tokenizer {data.tokenizer.name_or_path!r} has {data.vocab_size} tokens but the model "
                         f"embeds {vocab_size}: give the model's own tokenizer (leave --tokenizer out)")
    if isinstance(positions, int) and data.max_length > positions:
        raise ValueError(f"--max-length {data.max_length} is beyond the model's {positions} positions "
                         "(config.max_position_embeddings): give at most that")


def data_identity(data: PreferenceDataModule, spec: DataSpec) -> dict[str, Any]:
    """What a report records of the data (the module set up): the file, its SHA-256, the tokenizer, the lengths,
    the options, the pairs and the data module's own fingerprint (the content digests, the tokenizer's hash)."""
    path = Path(spec.path).expanduser()
    fingerprint = data.cache_fingerprint()
    return {
        "path": spec.path, "sha256": file_sha256(path) if path.is_file() else None,
        "tokenizer": spec.tokenizer, "tokenizer_hash": fingerprint.get("tokenizer_hash"),
        "vocab_size": data.vocab_size, "max_length": spec.max_length, "max_prompt_length": spec.max_prompt_length,
        "batch_size": spec.batch_size, "seed": spec.seed, "options": spec.options,
        "format": data.stats.get("format"), "train_pairs": data.data_identity()["train_pairs"],
        "fingerprint": json.loads(json.dumps(fingerprint, default=str)),
    }
