"""A harder generated task: near-duplicate pairs (one local edit) with label noise of a known rate.

The quickstart's task (:mod:`~lit_prunedpo.data.generated`) corrupts a quarter of the rejected letters and
saturates: held-out accuracy reaches 1.0 early. Here the rejected response is the ordered progression with
**one** letter replaced by a wrong one, so the two responses share everything but one token (the regime of
two responses sampled from one policy), and where that edit sits is a task variable:

* ``edit_at="random"``: anywhere in the response (the tokens before it cancel in the margin, yet a single
  branch or a position sample carries them at full, IPW-inflated weight);
* ``edit_at="start"``: the first letter (nothing shared before the difference).

With probability ``label_noise`` a pair's labels are swapped (the corrupted text is marked chosen), in
training and held-out rows alike. A model that recognises the ordered response perfectly is then right on a
held-out pair with probability ``1 - label_noise``: :func:`best_accuracy`, the ceiling a run can approach.
The same seed gives the same rows; the swap and edit draws use their own generator, so changing
``label_noise`` changes labels only, not texts.
"""

from __future__ import annotations

from typing import Callable, Literal

import datasets
import torch

from lit_prunedpo.data.generated import LETTERS

EditPlace = Literal["random", "start"]


def best_accuracy(label_noise: float) -> float:
    """The expected held-out accuracy of a model that always prefers the ordered response."""
    return 1.0 - label_noise


def edited_pairs(
    num_rows: int = 4096,
    seed: int = 0,
    min_length: int = 8,
    max_length: int = 32,
    max_stride: int = 3,
    edit_at: EditPlace = "random",
    label_noise: float = 0.1,
) -> datasets.Dataset:
    """``num_rows`` rows ``{"prompt", "chosen", "rejected", "swapped"}``: ordered vs. one-edit letter sequences.

    Args:
        num_rows: number of pairs.
        seed: seed of the generator; the same seed gives the same rows.
        min_length: fewest letters in a response.
        max_length: most letters in a response.
        max_stride: strides are drawn from 1..max_stride.
        edit_at: where the one wrong letter goes: ``"random"`` (uniform over the response) or ``"start"``.
        label_noise: probability that a pair's labels are swapped, in [0, 0.5).

    Raises:
        ValueError: an argument is out of range (named in the message).
    """
    if edit_at not in ("random", "start"):
        raise ValueError(f"edit_at must be 'random' or 'start', got {edit_at!r}")

    def edit(ordered: list[int], texts: torch.Generator) -> list[int]:
        n, n_sym = len(ordered), len(LETTERS)
        place = 0 if edit_at == "start" else int(torch.randint(n, (), generator=texts))
        edited = list(ordered)
        edited[place] = (ordered[place] + int(torch.randint(1, n_sym, (), generator=texts))) % n_sym
        return edited

    return letter_pairs(edit, num_rows, seed, min_length, max_length, max_stride, label_noise)


def letter_pairs(
    corrupt: Callable[[list[int], torch.Generator], list[int]],
    num_rows: int,
    seed: int,
    min_length: int,
    max_length: int,
    max_stride: int,
    label_noise: float,
) -> datasets.Dataset:
    """The generated tasks' common frame: per row an ordered letter progression (the chosen response), the
    rejected one made from it by ``corrupt(ordered, generator)`` (letter indices in, letter indices out, drawing
    from the texts' generator), and labels swapped with probability ``label_noise`` (their own generator). The
    arguments are those of :func:`edited_pairs`.

    Raises:
        ValueError: an argument is out of range (named in the message).
    """
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows!r}")
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length!r} and {max_length!r}")
    if not 1 <= max_stride < len(LETTERS):
        raise ValueError(f"max_stride must be in [1, {len(LETTERS)}), got {max_stride!r}")
    if not 0.0 <= label_noise < 0.5:
        raise ValueError(f"label_noise must be in [0, 0.5), got {label_noise!r}")
    texts = torch.Generator().manual_seed(seed)
    labels = torch.Generator().manual_seed(seed + 1_000_003)
    n_sym = len(LETTERS)
    rows: dict[str, list] = {"prompt": [], "chosen": [], "rejected": [], "swapped": []}
    for _ in range(num_rows):
        start = int(torch.randint(n_sym, (), generator=texts))
        stride = int(torch.randint(1, max_stride + 1, (), generator=texts))
        n = int(torch.randint(min_length, max_length + 1, (), generator=texts))
        ordered = [(start + stride * (k + 1)) % n_sym for k in range(n)]
        good, bad = "".join(LETTERS[i] for i in ordered), "".join(LETTERS[i] for i in corrupt(ordered, texts))
        swapped = bool(torch.rand((), generator=labels) < label_noise)
        rows["prompt"].append(f"count from {LETTERS[start]} by {stride}:")
        rows["chosen"].append(bad if swapped else good)
        rows["rejected"].append(good if swapped else bad)
        rows["swapped"].append(swapped)
    return datasets.Dataset.from_dict(rows)
