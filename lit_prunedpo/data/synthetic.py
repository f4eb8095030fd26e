"""A learnable preference task the package generates itself: ordered sequences beat corrupted ones.

Each pair's prompt is ``[BOS, start, stride]``; the chosen response continues the arithmetic progression
``start + stride, start + 2 stride, ...`` (modulo the content vocabulary) and ends with EOS; the rejected
response is the same sequence with a fraction of its tokens replaced by random wrong ones. A model learns to
prefer the chosen response by learning the progression, which a tiny transformer does in a few hundred steps.
Responses have random lengths, so prefix pruning and padding are exercised. Everything is deterministic
given ``seed``; the validation pairs are drawn from a separate stream. The training order is seeded by
``seed + epoch``, sharded over DDP ranks, and resumes mid-epoch from a checkpoint.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_prunedpo.batch import PreferenceBatch, collate_pairs
from lit_prunedpo.data.generated import progression_pair
from lit_prunedpo.data.resumable import ResumableDataMixin, ResumableSampler, distributed_kwargs

PAD, BOS, EOS = 0, 1, 2
FIRST_CONTENT = 3


class SyntheticPreferenceData(ResumableDataMixin, L.LightningDataModule):
    """Generated pairs "ordered vs. corrupted" for tests, benchmarks and the quickstart.

    Args:
        vocab_size: token ids used, specials (pad 0, bos 1, eos 2) included; the model's vocabulary must be
            at least this large.
        num_train: training pairs.
        num_val: validation pairs.
        min_response_length: shortest response, EOS included (>= 2).
        max_response_length: longest response, EOS included.
        max_stride: strides are drawn from 1..max_stride.
        corruption_rate: fraction of a rejected response's content tokens replaced (at least one).
        batch_size: pairs per training and validation batch.
        seed: seed of the generated data.
    """

    def __init__(
        self,
        vocab_size: int = 64,
        num_train: int = 2048,
        num_val: int = 256,
        min_response_length: int = 8,
        max_response_length: int = 32,
        max_stride: int = 3,
        corruption_rate: float = 0.25,
        batch_size: int = 16,
        seed: int = 1234,
    ) -> None:
        super().__init__()
        if vocab_size < FIRST_CONTENT + 4:
            raise ValueError(f"vocab_size must be >= {FIRST_CONTENT + 4}, got {vocab_size!r}")
        if not 2 <= min_response_length <= max_response_length:
            raise ValueError(
                f"need 2 <= min_response_length <= max_response_length, got {min_response_length!r} and "
                f"{max_response_length!r}"
            )
        if not 1 <= max_stride < vocab_size - FIRST_CONTENT:
            raise ValueError(f"max_stride must be in [1, {vocab_size - FIRST_CONTENT}), got {max_stride!r}")
        if not 0.0 < corruption_rate <= 1.0:
            raise ValueError(f"corruption_rate must be in (0, 1], got {corruption_rate!r}")
        for name, value in (("num_train", num_train), ("num_val", num_val), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        self.vocab_size = vocab_size
        self.num_train, self.num_val = num_train, num_val
        self.min_response_length, self.max_response_length = min_response_length, max_response_length
        self.max_stride = max_stride
        self.corruption_rate = corruption_rate
        self.batch_size = batch_size
        self.seed = seed
        self.pad_token_id = PAD
        self.train_pairs: list[dict[str, Any]] = []
        self.val_pairs: list[dict[str, Any]] = []

    def make_pairs(self, count: int, stream: int, first_index: int = 0) -> list[dict[str, Any]]:
        g = torch.Generator().manual_seed(self.seed * 1000 + stream)
        content = self.vocab_size - FIRST_CONTENT
        pairs = []
        for index in range(count):
            # lengths count the EOS that ends every response
            start, stride, ordered, corrupted = progression_pair(
                g, content, self.min_response_length - 1, self.max_response_length - 1, self.max_stride,
                self.corruption_rate,
            )
            ordered = [t + FIRST_CONTENT for t in ordered]
            corrupted = [t + FIRST_CONTENT for t in corrupted]
            pairs.append(
                {
                    "prompt_ids": [BOS, start + FIRST_CONTENT, stride + FIRST_CONTENT],
                    "chosen_ids": ordered + [EOS],
                    "rejected_ids": corrupted + [EOS],
                    "index": first_index + index,
                }
            )
        return pairs

    def setup(self, stage: str | None = None) -> None:
        if not self.train_pairs:
            self.train_pairs = self.make_pairs(self.num_train, stream=0)
            # Validation is numbered after training, so that `index` keys one reference cache over both.
            self.val_pairs = self.make_pairs(self.num_val, stream=1, first_index=self.num_train)

    def cache_fingerprint(self) -> dict[str, Any]:
        """What a reference-logprob cache of these pairs depends on (``lit_prunedpo.reference.ReferenceData``): the
        generator's arguments (the batch size changes nothing)."""
        names = ("vocab_size", "num_train", "num_val", "min_response_length", "max_response_length",
                 "max_stride", "corruption_rate", "seed")
        return {"class": f"{type(self).__module__}.{type(self).__qualname__}", **{n: getattr(self, n) for n in names}}

    def reference_batches(self, batch_size: int | None = None) -> Iterator[PreferenceBatch]:
        """Every training then validation pair once, unshuffled, for a reference-logprob cache."""
        self.setup("fit")
        pairs, size = self.train_pairs + self.val_pairs, batch_size or self.batch_size
        for start in range(0, len(pairs), size):
            yield collate_pairs(pairs[start : start + size], pad_id=PAD)

    def train_dataloader(self) -> DataLoader:
        sampler = ResumableSampler(self.train_pairs, seed=self.seed, drop_last=True,
                                   **distributed_kwargs(self._trainer_or_none()))
        return DataLoader(
            self.train_pairs, batch_size=self.batch_size, sampler=self.resume(sampler, self.batch_size),
            collate_fn=partial(collate_pairs, pad_id=PAD), drop_last=True,
        )

    def _trainer_or_none(self) -> Any:
        return getattr(self, "trainer", None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_pairs, batch_size=self.batch_size, collate_fn=partial(collate_pairs, pad_id=PAD))

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
