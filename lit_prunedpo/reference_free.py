"""Kept so that configs and code written before :mod:`lit_prunedpo.reference` became a package still load
(``class_path: lit_prunedpo.reference_free.NoReference``); new code imports from :mod:`lit_prunedpo.reference`."""

from lit_prunedpo.reference.no_reference import NoReference, reference_for

__all__ = ["NoReference", "reference_for"]
