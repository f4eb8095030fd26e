"""The packed (shared-prompt) layout: each pair's prompt (and the common start of its responses) runs once per forward.

The padded layout (:mod:`lit_prunedpo.layout.padded`) runs one sequence per response row: the
prompt runs once per branch, left padding fills every prompt up to the batch's longest and right padding every
response up to the group's longest kept prefix. Here a row group runs **one block per pair** instead:

    [ prompt | common prefix | rest of branch a | rest of branch b ]

* the prompt's real tokens (no left padding), then the response tokens both branches share (their common
  prefix, cut to the longest kept prefix of the pair's rows in the group), then each row's own remaining kept
  tokens, one segment per row;
* position ids continue from the prompt into every segment (each branch sees the positions it would see
  alone); a 4-D mask lets a token attend causally to its pair's prompt, common prefix and its own segment only,
  so every hidden state equals the one the padded layout computes (tests: float32, every mode, padding in every
  position, chunked scorer, gradient checkpointing);
* blocks are packed first-fit decreasing into sequences as wide as the longest block (a short pair fills the
  end of a longer pair's sequence; the mask is block-diagonal and positions restart per pair), so padding is
  left only at the end of sequences;
* the gradient of a segment reaches the prompt's keys and values through the attention, so the prompt's
  gradient is the sum over the branches that carry a graph, as in the padded layout.

Why packed blocks with a custom mask rather than a prompt forward whose KV cache the responses
attend to: ``transformers`` (5.x, ``GradientCheckpointingLayer``) drops any cache handed to a layer under
gradient checkpointing in training (the recomputation would write it twice), so the gradient rows could not use
one there. A packed sequence is one ordinary forward: gradient checkpointing, FSDP2 (same forwards in the same
order on every rank) and the chunked scorer compose unchanged. The online reference merges all rows into one
no-grad forward and runs each prompt once. Which positions are scored is the plan's business
(``plan_step(score_common_prefix=...)``).

**The no-grad rows reuse the gradient forward's prompt** when the executor asks for it (``arrange(..., previous)``:
:class:`~lit_prunedpo.step.execute.StepExecutor` does unless gradient checkpointing is on). With branch pruning a pair
has a row in each policy group; the gradient forward keeps its keys and values (a ``DynamicCache``), and the no-grad
row of that pair executes only its own tokens, from the last one it shares with the gradient forward on
(:func:`read_prompt_cache`: the prompt's last token, or the last shared response token, reruns so that the first scored
position's hidden state is computed here). Its block attends to the pair's cached prompt (and shared tokens) through a
``[S, 1, W, C + W]`` mask over ``[cache columns | own columns]``; the cache columns are gathered from the gradient
forward's keys and values, detached, so no gradient flows back through them, as in the padded layout where that row has
no graph. Cached keys carry their rotary positions; position ids continue from the cached tokens. Without the cache
(under gradient checkpointing, where ``transformers`` keeps none: the no-grad rows then rerun their prompts in their
own forward) the results are the same. FSDP2 and the chunked scorer read the cache unchanged (a placeholder
group that keeps the ranks' forwards in step reads none).

The mask is boolean for ``sdpa`` and additive for ``eager`` attention; other attention implementations (flash
attention, flex attention) cannot take a custom 4-D mask through ``transformers`` and are refused with an error
that says how to switch (``shared_prompt: false`` or ``attn_implementation: sdpa``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.layout.attention import packed_refusal
from lit_prunedpo.layout.base import GroupInputs, LaidOutGroup, Layout, PairLengths, PastColumns
from lit_prunedpo.step.plan import RowGroup


@dataclass(frozen=True)
class PackedBlocks:
    """Where every pair and row of a group sits in the group's packed sequences.

    Attributes:
        pair: ``[U]`` the group's pairs (batch indices, sorted).
        pair_seq: ``[U]`` sequence holding each pair.
        pair_start: ``[U]`` column where each pair's first executed token sits in its sequence.
        pair_len: ``[U]`` tokens each pair executes (prompt + shared + its rows' segments, less its cached ones).
        pair_prompt: ``[U]`` real prompt tokens of each pair.
        pair_shared: ``[U]`` response tokens the pair's rows share (after the prompt).
        pair_cached: ``[U]`` leading tokens of the pair's prompt + shared tokens read from the previous forward's
            keys and values instead of executed (0 without a prompt cache).
        pair_cache_start: ``[U]`` first cache column of each pair's cached tokens in its sequence.
        seq_len: ``[S]`` real tokens of each sequence (its pairs together).
        row_pair: ``[n]`` index into ``pair`` of each row.
        shared: ``[n]`` response tokens of the row's pair that its rows share (after the prompt).
        row_start: ``[n]`` column where the row's own segment starts.
        row_len: ``[n]`` length of the row's own segment (kept input tokens past the shared ones).
    """

    pair: Tensor
    pair_seq: Tensor
    pair_start: Tensor
    pair_len: Tensor
    pair_prompt: Tensor
    pair_shared: Tensor
    pair_cached: Tensor
    pair_cache_start: Tensor
    seq_len: Tensor
    row_pair: Tensor
    shared: Tensor
    row_start: Tensor
    row_len: Tensor

    @property
    def num_sequences(self) -> int:
        return int(self.seq_len.numel())

    @property
    def width(self) -> int:
        return int(self.pair_len.max()) if self.pair_len.numel() else 0

    @property
    def cache_width(self) -> int:
        """Cache columns each sequence attends to (its pairs' cached tokens side by side; 0 without a cache)."""
        ends = self.pair_cache_start + self.pair_cached
        return int(ends.max()) if ends.numel() else 0

    @property
    def real_tokens(self) -> int:
        return int(self.pair_len.sum())

    @property
    def row_seq(self) -> Tensor:
        """``[n]`` sequence of each row."""
        return self.pair_seq[self.row_pair]


def packed_layout(
    pair: Tensor, kept: Tensor, prompt_len: Tensor, common_len: Tensor, cached: Tensor | None = None
) -> PackedBlocks:
    """Lay out rows (``pair``, ``kept``, their pair's real ``prompt_len`` and ``common_len``): one block per pair,
    blocks packed first-fit-decreasing into sequences as wide as the longest block.

    A row with kept length ``L`` feeds its first ``L - 1`` response tokens (the last kept token is only a target).
    ``cached`` (``[n]``, default none) leading input tokens of each row are not executed: they are read from the
    previous forward's keys and values (:func:`read_prompt_cache`).
    """
    pairs, row_pair = torch.unique(pair, sorted=True, return_inverse=True)
    own = kept - 1
    U = pairs.numel()
    per_pair = lambda x: torch.zeros(U, dtype=own.dtype).scatter_reduce(0, row_pair, x, "amax", include_self=False)  # noqa: E731
    pair_prompt, pair_shared = per_pair(prompt_len), torch.minimum(per_pair(common_len), per_pair(own))
    pair_cached = per_pair(cached) if cached is not None else torch.zeros_like(pair_prompt)
    shared = pair_shared[row_pair]
    row_len = (own - shared).clamp(min=0)
    pair_len = (pair_prompt + pair_shared - pair_cached).index_add(0, row_pair, row_len)
    # first-fit decreasing: a short pair fills the end of a longer pair's sequence instead of padding (on Python
    # lists: this runs for every group of every step)
    lengths, cached_tokens = pair_len.tolist(), pair_cached.tolist()
    width = max(lengths, default=0)
    seq_of, start_of, cache_start_of = [0] * U, [0] * U, [0] * U
    seq_len: list[int] = []
    cache_len: list[int] = []
    for u in sorted(range(U), key=lambda u: -lengths[u]):
        n = lengths[u]
        seq = next((k for k, used in enumerate(seq_len) if used + n <= width), len(seq_len))
        if seq == len(seq_len):
            seq_len.append(0)
            cache_len.append(0)
        seq_of[u], start_of[u], cache_start_of[u] = seq, seq_len[seq], cache_len[seq]
        seq_len[seq] += n
        cache_len[seq] += cached_tokens[u]
    as_tensor = lambda x: torch.tensor(x, dtype=own.dtype)  # noqa: E731
    pair_seq, pair_start, pair_cache_start = as_tensor(seq_of), as_tensor(start_of), as_tensor(cache_start_of)
    # segments follow their pair's prompt and shared tokens, in row order
    cursor = (pair_start + pair_prompt + pair_shared - pair_cached).tolist()
    starts = []
    for u, n in zip(row_pair.tolist(), row_len.tolist()):
        starts.append(cursor[u])
        cursor[u] += n
    row_start = as_tensor(starts)
    return PackedBlocks(pairs, pair_seq, pair_start, pair_len, pair_prompt, pair_shared, pair_cached,
                        pair_cache_start, as_tensor(seq_len), row_pair, shared, row_start, row_len)


@dataclass(frozen=True)
class PromptCache:
    """Which leading input tokens of each row are read from the previous forward's keys and values.

    Attributes:
        cached_len: ``[n]`` leading input tokens (prompt, then response) of each row that are not executed.
        cache_seq: ``[n]`` sequence of the previous forward that holds the row's cached tokens.
        cache_col: ``[n]`` column of that sequence where the row's cached tokens start.
    """

    cached_len: Tensor
    cache_seq: Tensor
    cache_col: Tensor


def read_prompt_cache(group: RowGroup, prompt_len: Tensor, previous: "PackedGroup") -> PromptCache | None:
    """Where the rows of ``group`` (``prompt_len``: ``[n]`` real prompt tokens of each row's pair) read their pair's
    prompt (and shared tokens) from ``previous``'s forward; ``None`` when no row can.

    A row whose pair has a row in ``previous`` (the other branch, in the gradient forward) executes its input
    from column ``k = p - 1 + min(c + 1, L - 1, t0)`` on and attends to the first ``k`` tokens in the keys and
    values ``previous``'s forward computed (``p`` prompt tokens, ``c`` response tokens ``previous`` holds of the
    pair's common prefix, ``L`` the row's kept length, ``t0`` its first scored position). So every scored
    position's hidden state is computed here (the one at ``p - 1 + t0`` included) and every row executes at
    least one token. Rows of pairs with no row in ``previous`` run whole (``k = 0``).
    """
    source = previous.blocks
    where = torch.full((int(torch.cat([group.pair, previous.group.pair]).max()) + 1,), -1, dtype=torch.long)
    where[source.pair] = torch.arange(source.pair.numel())
    u = where[group.pair]
    known = u >= 0
    u = u.clamp(min=0)
    first = torch.full_like(group.kept, torch.iinfo(torch.long).max)
    first = first.scatter_reduce(0, group.scored_row, group.scored_t, "amin")
    k = prompt_len - 1 + torch.minimum(torch.minimum(source.pair_shared[u] + 1, group.kept - 1), first)
    k = torch.where(known, k.clamp(min=0), 0)
    if not bool((k > 0).any()):
        return None
    return PromptCache(k, source.pair_seq[u], source.pair_start[u])


@dataclass(frozen=True)
class PackedGroup(LaidOutGroup):
    """A row group as packed blocks, one per pair.

    Attributes:
        group: the rows (on the CPU).
        blocks: where every pair and row sits.
        prompt_len: ``[n]`` real prompt tokens of each row's pair.
        cache: what the rows read from the previous forward's keys and values (``None``: they run whole).
    """

    group: RowGroup
    blocks: PackedBlocks
    prompt_len: Tensor
    cache: PromptCache | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.num_sequences, self.blocks.width

    @property
    def real_tokens(self) -> int:
        return self.blocks.real_tokens

    @property
    def cached_columns(self) -> int:
        return self.blocks.cache_width if self.cache is not None else 0

    @property
    def reads_previous(self) -> bool:
        return self.cache is not None

    def inputs(self, batch: PreferenceBatch) -> GroupInputs:
        return packed_group_inputs(batch, self)


class SharedPromptLayout(Layout):
    """One packed block per pair (this module's layout); needs ``sdpa`` or ``eager`` attention and layers that mix
    tokens only by (sliding-window) attention."""

    runs_common_start_once = True

    def arrange(self, group: RowGroup, pairs: PairLengths, previous: LaidOutGroup | None = None) -> PackedGroup:
        if pairs.prompt_len is None or pairs.common_len is None:
            raise ValueError("the shared-prompt layout needs every pair's prompt and common-prefix lengths")
        group = group.to("cpu")
        prompt_len, common_len = pairs.prompt_len[group.pair], pairs.common_len[group.pair]
        cache = read_prompt_cache(group, prompt_len, previous) if isinstance(previous, PackedGroup) else None
        blocks = packed_layout(group.pair, group.kept, prompt_len, common_len, cache.cached_len if cache else None)
        return PackedGroup(group, blocks, prompt_len, cache)

    def check_model(self, model: nn.Module) -> None:
        """Refuse a model packed blocks cannot run exactly (:func:`packed_refusal`)."""
        why = packed_refusal(model)
        if why is not None:
            raise ValueError(
                f"the shared-prompt layout cannot run {type(model).__name__} exactly: {why}; use "
                "lit_prunedpo.layout.LeftPaddedLayout or RightPaddedLayout (model.layout), or leave model.layout unset "
                "to let the automatic layout choose"
            )


def packed_group_inputs(batch: PreferenceBatch, laid_out: PackedGroup) -> GroupInputs:
    """The inputs of a packed group: ``[S, W]`` ids and positions, ``[S, 1, W, C + W]`` mask (``C`` cache columns,
    0 unless the group reads the previous forward's keys and values)."""
    device = batch.prompt_ids.device
    group, layout = laid_out.group, laid_out.blocks
    n = group.num_rows
    # a pair's trunk (prompt + shared tokens, equal in both branches) is read from its first row
    first = torch.full((layout.pair.numel(),), n).scatter_reduce(0, layout.row_pair, torch.arange(n), "amin")
    ids, positions, block, segment = _executed_columns(batch, laid_out, first)
    cache_block, cache_positions, past_seq, past_col = _cache_columns(laid_out, first)
    mask = _packed_mask(block, segment, cache_block)
    row, t = group.scored_row, group.scored_t
    return GroupInputs(
        input_ids=ids.to(device),
        attention_mask=mask[:, None].to(device),
        position_ids=positions.to(device),
        gather_row=layout.row_seq[row].to(device),
        gather_col=_scored_columns(laid_out).to(device),
        targets=batch.response_ids.cpu()[group.pair[row], group.branch[row], t].to(device),
        past=PastColumns(past_seq.to(device), past_col.to(device)) if laid_out.cached_columns else None,
        key_positions=torch.cat([cache_positions, positions], -1).to(device),
    )


def _executed_columns(batch: PreferenceBatch, laid_out: PackedGroup,
                      first: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``[S, W]`` ids, positions, block (the pair a column belongs to, -1 padding) and segment (0 the trunk, ``r +
    1`` row ``r``'s own tokens, -1 padding) of the executed columns; ``first``: ``[U]`` each pair's first row."""
    group, layout = laid_out.group, laid_out.blocks
    S, W, P = layout.num_sequences, layout.width, batch.prompt_width
    prompt_ids, response_ids = batch.prompt_ids.cpu(), batch.response_ids.cpu()
    pair, branch, prompt_len = group.pair, group.branch, laid_out.prompt_len
    n, U = group.num_rows, layout.pair.numel()
    rows = torch.arange(n)
    # one span per trunk, then one per row segment: where it sits, what it reads, which block and segment it is
    span_seq = torch.cat([layout.pair_seq, layout.row_seq])
    span_col = torch.cat([layout.pair_start, layout.row_start])
    span_len = torch.cat([layout.pair_prompt + layout.pair_shared - layout.pair_cached, layout.row_len])
    span_row = torch.cat([first, rows])
    span_from = torch.cat([layout.pair_cached, prompt_len + layout.shared])  # first input index of the span
    span_block = torch.cat([torch.arange(U), layout.row_pair])
    span_segment = torch.cat([torch.zeros(U, dtype=torch.long), rows + 1])
    # one entry per executed token; input index j of row r is its prompt's token j, then response token j - p
    span, offset = _expand(span_len)
    s, col, j = span_seq[span], span_col[span] + offset, span_from[span] + offset
    r = span_row[span]
    i, p = pair[r], prompt_len[r]
    from_prompt = prompt_ids[i, (P - p + j).clamp(max=P - 1)]
    from_response = response_ids[i, branch[r], (j - p).clamp(0, batch.response_width - 1)]
    ids = torch.zeros(S, W, dtype=torch.long)
    positions = torch.zeros(S, W, dtype=torch.long)
    block = torch.full((S, W), -1, dtype=torch.long)
    segment = torch.full((S, W), -1, dtype=torch.long)
    ids[s, col] = torch.where(j < p, from_prompt, from_response)
    positions[s, col] = j
    block[s, col] = span_block[span]
    segment[s, col] = span_segment[span]
    return ids, positions, block, segment


def _cache_columns(laid_out: PackedGroup, first: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``[S, C]`` block (the pair a cache column belongs to, -1 none), positions, and the previous forward's
    sequence and column each cache column reads: each pair's cached tokens side by side (``C`` is 0 without a
    cache); ``first``: ``[U]`` each pair's first row."""
    layout, cache = laid_out.blocks, laid_out.cache
    S, C = layout.num_sequences, laid_out.cached_columns
    cache_block = torch.full((S, C), -1, dtype=torch.long)
    past_seq, past_col = torch.zeros(S, C, dtype=torch.long), torch.zeros(S, C, dtype=torch.long)
    cache_positions = torch.zeros(S, C, dtype=torch.long)
    if C:
        u, offset = _expand(layout.pair_cached)
        s, col = layout.pair_seq[u], layout.pair_cache_start[u] + offset
        cache_block[s, col] = u
        cache_positions[s, col] = offset  # a pair's cached tokens are its first input tokens
        past_seq[s, col] = cache.cache_seq[first[u]]
        past_col[s, col] = cache.cache_col[first[u]] + offset
    return cache_block, cache_positions, past_seq, past_col


def _packed_mask(block: Tensor, segment: Tensor, cache_block: Tensor) -> Tensor:
    """``[S, W, C + W]``: which cache and executed columns each executed column attends to."""
    W = block.shape[1]
    # token j attends token k: k <= j in the same pair, k in the pair's prompt + shared tokens or in j's own
    # segment; padding attends itself only (a query with no key would give NaN)
    causal = torch.ones(W, W, dtype=torch.bool).tril()
    same_pair = (block[:, None, :] == block[:, :, None]) & (block[:, None, :] >= 0)
    key, query = segment[:, None, :], segment[:, :, None]
    mask = causal & same_pair & ((key == 0) | (key == query))
    mask |= torch.eye(W, dtype=torch.bool)
    # cached tokens all precede the pair's executed ones: a token attends to every cached token of its pair
    return torch.cat([(cache_block[:, None, :] == block[:, :, None]) & (cache_block[:, None, :] >= 0), mask], -1)


def _scored_columns(laid_out: PackedGroup) -> Tensor:
    """``[K]`` the column whose hidden state predicts each scored position."""
    group, layout = laid_out.group, laid_out.blocks
    # scored position t of row r is predicted by its input token t - 1 (the prompt's last token for t = 0), which
    # sits at column a - k + p + t - 1 in the pair's trunk, or in the row's own segment past the shared tokens
    t = group.scored_t
    row = group.scored_row
    u = layout.row_pair[row]
    a, k = layout.pair_start[u], layout.pair_cached[u]
    p, c, start = laid_out.prompt_len[row], layout.shared[row], layout.row_start[row]
    return torch.where(t - 1 < c, a - k + p + t - 1, start + t - 1 - c)


def _expand(lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``(span, offset)`` of every element of consecutive spans of ``lengths``: span ``k`` repeated ``lengths[k]``
    times, with offsets ``0 .. lengths[k] - 1``."""
    span = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    offset = torch.arange(span.numel()) - (lengths.cumsum(0) - lengths)[span]
    return span, offset
