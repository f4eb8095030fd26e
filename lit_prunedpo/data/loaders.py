"""DataLoaders over tokenized pairs: the training order (length-grouped or shuffled, sharded over ranks,
resumable), evaluation in dataset order, and every pair once shortest first (for a reference cache).

Sharding reads the trainer's ``distributed_sampler_kwargs`` through
:func:`~lit_prunedpo.data.resumable.distributed_kwargs`; the samplers are ``DistributedSampler`` subclasses, so
Lightning leaves them in place.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import datasets
import numpy as np
import pyarrow.compute as pc
from torch.utils.data import DataLoader, Sampler

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.data.length_grouped import LengthGroupedSampler
from lit_prunedpo.data.resumable import ResumableSampler, distributed_kwargs

Collate = Callable[[list[dict[str, Any]]], PreferenceBatch]


def training_sampler(dataset: datasets.Dataset, lengths: np.ndarray, batch_size: int, *, group_by_length: bool,
                     seed: int, trainer: Any | None) -> ResumableSampler:
    """This rank's epoch-seeded training order: batches of similar ``lengths`` when ``group_by_length``, else
    shuffled; sharded by ``trainer``'s strategy (one replica without a trainer)."""
    shard = distributed_kwargs(trainer)
    if group_by_length:
        return LengthGroupedSampler(lengths.tolist(), batch_size, seed=seed, **shard)
    return ResumableSampler(dataset, seed=seed, **shard)


def pair_loader(dataset: datasets.Dataset, batch_size: int, collate: Collate, num_workers: int = 0,
                sampler: Sampler | None = None) -> DataLoader:
    """Batches of ``dataset`` in ``sampler``'s order, or in dataset order without one."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )


def shortest_first(splits: Sequence[datasets.Dataset], batch_size: int, collate: Collate) -> Iterator[PreferenceBatch]:
    """Every pair of every split once, unshuffled, split after split, shortest first within each (less padding)."""
    for ds in splits:
        table = ds.with_format("arrow")[:]  # applies the split's row selection
        prompt, chosen, rejected = (pc.list_value_length(table.column(c)).to_numpy(zero_copy_only=False)
                                    for c in ("prompt_ids", "chosen_ids", "rejected_ids"))
        order = np.argsort(prompt + np.maximum(chosen, rejected), kind="stable")
        for start in range(0, len(order), batch_size):
            columns = ds[order[start : start + batch_size].tolist()]
            yield collate([dict(zip(columns, row)) for row in zip(*columns.values())])
