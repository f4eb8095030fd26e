"""A generated task whose two responses are unrelated: an ordered progression against random letters.

The other end of pair similarity from :mod:`~lit_prunedpo.data.edited` (one wrong letter, near-duplicates):
here the rejected response is a uniformly random letter string of the chosen response's length, so the two
responses share nothing but the prompt and their gradients point in unrelated directions. Labels are swapped
with probability ``label_noise`` as in :mod:`~lit_prunedpo.data.edited`, so the best achievable held-out accuracy
is :func:`~lit_prunedpo.data.edited.best_accuracy` ``(label_noise)``. A random string equal to the ordered one is
redrawn (it would be no preference). The same seed gives the same rows; labels use their own generator.
"""

from __future__ import annotations

import datasets
import torch

from lit_prunedpo.data.generated import LETTERS


def unrelated_pairs(
    num_rows: int = 4096,
    seed: int = 0,
    min_length: int = 8,
    max_length: int = 32,
    max_stride: int = 3,
    label_noise: float = 0.1,
) -> datasets.Dataset:
    """``num_rows`` rows ``{"prompt", "chosen", "rejected", "swapped"}``: ordered vs. random letter sequences.

    Args:
        num_rows: number of pairs.
        seed: seed of the generator; the same seed gives the same rows.
        min_length: fewest letters in a response.
        max_length: most letters in a response.
        max_stride: strides are drawn from 1..max_stride.
        label_noise: probability that a pair's labels are swapped, in [0, 0.5).

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
        other = ordered
        while other == ordered:
            other = torch.randint(n_sym, (n,), generator=texts).tolist()
        good, bad = "".join(LETTERS[i] for i in ordered), "".join(LETTERS[i] for i in other)
        swapped = bool(torch.rand((), generator=labels) < label_noise)
        rows["prompt"].append(f"count from {LETTERS[start]} by {stride}:")
        rows["chosen"].append(bad if swapped else good)
        rows["rejected"].append(good if swapped else bad)
        rows["swapped"].append(swapped)
    return datasets.Dataset.from_dict(rows)
