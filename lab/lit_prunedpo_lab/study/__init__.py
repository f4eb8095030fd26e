"""``lit-prunedpo-study``: time to quality, end to end.

Per-step speed is what the bench measures; a user pays for the time to reach a given model. The study
trains every pruning mode (and a compute-matched, larger-batch version of it) and the control it must beat,
vanilla with its batch shrunk to the pruned step's measured cost, each at its own learning rate from a sweep
on tuning seeds, from the same initial weights on the same data, for the same training time and the same
number of steps, over several seeds; it evaluates the exact held-out DPO objective at fixed points of the
training clock, and reports the time each arm needs to reach a share of vanilla's best improvement as a
ratio to the better vanilla, with a bootstrap interval over seeds and a WIN / TIE / LOSS verdict.

* :mod:`~lit_prunedpo_lab.study.tasks`: the tasks (quickstart, one-edit pairs with label noise, HH-RLHF);
* :mod:`~lit_prunedpo_lab.study.arms`: the modes and the compute-matched batch size;
* :mod:`~lit_prunedpo_lab.study.runner`: the interleaved training runs, clocks and exact evaluations;
* :mod:`~lit_prunedpo_lab.study.calibrate`: measured step costs, the cost-matched vanilla batch, schedule lengths;
* :mod:`~lit_prunedpo_lab.study.arm_plan`: the arms calibrated, their controls, memory-budget fits and schedules;
* :mod:`~lit_prunedpo_lab.study.sweep`: each arm's learning rate, on tuning seeds;
* :mod:`~lit_prunedpo_lab.study.curves`: target, time to target, censoring, bootstrap intervals, the win rule;
* :mod:`~lit_prunedpo_lab.study.report_summary`: the protocol applied to the runs, per arm;
* :mod:`~lit_prunedpo_lab.study.report`: study.json, progress.jsonl as the study goes; study.md
  (:mod:`~lit_prunedpo_lab.study.report_markdown`) and study.png (:mod:`~lit_prunedpo_lab.study.report_figure`);
* :mod:`~lit_prunedpo_lab.study.outputs`: the output folder's lock, files written whole, one-line write errors;
* :mod:`~lit_prunedpo_lab.study.arguments`: the command's arguments and the options they resolve to;
* :mod:`~lit_prunedpo_lab.study.protocol`: the study as a function (``run_study -> StudyResult``), which the command and
  the regime map call;
* :mod:`~lit_prunedpo_lab.study.cli`: the command.

The study is a client of the library: from outside the lab it imports only the public API, the ``__all__`` of the
modules :mod:`lit_prunedpo.public_api` lists (and the bench's cost model); ``tests/test_lab_boundary.py`` checks it.
"""
