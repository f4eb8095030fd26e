"""``lit-prunedpo-study``: time to quality, end to end.

Per-step speed is what the bench measures; a user pays for the time to reach a given model. The study
trains every pruning mode (and a compute-matched, larger-batch version of it) and the control it must beat,
vanilla with its batch shrunk to the pruned step's measured cost, each at its own learning rate from a sweep
on tuning seeds, from the same initial weights on the same data, for the same training time and the same
number of steps, over several seeds; it evaluates the exact held-out DPO objective at fixed points of the
training clock, and reports the time each arm needs to reach a share of vanilla's best improvement as a
ratio to the better vanilla, with a bootstrap interval over seeds and a WIN / TIE / LOSS verdict.

* :mod:`~lit_prunedpo.study.tasks`: the tasks (quickstart, one-edit pairs with label noise, HH-RLHF);
* :mod:`~lit_prunedpo.study.arms`: the modes and the compute-matched batch size;
* :mod:`~lit_prunedpo.study.runner`: the interleaved training runs, clocks and exact evaluations;
* :mod:`~lit_prunedpo.study.calibrate`: measured step costs, the cost-matched vanilla batch, schedule lengths;
* :mod:`~lit_prunedpo.study.sweep`: each arm's learning rate, on tuning seeds;
* :mod:`~lit_prunedpo.study.curves`: target, time to target, censoring, bootstrap intervals, the win rule;
* :mod:`~lit_prunedpo.study.report`: study.json / study.md / study.png, progress.jsonl as the study goes;
* :mod:`~lit_prunedpo.study.outputs`: the output folder's lock, files written whole, one-line write errors;
* :mod:`~lit_prunedpo.study.cli`: the command.
"""
