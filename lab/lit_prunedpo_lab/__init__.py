"""The laboratory of lit_prunedpo: what measures the library, under its own roof and in its own distribution.

* :mod:`lit_prunedpo_lab.bench`: per-step time and memory of the pruning modes (and TRL) side by side on the same
  weights and batches, with the FLOP cost model and the memory model beside each figure;
* :mod:`lit_prunedpo_lab.study`: time to quality (``run_study``), the regime map over it, and the paper's
  epoch-matched cells with their ``reproduce`` and ``compare``;
* :mod:`lit_prunedpo_lab.console`: ``lit-prunedpo-lab``, the one command with a subcommand per job.

A user who trains installs ``lit-prunedpo`` alone; the lab is ``pip install ./lab`` (``lab/pyproject.toml``) beside
it. The lab is a client of the library: it imports only the public API, the ``__all__`` of the modules
:mod:`lit_prunedpo.public_api` lists (``tests/test_lab_boundary.py``), so what it measures is what a user can build.
"""
