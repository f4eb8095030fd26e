"""Data modules that yield :class:`lit_prunedpo.batch.PreferenceBatch`, and the generated tasks the tests, the
benchmark and the study train on."""

from lit_prunedpo.data.edited import EditPlace, best_accuracy, edited_pairs
from lit_prunedpo.data.preference import PreferenceDataModule
from lit_prunedpo.data.synthetic import BOS, EOS, PAD, SyntheticPreferenceData
from lit_prunedpo.data.unrelated import unrelated_pairs

__all__ = [
    "PreferenceDataModule", "SyntheticPreferenceData",
    # the synthetic task's special token ids
    "BOS", "EOS", "PAD",
    # generated pairs: one local edit with label noise, or unrelated responses; the accuracy a run can reach
    "EditPlace", "best_accuracy", "edited_pairs", "unrelated_pairs",
]
