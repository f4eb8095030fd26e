"""Where reference log-probabilities come from: the seam between the step and the frozen reference.

A :class:`ReferenceSource` returns, for every row group of a plan, the reference log-probs at exactly the
group's scored positions of exactly its executed prefixes. :class:`OnlineReference` runs a frozen model
(by default a copy of the initial policy) once per step on the union of the plan's rows, under
``torch.no_grad()`` and with the LM head on scored positions only, so pruning saves reference compute too.
A cached source (per-token log-probs computed once) plugs in at the same seam.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
import lightning as L
import torch
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.lora import adapters_off, is_peft_model
from lit_prunedpo.models import ModelSource
from lit_prunedpo.plan import StepPlan, merge_groups
from lit_prunedpo.scoring import TokenScorer, group_inputs


class ReferenceSource(nn.Module, ABC):
    """Reference log-probs for the scored positions of a plan. An ``nn.Module`` so that Lightning moves and
    shards whatever state it holds."""

    def configure(self, policy: nn.Module, scorer: TokenScorer) -> None:
        """Called once in ``PrunedDPO.__init__`` with the freshly built policy (e.g. to copy it) and the module's
        scorer (so that a memory-efficient scorer serves the reference too)."""

    def prepare(self, module: "L.LightningModule", stage: str) -> None:
        """Called from ``PrunedDPO.setup(stage)`` on every process, with the trainer and data module attached
        (e.g. to load or build a cache). The policy still has its initial weights: checkpoints load later."""

    @abstractmethod
    def token_logps(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        """One ``[K_g]`` tensor per group of ``plan``, aligned with the group's scored positions."""

    def tokens_executed(self, plan: StepPlan) -> int:
        """Padded tokens a reference model runs for ``plan`` (0 for sources that run no model)."""
        return 0


class OnlineReference(ReferenceSource):
    """A frozen causal LM scored on the same truncated inputs as the policy, one no-grad forward per step.

    Args:
        model: where the reference comes from; ``None`` (default) freezes a copy of the initial policy, or for a
            LoRA policy uses the policy itself with its adapters off (no copy; see ``lit_prunedpo.lora``).
    """

    def __init__(self, model: ModelSource | None = None) -> None:
        super().__init__()
        self.source = model
        self.model: nn.Module | None = model.build() if model is not None else None
        self.scorer = TokenScorer()
        if self.model is not None:
            self._freeze()

    def configure(self, policy: nn.Module, scorer: TokenScorer) -> None:
        self.scorer = scorer
        if self.model is None and is_peft_model(policy):
            # a tuple, not an attribute: registering the policy here would duplicate its parameters
            self._adapters_off_policy = (policy,)
        elif self.model is None:
            self.model = copy.deepcopy(policy)
            self._freeze()

    def _freeze(self) -> None:
        self.model.requires_grad_(False)
        self.model.eval()

    def train(self, mode: bool = True) -> "OnlineReference":
        # The reference never trains: dropout stays off whatever Lightning asks of the parent module.
        super().train(False)
        return self

    def tokens_executed(self, plan: StepPlan) -> int:
        # the one merged forward: every row of the plan (one packed block per pair with a shared prompt)
        return merge_groups(plan.groups).tokens_executed

    @torch.no_grad()
    def token_logps(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        shared = getattr(self, "_adapters_off_policy", None)
        if self.model is None and shared is None:
            raise RuntimeError("OnlineReference.configure(policy, scorer) was not called before scoring")
        merged = merge_groups(plan.groups)
        with adapters_off(self.model if self.model is not None else shared[0]) as model:
            logps = self.scorer(model, group_inputs(batch, merged.to(batch.prompt_ids.device)))
        return list(logps.split([g.num_scored for g in plan.groups]))
