"""The layout interface: how the rows of a :class:`~lit_prunedpo.step.plan.RowGroup` become one forward's tensors.

A :class:`Layout` arranges a group (:meth:`Layout.arrange`) into a :class:`LaidOutGroup`: the shape that enters
the model body, the tokens it executes, and the :class:`GroupInputs` of the forward. A layout may let a group
read the keys and values of the forward before it (``previous``); whether to ask is the executor's decision.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from torch import Tensor, nn
from transformers import DynamicCache

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.step.plan import RowGroup, StepPlan, prompt_and_common_lengths


@dataclass(frozen=True)
class PairLengths:
    """What a layout needs to know of the batch's pairs besides the plan's draws.

    Attributes:
        prompt_width: ``P``, the batch's (left-padded) prompt columns.
        prompt_len: ``[B]`` real prompt tokens of each pair (``None``: unknown; only shapes can be laid out).
        common_len: ``[B]`` length of the common prefix of each pair's two responses (``None``: unknown).
    """

    prompt_width: int
    prompt_len: Tensor | None = None
    common_len: Tensor | None = None

    @classmethod
    def of(cls, batch: PreferenceBatch) -> "PairLengths":
        prompt_len, common_len = prompt_and_common_lengths(batch)
        return cls(batch.prompt_width, prompt_len, common_len)

    @classmethod
    def of_plan(cls, plan: StepPlan) -> "PairLengths":
        """Only the prompt width (the padded layout's shapes need nothing else)."""
        return cls(plan.prompt_width)


@dataclass(frozen=True)
class PastColumns:
    """Where a forward's cache columns come from in the previous forward's keys and values.

    Attributes:
        seq: ``[S, C]`` sequence of the previous forward.
        col: ``[S, C]`` column of that sequence (padding columns point anywhere: the mask hides them).
    """

    seq: Tensor
    col: Tensor

    def gather(self, previous: DynamicCache) -> DynamicCache:
        """A cache of ``previous``'s keys and values at these columns, detached (no gradient flows back)."""
        if not previous.layers or not all(layer.is_initialized for layer in previous.layers):
            raise RuntimeError(
                "the previous forward kept no keys and values (gradient checkpointing drops them): run the step "
                "with reuse_keys_values=False"
            )
        layers = []
        for layer in previous.layers:
            # [S', heads, W', dh] -> [S, heads, C, dh]
            pick = lambda x: x.detach().transpose(1, 2)[self.seq, self.col].transpose(1, 2)  # noqa: E731
            layers.append((pick(layer.keys), pick(layer.values)))
        return DynamicCache(ddp_cache_data=layers)


@dataclass(frozen=True)
class GroupInputs:
    """The tensors of one forward pass.

    Attributes:
        input_ids: ``[n, W]`` left-padded prompt followed by the kept response prefix (or, shared-prompt
            layout, ``[S, W]``: packed blocks, one per pair).
        attention_mask: ``[n, W]`` long, 0 on padding (or, shared-prompt layout, ``[S, 1, W, W]`` bool, True
            where a query column may attend a key column).
        position_ids: ``[n, W]`` positions that ignore the left padding (``None``: the model's own default, for
            rows whose real tokens start at column 0).
        gather_row: ``[K]`` row of each scored position.
        gather_col: ``[K]`` column whose hidden state predicts the scored token (one before it).
        targets: ``[K]`` the scored response tokens.
        past: the ``C`` cache columns the mask's first ``C`` key columns refer to (``None``: no cache, the
            mask is ``[S, 1, W, W]``).
        key_positions: ``[S, C + W]`` position of each key column of a 4-D mask (the cache's, then the
            sequence's own), so that a sliding window can be cut from it (``None`` with a 2-D mask).
        cache: keys and values the forward attends to before its own (gathered at ``past``), or an empty cache
            that it fills with its keys and values for the next forward; ``None`` keeps none. Set by the
            executor, so that a scorer needs no argument for it.
        lse_index: ``[K_s]`` the gathered positions (indices into the ``K``) where the whole LM head runs, for a
            group whose log-softmax is split (:attr:`~lit_prunedpo.step.plan.RowGroup.lse_index`): the scorer then
            returns the target logits at all ``K`` and the log-sum-exps at these
            (:class:`~lit_prunedpo.token_terms.TokenTerms`). ``None``: whole log-probs at all ``K``. Set by the
            executor, as ``cache``.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor | None
    gather_row: Tensor
    gather_col: Tensor
    targets: Tensor
    past: PastColumns | None = None
    cache: DynamicCache | None = None
    key_positions: Tensor | None = None
    lse_index: Tensor | None = None


class LaidOutGroup(ABC):
    """A row group as one forward runs it: its shape, its token counts and its inputs."""

    group: RowGroup

    @property
    @abstractmethod
    def shape(self) -> tuple[int, int]:
        """``(sequences, columns)`` of the tensor that enters the model body."""

    @property
    @abstractmethod
    def real_tokens(self) -> int:
        """Tokens that enter the model body, padding excluded."""

    @property
    def tokens(self) -> int:
        """Tokens, padding included, that enter the model body."""
        rows, width = self.shape
        return rows * width

    @property
    def cached_columns(self) -> int:
        """Key columns each sequence reads from the previous forward besides its own (0: it reads none)."""
        return 0

    @property
    def reads_previous(self) -> bool:
        """Whether the forward attends to the previous forward's keys and values (which must then keep them)."""
        return False

    @abstractmethod
    def inputs(self, batch: PreferenceBatch) -> GroupInputs:
        """The forward's tensors, on the batch's device."""


class Layout(ABC):
    """How the executor lays a row group out as one forward.

    Attributes:
        runs_common_start_once: a pair's shared response start runs once for both branches, so a margin loss
            (whose log-ratios cancel there) need not score it.
    """

    runs_common_start_once: bool = False

    @abstractmethod
    def arrange(self, group: RowGroup, pairs: PairLengths, previous: LaidOutGroup | None = None) -> LaidOutGroup:
        """Lay ``group`` out; with ``previous`` (the forward run just before, which the executor will have keep its
        keys and values) the layout may have the group read them instead of running its prompts again."""

    def check_model(self, model: nn.Module) -> None:
        """Refuse a model this layout cannot run exactly (``ValueError`` naming why; every model passes by default:
        the conformance check compares the result with the model's plain forward anyway)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
