"""The one-edit task: exactly one differing letter, where it is asked to be, and labels swapped at the stated rate."""

from __future__ import annotations

import math

import pytest

from lit_prunedpo.data.edited import best_accuracy, edited_pairs
from lit_prunedpo.data.generated import LETTERS


def _ordered(prompt: str, text: str) -> bool:
    start, stride = LETTERS.index(prompt.split()[2]), int(prompt.split()[4].rstrip(":"))
    return all(LETTERS[(start + stride * (k + 1)) % 26] == c for k, c in enumerate(text))


@pytest.mark.parametrize("edit_at", ["random", "start"])
def test_one_local_edit(edit_at):
    rows = edited_pairs(num_rows=400, seed=3, edit_at=edit_at, label_noise=0.0)
    places = set()
    for row in rows:
        diff = [i for i, (a, b) in enumerate(zip(row["chosen"], row["rejected"], strict=True)) if a != b]
        assert len(diff) == 1, row
        assert _ordered(row["prompt"], row["chosen"]) and not _ordered(row["prompt"], row["rejected"])
        places.add(diff[0])
    assert places == {0} if edit_at == "start" else len(places) > 10


def test_label_noise_rate_and_best_accuracy():
    rate, n = 0.1, 1500
    rows = edited_pairs(num_rows=n, seed=0, label_noise=rate)
    swapped = [not _ordered(r["prompt"], r["chosen"]) for r in rows]
    assert swapped == rows["swapped"]
    assert abs(sum(swapped) / n - rate) < 5 * math.sqrt(rate * (1 - rate) / n)
    assert best_accuracy(rate) == pytest.approx(0.9)
    # the noise changes labels only: the same texts in the same order
    clean = edited_pairs(num_rows=n, seed=0, label_noise=0.0)
    assert [sorted((r["chosen"], r["rejected"])) for r in rows] == [sorted((r["chosen"], r["rejected"])) for r in clean]


@pytest.mark.parametrize(
    "kwargs, name",
    [({"num_rows": 0}, "num_rows"), ({"label_noise": 0.5}, "label_noise"), ({"edit_at": "end"}, "edit_at"),
     ({"min_length": 5, "max_length": 4}, "min_length"), ({"max_stride": 26}, "max_stride")],
)
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        edited_pairs(**kwargs)
