"""Benchmarks of the pruned DPO step: a FLOP cost model (:mod:`.cost`), presets (:mod:`.presets`), a harness that
times the modes side by side on the same weights and batches (:mod:`.harness`), reports (:mod:`.report`) and the
``lit-prunedpo-bench`` command line (:mod:`.cli`).

The bench is a client of the library: it imports only the public API, the ``__all__`` of the modules
:mod:`lit_prunedpo.public_api` lists, so that what it times is what a user can build (``tests/test_lab_boundary.py``).
"""
