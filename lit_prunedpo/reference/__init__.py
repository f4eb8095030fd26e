"""Where reference log-probabilities come from: one file per kind of source, behind :class:`ReferenceSource`.

* :mod:`~lit_prunedpo.reference.base`: the seam and its lifecycle (``configure`` -> ``prepare`` -> ``shard``
  -> ``token_logps``), the :class:`ReferenceRuntime` and the :class:`ReferenceData` a source is handed;
* :mod:`~lit_prunedpo.reference.online`: a frozen model run every step;
* :mod:`~lit_prunedpo.reference.cached`: per-token log-probs computed once, on disk
  (:mod:`~lit_prunedpo.reference.store` holds them, :mod:`~lit_prunedpo.reference.fingerprint` says what they
  were computed from);
* :mod:`~lit_prunedpo.reference.no_reference`: none, for reference-free losses.
"""

from lit_prunedpo.reference.base import ReferenceData, ReferenceRuntime, ReferenceSource
from lit_prunedpo.reference.cached import CachedReference, compute_reference_logps
from lit_prunedpo.reference.no_reference import NoReference, reference_for
from lit_prunedpo.reference.online import OnlineReference
from lit_prunedpo.reference.store import ReferenceLogpStore

__all__ = [
    "CachedReference",
    "NoReference",
    "OnlineReference",
    "ReferenceData",
    "ReferenceLogpStore",
    "ReferenceRuntime",
    "ReferenceSource",
    "compute_reference_logps",
    "reference_for",
]
