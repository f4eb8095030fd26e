"""Kept so that code written before :mod:`lit_prunedpo.layout` still imports: the shared-prompt (packed) layout now
lives in :mod:`lit_prunedpo.layout.packed` (``PackedLayout`` is its :class:`~lit_prunedpo.layout.packed.PackedBlocks`)
and ``prompt_and_common_lengths`` in :mod:`lit_prunedpo.plan`. New code imports from there."""

from lit_prunedpo.layout.attention import (
    SUPPORTED_ATTENTION,
    attention_implementation,
    check_attention,
    model_attention_mask,
)
from lit_prunedpo.layout.packed import (
    PackedBlocks,
    PackedGroup,
    SharedPromptLayout,
    packed_group_inputs,
    packed_layout,
    read_prompt_cache,
)
from lit_prunedpo.plan import prompt_and_common_lengths

PackedLayout = PackedBlocks

__all__ = [
    "SUPPORTED_ATTENTION",
    "PackedBlocks",
    "PackedGroup",
    "PackedLayout",
    "SharedPromptLayout",
    "attention_implementation",
    "check_attention",
    "model_attention_mask",
    "packed_group_inputs",
    "packed_layout",
    "prompt_and_common_lengths",
    "read_prompt_cache",
]
