"""How a row group's forward is laid out: one interface (:mod:`~lit_prunedpo.layout.base`), two layouts.

* :mod:`~lit_prunedpo.layout.padded`: one left-padded sequence per response row (concatenated DPO's layout), or
  one right-padded one (:class:`RightPaddedLayout`, exact for any causal model);
* :mod:`~lit_prunedpo.layout.packed`: one packed block per pair, its prompt (and the common start of its
  responses) run once, optionally reading the previous forward's keys and values (``shared_prompt``).

The executor (:mod:`lit_prunedpo.step.execute`) runs what its layout lays out; a layout knows of models only what it
refuses (:meth:`Layout.check_model`) and the attention mask form they take. Which layout a model gets is chosen
by ``PrunedDPO``'s ``layout`` argument, by default the automatic choice of :mod:`lit_prunedpo.conformance`.
"""

from lit_prunedpo.layout.base import GroupInputs, LaidOutGroup, Layout, PairLengths, PastColumns
from lit_prunedpo.layout.packed import PackedGroup, SharedPromptLayout
from lit_prunedpo.layout.padded import (
    LeftPaddedGroup, LeftPaddedLayout, PaddedLayout, RightPaddedGroup, RightPaddedLayout,
)

__all__ = [
    "GroupInputs",
    "LaidOutGroup",
    "Layout",
    "LeftPaddedGroup",
    "LeftPaddedLayout",
    "PackedGroup",
    "PaddedLayout",
    "PairLengths",
    "PastColumns",
    "RightPaddedGroup",
    "RightPaddedLayout",
    "SharedPromptLayout",
]
