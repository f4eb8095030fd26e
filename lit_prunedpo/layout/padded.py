"""The padded layout: one sequence per response row, concatenated DPO's layout.

Every row runs its left-padded prompt (``P`` columns, so every response starts at column ``P``) followed by its
first ``L - 1`` kept response tokens; the group's tensor is cut to ``P + max(L) - 1`` columns, so prefix
pruning really shortens it. Row ``r``'s response position ``t`` is predicted by column ``P - 1 + t``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.layout.base import GroupInputs, LaidOutGroup, Layout, PairLengths
from lit_prunedpo.plan import RowGroup


@dataclass(frozen=True)
class PaddedGroup(LaidOutGroup):
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


class PaddedLayout(Layout):
    """One left-padded sequence per response row; a forward never reads another's keys and values."""

    def arrange(self, group: RowGroup, pairs: PairLengths, previous: LaidOutGroup | None = None) -> PaddedGroup:
        return PaddedGroup(group, pairs)
