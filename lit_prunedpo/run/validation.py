"""Validation and test of ``PrunedDPO``: the exact, unpruned objective, whatever the samplers.

Every batch runs the unpruned plan (every position of every whole response, both branches: ``plan.exact_plan``)
through the module's own layout, executor and estimator, so that runs trained with different samplers compare on
the same numbers. Each metric is an epoch mean (``torchmetrics.MeanMetric``, reduced over ranks): TRL's pair metrics
weigh every pair alike, its token metrics (``logits/*``, ``entropy``, ``mean_token_accuracy``) weigh each pair by
its response tokens, as TRL's evaluation does.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn
from torchmetrics import MeanMetric

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.step.estimate import Estimate
from lit_prunedpo.step.execute import StepLogps
from lit_prunedpo.metrics import PAIR_METRICS, TOKEN_METRICS, pair_metrics, token_metrics
from lit_prunedpo.step.plan import StepPlan, exact_plan
from lit_prunedpo.run.training_logs import Logs


class StepStages(Protocol):
    """A step's execute and estimate stages, as ``PrunedDPO`` runs them with its own parts."""

    beta: float

    def execute(self, batch: PreferenceBatch, plan: StepPlan, parts: Any = None,
                token_stats: bool = False) -> StepLogps: ...

    def estimate(self, batch: PreferenceBatch, plan: StepPlan, logps: StepLogps) -> Estimate: ...


class LoggedStepStages(StepStages, Logs, Protocol):
    """Step stages that also log (``PrunedDPO``)."""


def epoch_means() -> nn.ModuleDict:
    """One epoch mean per pair and token metric, keyed by :func:`metric_key`."""
    return nn.ModuleDict({metric_key(n): MeanMetric() for n in PAIR_METRICS + TOKEN_METRICS})


def metric_key(name: str) -> str:
    """A metric's key in an ``nn.ModuleDict``, which refuses the ``/`` of TRL's names."""
    return name.replace("/", "__")


def exact_step(module: StepStages, batch: PreferenceBatch, token_stats: bool = False
               ) -> tuple[StepPlan, StepLogps, Estimate]:
    """The unpruned step of ``batch`` through ``module``'s stages (a ``PrunedDPO``'s): its plan, log-probs and
    estimate; draws nothing. ``token_stats`` also collects the policy's token statistics (for the token metrics)."""
    batch.validate()
    plan = exact_plan(batch)
    logps = module.execute(batch, plan, token_stats=token_stats)
    return plan, logps, module.estimate(batch, plan, logps)


def log_exact_metrics(module: LoggedStepStages, batch: PreferenceBatch, means: nn.ModuleDict, stage: str) -> None:
    """Run the exact step of ``batch`` and add its metrics to ``means`` (from :func:`epoch_means`), logged by
    ``module`` (a ``PrunedDPO``) as ``<stage>/<name>`` at the epoch's end."""
    plan, logps, est = exact_step(module, batch, token_stats=True)
    for name, value in pair_metrics(est, module.beta).items():
        metric = means[metric_key(name)]
        metric.update(value)
        module.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True, prog_bar=name == "rewards/accuracies")
    for name, (value, weight) in token_metrics(plan, logps.policy_token_stats, batch.num_pairs).items():
        metric = means[metric_key(name)]
        metric.update(value, weight)  # token-weighted, as TRL's: sum(value * weight) / sum(weight)
        module.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True)
