"""The split builder on its own, without a data module: what it yields, how pairs are numbered, what it records."""

from __future__ import annotations

import pytest
from transformers import ByT5Tokenizer

from lit_prunedpo.data.formats import Columns
from lit_prunedpo.data.splits import SplitBuilder


def _builder(**kwargs) -> SplitBuilder:
    args = dict(path=None, tokenizer=ByT5Tokenizer(), columns=Columns("prompt", "chosen", "rejected"), max_rows=30,
                max_length=64, max_prompt_length=24, val_fraction=0.2)
    return SplitBuilder(**{**args, **kwargs})


def test_held_out_share_keeps_the_training_numbering_and_is_recorded() -> None:
    splits = _builder().build()
    train, val = list(splits.train["index"]), list(splits.val["index"])
    assert (len(train), len(val)) == (24, 6)
    assert sorted(train + val) == list(range(30)) and not set(train) & set(val)
    assert splits.stats["train"]["pairs"] == 24 and splits.stats["val"]["pairs"] == 6
    assert list(splits.content) == ["train"] and splits.content["train"]
    assert len(splits.train_lengths) == 24 and splits.train_lengths.min() > 0


def test_no_validation_and_names() -> None:
    builder = _builder(val_fraction=0.0)
    assert builder.no_validation and builder.source_name("train") == "the generated task"
    splits = builder.build()
    assert len(splits.train) == 30 and len(splits.val) == 0
    with pytest.raises(ValueError, match="holds a single split, so val_split='test' cannot be read"):
        _builder(val_split="test").build()


def test_one_row_says_how_to_train_on_it_and_trains_without_validation() -> None:
    with pytest.raises(ValueError) as caught:
        _builder(max_rows=1).build()
    assert str(caught.value) == (
        "the generated task: 1 row cannot be split into training and validation (val_fraction 0.2 holds out at least "
        "one row and leaves one to train on): add rows, or train on it without validation: val_fraction=0 "
        "(--data.init_args.val_fraction 0)")
    splits = _builder(max_rows=1, val_fraction=0.0).build()  # the way it names
    assert (len(splits.train), len(splits.val)) == (1, 0)
