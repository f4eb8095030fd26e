"""Kept so that configs and code written before :mod:`lit_prunedpo.reference` became a package still load
(``class_path: lit_prunedpo.reference_cache.CachedReference``); new code imports from :mod:`lit_prunedpo.reference`."""

from lit_prunedpo.reference.cached import CachedReference, compute_reference_logps
from lit_prunedpo.reference.store import ReferenceLogpStore

__all__ = ["CachedReference", "ReferenceLogpStore", "compute_reference_logps"]
