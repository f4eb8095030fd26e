"""What a training run carries besides the step, each in a small object ``PrunedDPO`` constructs:
:class:`~lit_prunedpo.run.state.RunState` (what a checkpoint holds beside the weights),
:class:`~lit_prunedpo.run.optimizer_setup.OptimizerRecord` (the optimizer and scheduler asked for, applied again on
resume), :class:`~lit_prunedpo.run.gradient_check.GradientCheck` with
:class:`~lit_prunedpo.run.nonfinite.NonFiniteGuard` (a non-finite loss or gradient stops or skips, counted),
:class:`~lit_prunedpo.run.training_logs.TrainingLog` (TRL's ``train/*`` logs) and the exact, unpruned validation
(:mod:`~lit_prunedpo.run.validation`). None of them reads or writes the module's private state."""
