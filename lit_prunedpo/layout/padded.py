"""The padded layouts: one sequence per response row, concatenated DPO's layout, padded on the left or the right.

:class:`LeftPaddedLayout`: every row runs its left-padded prompt (``P`` columns, so every response starts at column
``P``) followed by its first ``L - 1`` kept response tokens; the group's tensor is cut to ``P + max(L) - 1``
columns, so prefix pruning really shortens it. Row ``r``'s response position ``t`` is predicted by column
``P - 1 + t``. Position ids skip the left padding and the attention mask hides it, which is exact for attention
(sliding windows included: ``transformers`` builds the mask) but not for every layer that reads padding
(a recurrent state or a convolution may).

:class:`RightPaddedLayout`: every row starts its real prompt at column 0 and pads only at its end, so no real
token is preceded by padding: exact for any causal model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.layout.base import GroupInputs, LaidOutGroup, Layout, PairLengths
from lit_prunedpo.step.plan import RowGroup


@dataclass(frozen=True)
class LeftPaddedGroup(LaidOutGroup):
    """A row group as padded rows.

    Attributes:
        group: the rows.
        pairs: the batch's prompt width (and, for :attr:`real_tokens`, its prompt lengths).
    """

    group: RowGroup
    pairs: PairLengths

    @property
    def width(self) -> int:
        """``P + max(kept) - 1``: the columns that run."""
        return self.pairs.prompt_width + int(self.group.kept.max()) - 1

    @property
    def shape(self) -> tuple[int, int]:
        return self.group.num_rows, self.width

    @property
    def real_tokens(self) -> int:
        if self.pairs.prompt_len is None:
            raise ValueError("this row group was laid out without prompt lengths: its real tokens are unknown")
        prompt_len = self.pairs.prompt_len[self.group.pair.cpu()]
        return int((prompt_len + self.group.kept.cpu() - 1).sum())

    def inputs(self, batch: PreferenceBatch) -> GroupInputs:
        return padded_inputs(batch, self.group, self.width)


def padded_inputs(batch: PreferenceBatch, group: RowGroup, width: int | None = None) -> GroupInputs:
    """The inputs of ``group`` as padded rows: prompt ``++ y_1..y_{L-1}``, cut to ``width`` (default
    ``P + max(kept) - 1``) columns."""
    group = group.to(batch.prompt_ids.device)
    P = batch.prompt_width
    W = P + int(group.kept.max()) - 1 if width is None else width
    responses = batch.response_ids[group.pair, group.branch]
    response_mask = batch.response_mask[group.pair, group.branch]
    input_ids = torch.cat([batch.prompt_ids[group.pair], responses], dim=1)[:, :W]
    attention_mask = torch.cat([batch.prompt_mask[group.pair], response_mask], dim=1)[:, :W].long()
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    return GroupInputs(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        gather_row=group.scored_row,
        gather_col=P - 1 + group.scored_t,
        targets=responses[group.scored_row, group.scored_t],
    )


class LeftPaddedLayout(Layout):
    """One left-padded sequence per response row; a forward never reads another's keys and values."""

    def arrange(self, group: RowGroup, pairs: PairLengths, previous: LaidOutGroup | None = None) -> LeftPaddedGroup:
        return LeftPaddedGroup(group, pairs)


class PaddedLayout(LeftPaddedLayout):
    """:class:`LeftPaddedLayout` under the name it had before (``class_path: lit_prunedpo.layout.PaddedLayout`` in
    configs written then); the same layout, with a warning naming the new one."""

    def __init__(self) -> None:
        warnings.warn("lit_prunedpo.layout.PaddedLayout is now LeftPaddedLayout (the same layout: it pads on the "
                      "left); write that name", FutureWarning, stacklevel=2)


@dataclass(frozen=True)
class RightPaddedGroup(LaidOutGroup):
    """A row group as right-padded rows: each row's real prompt from column 0, then its kept response prefix.

    Attributes:
        group: the rows.
        pairs: the batch's prompt widths and real prompt lengths.
    """

    group: RowGroup
    pairs: PairLengths

    @property
    def row_lengths(self) -> torch.Tensor:
        """``[n]`` input tokens of each row: its real prompt and the first ``L - 1`` kept response tokens."""
        if self.pairs.prompt_len is None:
            raise ValueError("the right-padded layout needs every pair's prompt length")
        return self.pairs.prompt_len[self.group.pair.cpu()] + self.group.kept.cpu() - 1

    @property
    def shape(self) -> tuple[int, int]:
        return self.group.num_rows, int(self.row_lengths.max())

    @property
    def real_tokens(self) -> int:
        return int(self.row_lengths.sum())

    def inputs(self, batch: PreferenceBatch) -> GroupInputs:
        device = batch.prompt_ids.device
        group = self.group.to(device)
        prompt_len = self.pairs.prompt_len.to(device)[group.pair]
        lengths = self.row_lengths.to(device)
        P, T, W = batch.prompt_width, batch.response_width, self.shape[1]
        col = torch.arange(W, device=device)[None, :]
        in_prompt = col < prompt_len[:, None]
        from_prompt = batch.prompt_ids[group.pair[:, None], (P - prompt_len[:, None] + col).clamp(max=P - 1)]
        t = (col - prompt_len[:, None]).clamp(0, T - 1)
        from_response = batch.response_ids[group.pair[:, None], group.branch[:, None], t]
        real = col < lengths[:, None]
        input_ids = torch.where(in_prompt, from_prompt, from_response).masked_fill(~real, 0)
        responses = batch.response_ids[group.pair, group.branch]
        return GroupInputs(
            input_ids=input_ids,
            attention_mask=real.long(),
            position_ids=None,  # the model's own (0, 1, ...; RoBERTa's start past its padding index)
            gather_row=group.scored_row,
            gather_col=prompt_len[group.scored_row] - 1 + group.scored_t,
            targets=responses[group.scored_row, group.scored_t],
        )


class RightPaddedLayout(Layout):
    """One sequence per response row, its real tokens from column 0 and padding only at its end.

    Every real token sees exactly what it sees when the row runs alone (a causal model never looks right), so this
    layout is exact for any causal LM: ALiBi biases, recurrent and convolutional layers, hybrid caches. It runs
    each prompt once per row, like the padded layout, and is the automatic layout's last resort."""

    def arrange(self, group: RowGroup, pairs: PairLengths, previous: LaidOutGroup | None = None) -> RightPaddedGroup:
        if pairs.prompt_len is None:
            raise ValueError("the right-padded layout needs every pair's prompt length")
        return RightPaddedGroup(group, pairs)
