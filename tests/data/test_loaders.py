"""The loader units: every pair once shortest first (what a reference cache reads), and the training order
sharded by the trainer's distributed arguments."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lit_prunedpo.data.loaders import shortest_first, training_sampler
from lit_prunedpo.data.preference import PreferenceDataModule


def _module() -> PreferenceDataModule:
    dm = PreferenceDataModule(tokenizer="byt5", max_length=64, max_prompt_length=24, max_rows=40, batch_size=4,
                              val_fraction=0.25)
    dm.setup("fit")
    return dm


def test_shortest_first_yields_every_pair_once_by_length_within_each_split() -> None:
    dm = _module()
    batches = list(shortest_first((dm.train_dataset, dm.val_dataset), 3, dm._collate()))
    index = np.concatenate([b.index.numpy() for b in batches])
    assert sorted(index.tolist()) == sorted(list(dm.train_dataset["index"]) + list(dm.val_dataset["index"]))
    assert all(b.num_pairs <= 3 for b in batches)
    length = {}
    for ds in (dm.train_dataset, dm.val_dataset):
        for row in ds:
            length[row["index"]] = len(row["prompt_ids"]) + max(len(row["chosen_ids"]), len(row["rejected_ids"]))
    n_train = len(dm.train_dataset)
    # training pairs first, then validation
    assert set(index[:n_train].tolist()) == set(list(dm.train_dataset["index"]))
    for part in (index[:n_train], index[n_train:]):
        lengths = [length[i] for i in part.tolist()]
        assert lengths == sorted(lengths)


def test_training_sampler_shards_over_the_trainer_replicas() -> None:
    dm = _module()
    shards = []
    for rank in (0, 1):
        trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": 2, "rank": rank})
        for grouped in (True, False):
            sampler = training_sampler(dm.train_dataset, dm._train_lengths, 4, group_by_length=grouped, seed=0,
                                       trainer=trainer)
            assert (sampler.num_replicas, sampler.rank) == (2, rank)
        shards.append(set(sampler))
    assert shards[0] | shards[1] == set(range(len(dm.train_dataset)))
    alone = training_sampler(dm.train_dataset, dm._train_lengths, 4, group_by_length=True, seed=0, trainer=None)
    assert (alone.num_replicas, alone.rank) == (1, 0)
