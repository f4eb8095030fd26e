"""The package's own learnable preference task, as text rows: ordered letter sequences beat corrupted ones.

Each row has an explicit prompt such as ``"count from m by 3:"``; the chosen response continues the
progression through the alphabet (``"psvybehknq"``, wrapping after ``z``); the rejected response is the same
text with a fraction of its letters replaced by wrong ones. A model prefers the chosen response once it has
learned to count in steps, which a tiny transformer does in a few hundred DPO steps. Lengths vary, so
padding and prefix pruning are exercised. The rows go through the same tokenizing pipeline as any file, so
the quickstart exercises the real data path; everything is deterministic given the seed.
"""

from __future__ import annotations

import string

import datasets
import torch

LETTERS = string.ascii_lowercase


def progression_pair(
    g: torch.Generator, num_symbols: int, min_length: int, max_length: int, max_stride: int, corruption_rate: float
) -> tuple[int, int, list[int], list[int]]:
    """One pair of the task over symbols ``0..num_symbols-1``: ``(start, stride, ordered, corrupted)``.

    ``ordered`` continues ``start`` in steps of ``stride`` (modulo ``num_symbols``) for ``min_length..max_length``
    symbols; ``corrupted`` replaces a ``corruption_rate`` share of them (at least one) by a wrong symbol.
    """
    start = int(torch.randint(num_symbols, (), generator=g))
    stride = int(torch.randint(1, max_stride + 1, (), generator=g))
    n = int(torch.randint(min_length, max_length + 1, (), generator=g))
    ordered = [(start + stride * (k + 1)) % num_symbols for k in range(n)]
    corrupted = list(ordered)
    for pos in torch.randperm(n, generator=g)[: max(1, round(corruption_rate * n))].tolist():
        # a random *wrong* symbol: shift the right one by 1..num_symbols-1
        corrupted[pos] = (ordered[pos] + int(torch.randint(1, num_symbols, (), generator=g))) % num_symbols
    return start, stride, ordered, corrupted


def generated_pairs(
    num_rows: int = 4096,
    seed: int = 0,
    min_length: int = 8,
    max_length: int = 32,
    max_stride: int = 3,
    corruption_rate: float = 0.25,
) -> datasets.Dataset:
    """``num_rows`` rows ``{"prompt", "chosen", "rejected"}`` of the ordered-vs-corrupted task.

    Args:
        num_rows: number of pairs.
        seed: seed of the generator; the same seed gives the same rows.
        min_length: fewest letters in a response.
        max_length: most letters in a response.
        max_stride: strides are drawn from 1..max_stride.
        corruption_rate: fraction of the rejected response's letters replaced (at least one).
    """
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows!r}")
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length!r} and {max_length!r}")
    if not 1 <= max_stride < len(LETTERS):
        raise ValueError(f"max_stride must be in [1, {len(LETTERS)}), got {max_stride!r}")
    if not 0.0 < corruption_rate <= 1.0:
        raise ValueError(f"corruption_rate must be in (0, 1], got {corruption_rate!r}")
    g = torch.Generator().manual_seed(seed)
    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(num_rows):
        start, stride, ordered, corrupted = progression_pair(g, len(LETTERS), min_length, max_length, max_stride,
                                                             corruption_rate)
        rows["prompt"].append(f"count from {LETTERS[start]} by {stride}:")
        rows["chosen"].append("".join(LETTERS[i] for i in ordered))
        rows["rejected"].append("".join(LETTERS[i] for i in corrupted))
    return datasets.Dataset.from_dict(rows)
