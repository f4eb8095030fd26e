"""Benchmarks of the pruned DPO step: a FLOP cost model (:mod:`.cost`), presets (:mod:`.presets`), a harness that
times the modes side by side on the same weights and batches (:mod:`.harness`), reports (:mod:`.report`) and the
``lit-prunedpo-bench`` command line (:mod:`.cli`)."""
