"""``lit-prunedpo-study``: time to quality, end to end.

Per-step speed is what the bench measures; a user pays for the time to reach a given model. The study
trains every pruning mode (and a compute-matched, larger-batch version of it) from the same initial weights
on the same data, for the same training time and the same number of steps, over several seeds, evaluates
the exact held-out DPO objective at fixed points of the training clock, and reports the time each arm
needs to reach vanilla's final held-out quality as a ratio to vanilla's.

* :mod:`~lit_prunedpo.study.tasks`: the tasks (quickstart, one-edit pairs with label noise, HH-RLHF);
* :mod:`~lit_prunedpo.study.arms`: the modes and the compute-matched batch size;
* :mod:`~lit_prunedpo.study.runner`: the interleaved training runs, clocks and exact evaluations;
* :mod:`~lit_prunedpo.study.curves`: target, time to target, ratios;
* :mod:`~lit_prunedpo.study.report`: study.json / study.md / study.png;
* :mod:`~lit_prunedpo.study.cli`: the command.
"""
