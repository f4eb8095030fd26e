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

from lit_prunedpo.data.edited import letter_pairs
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

    def unrelated(ordered: list[int], texts: torch.Generator) -> list[int]:
        other = ordered
        while other == ordered:  # an equal string would be no preference
            other = torch.randint(len(LETTERS), (len(ordered),), generator=texts).tolist()
        return other

    return letter_pairs(unrelated, num_rows, seed, min_length, max_length, max_stride, label_noise)
