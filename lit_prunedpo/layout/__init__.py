"""How a row group's forward is laid out: one interface (:mod:`~lit_prunedpo.layout.base`), two layouts.

* :mod:`~lit_prunedpo.layout.padded`: one left-padded sequence per response row (concatenated DPO's layout);
* :mod:`~lit_prunedpo.layout.packed`: one packed block per pair, its prompt (and the common start of its
  responses) run once, optionally reading the previous forward's keys and values (``shared_prompt``).

The executor (:mod:`lit_prunedpo.execute`) picks one and runs what it lays out; a layout knows nothing about
models beyond the attention mask form they take.
"""

from lit_prunedpo.layout.base import GroupInputs, LaidOutGroup, Layout, PairLengths, PastColumns
from lit_prunedpo.layout.packed import PackedGroup, SharedPromptLayout
from lit_prunedpo.layout.padded import PaddedGroup, PaddedLayout

__all__ = [
    "GroupInputs",
    "LaidOutGroup",
    "Layout",
    "PackedGroup",
    "PaddedGroup",
    "PaddedLayout",
    "PairLengths",
    "PastColumns",
    "SharedPromptLayout",
]
