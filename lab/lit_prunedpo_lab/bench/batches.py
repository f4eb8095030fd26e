"""The batches the benchmark times: synthetic preference pairs of a preset's shape.

:func:`make_batches` gives ``count`` batches of ``preset.batch_size`` pairs: the synthetic task's pairs with
responses within ``preset.response_length`` (:class:`~lit_prunedpo.data.synthetic.SyntheticPreferenceData`), or,
for a preset with length tables (``preset.lengths``, e.g. HH-RLHF's quantiles), prompt, chosen and rejected lengths
drawn from those tables and grouped by length as the training data module groups them. :func:`round_batches` gives
a benchmark's batches: those, in the measured model's vocabulary, or ``--data``'s (the data module's own,
:mod:`lit_prunedpo_lab.bench.own_data`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from torch import nn

from lit_prunedpo.batch import PreferenceBatch, collate_pairs
from lit_prunedpo_lab.bench.own_data import check_fits, data_batches
from lit_prunedpo_lab.bench.presets import Preset
from lit_prunedpo.data import BOS, EOS, PAD, PreferenceDataModule, SyntheticPreferenceData


def round_batches(preset: Preset, count: int, seed: int, model: nn.Module,
                  data: PreferenceDataModule | None = None) -> list[PreferenceBatch]:
    """The ``count`` batches of the benchmark's rounds: ``data``'s first training batches (checked to fit ``model``),
    else :func:`make_batches` with the tokens drawn within ``model``'s embedding (a preset's own vocabulary).

    Raises:
        ValueError: ``data``'s tokens or lengths do not fit ``model``, or it gives fewer than ``count`` batches.
    """
    vocab = model.get_input_embeddings().num_embeddings
    if data is not None:
        check_fits(data, vocab, getattr(model.config, "max_position_embeddings", None))
        return data_batches(data, count)
    return make_batches(dataclasses.replace(preset, model={**preset.model, "vocab_size": vocab}), count, seed)


def make_batches(preset: Preset, count: int, seed: int = 0) -> list[PreferenceBatch]:
    """``count`` batches of ``preset.batch_size`` synthetic pairs (unique ``index`` values across batches)."""
    if preset.lengths is not None:
        return _length_shaped_batches(preset, count, seed)
    lo, hi = preset.response_length
    data = SyntheticPreferenceData(
        vocab_size=preset.model["vocab_size"], min_response_length=lo, max_response_length=hi,
        batch_size=preset.batch_size, seed=seed + 1,
    )
    pairs = data.make_pairs(count * preset.batch_size, stream=0)
    B = preset.batch_size
    return [collate_pairs(pairs[i * B : (i + 1) * B], pad_id=PAD) for i in range(count)]


def _from_quantiles(table: Sequence[int], u: float) -> int:
    """Inverse CDF of an evenly spaced quantile table, linearly interpolated."""
    x = u * (len(table) - 1)
    lo = min(int(x), len(table) - 2)
    return max(1, round(table[lo] + (x - lo) * (table[lo + 1] - table[lo])))


def _length_shaped_batches(preset: Preset, count: int, seed: int) -> list[PreferenceBatch]:
    """Random-token pairs whose prompt, chosen and rejected lengths are drawn (independently) from
    ``preset.lengths``, grouped by length like ``LengthGroupedSampler``: a mega-batch of at least 50 batches is
    sorted by ``prompt + chosen + rejected``, cut into batches, and ``count`` of them are taken in random order."""
    assert preset.lengths is not None
    B, V = preset.batch_size, preset.model["vocab_size"]
    g = torch.Generator().manual_seed(seed + 1)
    num_batches = max(count, 50)
    tokens = lambda n: torch.randint(3, V, (n,), generator=g).tolist()  # noqa: E731  (0-2: PAD, BOS, EOS)
    pairs = []
    for i in range(num_batches * B):
        u = torch.rand(3, generator=g).tolist()
        p, c, r = (_from_quantiles(preset.lengths[k], x) for k, x in zip(("prompt", "chosen", "rejected"), u))
        pairs.append({"prompt_ids": [BOS] + tokens(p - 1), "chosen_ids": tokens(c - 1) + [EOS],
                      "rejected_ids": tokens(r - 1) + [EOS], "index": i})
    pairs.sort(key=lambda e: len(e["prompt_ids"]) + len(e["chosen_ids"]) + len(e["rejected_ids"]))
    chosen = torch.randperm(num_batches, generator=g)[:count].tolist()
    return [collate_pairs(pairs[k * B : (k + 1) * B], pad_id=PAD) for k in chosen]
