"""The exact held-out evaluation every run of a study is judged by: the module's own validation computation (the
unpruned objective on every position of both whole responses), on the held-out batches the study keeps."""

from __future__ import annotations

from typing import Sequence

import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo_lab.study.devices import forward_precision


@torch.no_grad()
def exact_eval(module: PrunedDPO, batches: Sequence[PreferenceBatch],
               precision: str = "32-true") -> tuple[float, float]:
    """Mean exact DPO loss and accuracy over every pair of ``batches``: the module's own validation computation
    (:meth:`PrunedDPO.exact_pair_metrics`), averaged over pairs, at ``precision`` (as Lightning validates)."""
    was_training = module.training
    module.eval()
    losses, hits, pairs = 0.0, 0.0, 0
    device = next(module.parameters()).device
    try:
        for batch in batches:
            batch = batch if device.type == "cpu" else batch.to(device)
            with forward_precision(module, precision):
                metrics = module.exact_pair_metrics(batch)
            losses += float(metrics["loss"].sum())
            hits += float(metrics["rewards/accuracies"].sum())
            pairs += batch.num_pairs
    finally:
        module.train(was_training)
    return losses / pairs, hits / pairs


def eval_batches(dm: PreferenceDataModule, max_pairs: int | None = None) -> list[PreferenceBatch]:
    """The held-out batches every evaluation runs: all of them, or whole batches up to ``max_pairs`` pairs.

    Raises:
        ValueError: if ``max_pairs`` < 1 or no held-out pair is left.
    """
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_eval_pairs must be >= 1 (or None: all), got {max_pairs!r}")
    kept, total = [], 0
    for batch in dm.val_dataloader():
        if max_pairs is not None and total >= max_pairs:
            break
        kept.append(batch)
        total += batch.num_pairs
    if total == 0:
        raise ValueError("the study needs held-out pairs to evaluate on, and the data module's validation split has "
                         "none")
    return kept
