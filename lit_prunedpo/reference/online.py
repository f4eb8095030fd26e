"""The online reference: a frozen causal LM run once per step on the union of the plan's rows.

:class:`OnlineReference` runs, by default, a copy of the initial policy under ``torch.no_grad()`` with the LM
head on scored positions only, so pruning saves reference compute too. In a step the executor runs it
(:meth:`OnlineReference.online_model`), laid out like the policy's forwards. A LoRA policy's reference is the
policy itself with its adapters off (no copy; see :mod:`lit_prunedpo.lora`).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator

from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.step.execute import StepExecutor
from lit_prunedpo.layout import PairLengths
from lit_prunedpo.lora import adapters_off, is_peft_model
from lit_prunedpo.models import ModelSource
from lit_prunedpo.step.plan import StepPlan
from lit_prunedpo.reference.base import ReferenceSource
from lit_prunedpo.scoring import TokenScorer


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

    def with_scorer(self, scorer: TokenScorer) -> "OnlineReference":
        """A configured source that runs the same frozen model (shared, not copied) through ``scorer``."""
        other = OnlineReference()
        other.source, other.model, other.scorer = self.source, self.model, scorer
        if hasattr(self, "_adapters_off_policy"):
            other._adapters_off_policy = self._adapters_off_policy
        return other

    def _freeze(self) -> None:
        self.model.requires_grad_(False)
        self.model.eval()

    def train(self, mode: bool = True) -> "OnlineReference":
        # The reference never trains: dropout stays off whatever Lightning asks of the parent module.
        super().train(False)
        return self

    def models(self) -> list[nn.Module]:
        # a LoRA policy's adapters-off reference belongs to the policy: sharded and checked with it
        return [self.model] if self.model is not None else []

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[tuple[nn.Module, TokenScorer]]:
        shared = getattr(self, "_adapters_off_policy", None)
        if self.model is None and shared is None:
            raise RuntimeError("OnlineReference.configure(policy, scorer) was not called before scoring")
        with adapters_off(self.model if self.model is not None else shared[0]) as model:
            yield model, self.scorer

    def online_model(self) -> contextlib.AbstractContextManager[tuple[nn.Module, TokenScorer]]:
        return self._frozen()

    def token_logps(self, batch: PreferenceBatch, plan: StepPlan) -> list[Tensor]:
        """Outside a step: the one merged no-grad forward of ``plan``'s rows, in the padded layout."""
        executor = StepExecutor()
        forwards = executor.forwards(plan.groups, PairLengths.of(batch))
        with self._frozen() as (model, scorer):
            return list(executor.run_reference(model, scorer, batch, forwards, plan.groups))
