"""Data position in checkpoints, so that a run resumed mid-epoch sees the batches an uninterrupted run would.

Lightning restores weights, optimizer and loop counters but, for an ordinary DataLoader, restarts the epoch's
data from its first batch. Two small pieces fix that without a stateful-DataLoader dependency:

* :class:`ResumableSampler` is a ``DistributedSampler`` (so Lightning leaves it in place under DDP; it shards
  by the trainer's ``distributed_sampler_kwargs`` itself) with an epoch-seeded order and the ability to skip
  the first samples of one given epoch.
* :class:`ResumableDataMixin` gives a LightningDataModule ``state_dict``/``load_state_dict`` (Lightning saves
  them in every checkpoint) holding the epoch and the number of training batches handed to the model in it.
  It counts in ``on_before_batch_transfer``, which runs when the loop consumes a batch, not when Lightning's
  fetcher prefetches the next one.

A data module that can say what its data is (``data_identity() -> dict`` with a ``content`` entry, e.g.
:meth:`~lit_prunedpo.data.PreferenceDataModule.data_identity`) stores that in the checkpoint too, and a
resume whose data content differs is refused: the saved position would count batches of other pairs.
Setting the module's ``resume_with_changed_data`` attribute (a constructor argument) accepts it, said in the log.
"""

from __future__ import annotations

from typing import Any, Iterator

from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DistributedSampler

from lit_prunedpo.warning_scope import IgnoredWarning


class ResumableSampler(DistributedSampler):
    """Epoch-seeded shuffled indices (``seed + epoch``), sharded over ranks, able to resume mid-epoch.

    Subclasses that order indices differently override :meth:`indices`.
    """

    def __init__(self, dataset: Any, num_replicas: int = 1, rank: int = 0, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.skip_epoch: int | None = None
        self.skip_samples = 0

    def indices(self) -> Iterator[int]:
        """This rank's indices for ``self.epoch``, before any skip."""
        return super().__iter__()

    def resume_at(self, epoch: int, samples: int) -> None:
        """Skip the first ``samples`` of this rank's indices the next time epoch ``epoch`` is iterated."""
        self.skip_epoch, self.skip_samples = int(epoch), int(samples)

    def __iter__(self) -> Iterator[int]:
        skip = self.skip_samples if self.skip_epoch == self.epoch else 0
        self.skip_epoch, self.skip_samples = None, 0
        for i, index in enumerate(self.indices()):
            if i >= skip:
                yield index


def distributed_kwargs(trainer: Any) -> dict[str, int]:
    """``num_replicas`` and ``rank`` of the running strategy (1 and 0 without one)."""
    kwargs = getattr(trainer, "distributed_sampler_kwargs", None) if trainer is not None else None
    if not kwargs:
        return {"num_replicas": 1, "rank": 0}
    return {"num_replicas": int(kwargs.get("num_replicas", 1)), "rank": int(kwargs.get("rank", 0))}


class ResumableDataMixin:
    """Mix into a LightningDataModule whose training loader uses a :class:`ResumableSampler`.

    The module must call :meth:`resume` on the sampler it builds in ``train_dataloader``.
    """

    _position: tuple[int, int] = (0, 0)  # (epoch, training batches consumed in it)
    _resume_position: tuple[int, int] | None = None
    _resume_warning: IgnoredWarning | None = None

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.training:
            if self._resume_warning is not None:
                self._resume_warning.close()
            epoch, consumed = self._position
            self._position = (trainer.current_epoch, consumed + 1 if epoch == trainer.current_epoch else 1)
        return batch

    def state_dict(self) -> dict[str, Any]:
        epoch, consumed = self._position
        state: dict[str, Any] = {"epoch": epoch, "batches_consumed": consumed}
        if hasattr(self, "data_identity"):
            state["data"] = self.data_identity()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_same_data(state.get("data"))
        self._resume_position = (int(state["epoch"]), int(state["batches_consumed"]))
        self._position = self._resume_position
        # Lightning only knows stateful *DataLoaders* and would warn that this mid-epoch resume is unreliable;
        # here the data module restores the position itself, so that one warning is wrong. Lightning warns when
        # the first epoch starts: ignored until the first training batch (or teardown), then the filters are back.
        self._resume_warning = IgnoredWarning("You're resuming from a checkpoint that ended before the epoch ended")
        self._resume_warning.open()

    def teardown(self, stage: str) -> None:
        if self._resume_warning is not None:
            self._resume_warning.close()
        super().teardown(stage)  # type: ignore[misc]

    def _check_same_data(self, saved: dict[str, Any] | None) -> None:
        if saved is None or not hasattr(self, "data_identity"):
            return
        now = self.data_identity()
        if saved.get("content") == now.get("content"):
            return
        what = (f"the checkpoint was written while training on {saved.get('source')} (content {saved.get('content')}, "
                f"{saved.get('train_pairs')} training pairs) but this run reads {now.get('source')} (content "
                f"{now.get('content')}, {now.get('train_pairs')} training pairs)")
        if getattr(self, "resume_with_changed_data", False):
            rank_zero_warn(f"resuming with changed data, as asked (resume_with_changed_data=true): {what}")
            return
        raise ValueError(
            f"refusing to resume: {what}; its data position would skip batches of other pairs. Resume with the "
            "same data, start a fresh run, or pass --data.init_args.resume_with_changed_data=true to accept it"
        )

    def resume(self, sampler: ResumableSampler, batch_size: int) -> ResumableSampler:
        """Arm ``sampler`` to continue where the loaded checkpoint stopped (once)."""
        if self._resume_position is not None:
            epoch, consumed = self._resume_position
            sampler.resume_at(epoch, consumed * batch_size)
            self._resume_position = None
        return sampler
