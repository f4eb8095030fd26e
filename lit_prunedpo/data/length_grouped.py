"""An index sampler that puts pairs of similar length into the same batch, so padding wastes little.

Each epoch: a seeded random permutation is cut into mega-batches of ~50 batches, each mega-batch is
sorted by length and cut into batches, and the batch order is shuffled (the batch holding the longest
pair goes first, so an out-of-memory shows at step 0, not hours in). The DataLoader then batches the
yielded indices sequentially with the same ``batch_size``.

Why it is a :class:`~torch.utils.data.DistributedSampler`: under DDP Lightning would otherwise wrap a
custom sampler in ``DistributedSamplerWrapper`` with ``shuffle=True`` (always, for training), which
re-permutes the positions of our order and destroys the grouping. As a ``DistributedSampler`` it is
left in place (``_requires_distributed_sampler`` skips those), and shards itself: every global batch
of ``batch_size * num_replicas`` similar pairs is split into one contiguous piece per rank, so all ranks
see similar lengths at the same step and yield the same number of batches. Lightning's fit loop calls
``set_epoch`` on it each epoch. As a :class:`~lit_prunedpo.data.resumable.ResumableSampler` it can skip
the batches a checkpointed run already consumed.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch
from lit_prunedpo.data.resumable import ResumableSampler


class LengthGroupedSampler(ResumableSampler):
    """Yield dataset indices in length-grouped, epoch-shuffled order.

    Args:
        lengths: a length per dataset row (e.g. prompt tokens + longest response tokens).
        batch_size: the per-rank batch size the DataLoader uses.
        mega_batch_size: batches per sorted group: larger groups pad less but shuffle less.
        seed: base seed; the epoch's order depends only on ``seed + epoch``.
        num_replicas: number of ranks sharing the data (1 without DDP).
        rank: this rank.

    Example:
        >>> sampler = LengthGroupedSampler([5, 1, 9, 3], batch_size=2)
        >>> sorted(sampler)
        [0, 1, 2, 3]
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        mega_batch_size: int = 50,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if batch_size < 1 or mega_batch_size < 1:
            raise ValueError(f"batch_size and mega_batch_size must be >= 1, got {batch_size}, {mega_batch_size}")
        if len(lengths) == 0:
            raise ValueError("LengthGroupedSampler needs at least one row")
        # The base class only needs the dataset's length; passing num_replicas/rank keeps it off torch.distributed.
        super().__init__(lengths, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.batch_size = batch_size
        self.mega_batch_size = mega_batch_size

    def _global_batches(self) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g)
        # Like DistributedSampler: repeat a few rows so every rank gets the same number of samples.
        padding = self.total_size - len(order)
        if padding:
            order = torch.cat([order, order.repeat(math.ceil(padding / len(order)))[:padding]])
        global_batch = self.batch_size * self.num_replicas
        mega = global_batch * self.mega_batch_size
        batches: list[torch.Tensor] = []
        for start in range(0, len(order), mega):
            group = order[start : start + mega]
            group = group[torch.argsort(self.lengths[group], descending=True, stable=True)]
            batches.extend(group.split(global_batch))
        # Only the very last batch can be short; keep it last so every rank's batches stay aligned.
        tail = [batches.pop()] if len(batches[-1]) < global_batch else []
        if batches:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
            longest = max(range(len(batches)), key=lambda i: int(self.lengths[batches[i]].max()))
            batches.insert(0, batches.pop(longest))
        return batches + tail

    def indices(self) -> Iterator[int]:
        for batch in self._global_batches():
            piece = len(batch) // self.num_replicas
            yield from batch[self.rank * piece : (self.rank + 1) * piece].tolist()

    def __len__(self) -> int:
        return self.num_samples
