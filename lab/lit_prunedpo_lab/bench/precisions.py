"""``lit-prunedpo-bench --compare-precisions``: the exact step in several precisions (Lightning's names), alternated in
one run, with each one's utilisation against a matmul peak of its own compute dtype.

Each precision gets its own module, built from the same model (the preset's seed, or ``--model``) with parameters in
that precision's dtype, and runs as a variant of :func:`lit_prunedpo_lab.bench.variants.compare_variants` (same batches,
same sampler draws, the order turning every round). Ratios between precisions are then taken in the same minutes,
which separate runs per ``--precision`` cannot give; the objective and gradient differences are each precision's
distance from the first one (float32 first: bfloat16's rounding).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from lit_prunedpo_lab.bench.batches import round_batches
from lit_prunedpo_lab.bench.compiled import preset_module
from lit_prunedpo_lab.bench.own_model import pretrained_source
from lit_prunedpo_lab.bench.precision import Precision
from lit_prunedpo_lab.bench.presets import Preset
from lit_prunedpo_lab.bench.variants import Variant, compare_variants, to_markdown
from lit_prunedpo.data import PreferenceDataModule

__all__ = ["compare_precisions", "to_markdown"]


def compare_precisions(preset: Preset, modes: Sequence[str], steps: int, warmup: int, precisions: Sequence[Precision],
                       device: str = "cpu", seed: int = 0, model: str | None = None,
                       data: PreferenceDataModule | None = None,
                       log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time every mode's exact step in each of ``precisions``, alternated, over ``warmup`` + ``steps`` rounds.

    Raises:
        ValueError: fewer than two precisions, a precision named twice, ``warmup`` < 1 or ``steps`` < 2.
    """
    names = [p.name for p in precisions]
    if len(set(names)) != len(names):
        raise ValueError(f"--compare-precisions names a precision twice: {','.join(names)}")
    dev = torch.device(device)
    variants = []
    for precision in precisions:
        source = pretrained_source(model, precision.weights) if model is not None else None
        variants.append(Variant(precision.name, preset_module(preset, source, seed, precision.weights, dev), precision))
    batches = [b.to(dev) for b in round_batches(preset, warmup + steps, seed, variants[0].module.policy, data)]
    result = compare_variants(variants, modes, batches, warmup, seed, log)
    return {**result, "kind": "precisions", "preset": preset.name, "model": model or preset.model,
            "batch_size": preset.batch_size}
