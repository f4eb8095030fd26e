"""Data modules that yield :class:`lit_prunedpo.batch.PreferenceBatch`."""

from lit_prunedpo.data.preference import PreferenceDataModule
from lit_prunedpo.data.synthetic import SyntheticPreferenceData

__all__ = ["PreferenceDataModule", "SyntheticPreferenceData"]
