"""Shared-prompt execution: each pair's prompt (and the common start of its responses) runs once per forward.

The padded layout of :func:`~lit_prunedpo.scoring.group_inputs` runs one sequence per response row: the
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
order on every rank) and the chunked scorer compose unchanged. The price, with branch pruning: a pair with a row
in each group runs its prompt once per group, once with a graph and once without (the no-grad branch adds no
backward work, but its prompt forward is not saved; a detached cache from the gradient group's forward could
save it and is not done). The online reference merges all rows into one no-grad forward and runs each prompt
once. Which positions are scored is the plan's business (``plan_step(score_common_prefix=...)``).

The mask is boolean for ``sdpa`` and additive for ``eager`` attention; other attention implementations (flash
attention, flex attention) cannot take a custom 4-D mask through ``transformers`` and are refused with an error
that says how to switch (``shared_prompt: false`` or ``attn_implementation: sdpa``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from lit_prunedpo.batch import PreferenceBatch
    from lit_prunedpo.plan import RowGroup
    from lit_prunedpo.scoring import GroupInputs

SUPPORTED_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class PackedLayout:
    """Where every pair and row of a group sits in the group's packed sequences.

    Attributes:
        pair: ``[U]`` the group's pairs (batch indices, sorted).
        pair_seq: ``[U]`` sequence holding each pair.
        pair_start: ``[U]`` column where each pair's prompt starts in its sequence.
        pair_len: ``[U]`` real tokens of each pair (prompt + shared + its rows' segments).
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
    def real_tokens(self) -> int:
        return int(self.pair_len.sum())

    @property
    def row_seq(self) -> Tensor:
        """``[n]`` sequence of each row."""
        return self.pair_seq[self.row_pair]


def packed_layout(pair: Tensor, kept: Tensor, prompt_len: Tensor, common_len: Tensor) -> PackedLayout:
    """Lay out rows (``pair``, ``kept``, their pair's real ``prompt_len`` and ``common_len``): one block per pair,
    blocks packed first-fit-decreasing into sequences as wide as the longest block.

    A row with kept length ``L`` feeds its first ``L - 1`` response tokens (the last kept token is only a target).
    """
    pairs, row_pair = torch.unique(pair, sorted=True, return_inverse=True)
    own = kept - 1
    U = pairs.numel()
    per_pair = lambda x: torch.zeros(U, dtype=own.dtype).scatter_reduce(0, row_pair, x, "amax", include_self=False)  # noqa: E731
    pair_prompt, pair_shared = per_pair(prompt_len), torch.minimum(per_pair(common_len), per_pair(own))
    shared = pair_shared[row_pair]
    row_len = (own - shared).clamp(min=0)
    pair_len = (pair_prompt + pair_shared).index_add(0, row_pair, row_len)
    # first-fit decreasing: a short pair fills the end of a longer pair's sequence instead of padding
    width = int(pair_len.max()) if U else 0
    pair_seq, pair_start = torch.empty_like(pair_len), torch.empty_like(pair_len)
    seq_len: list[int] = []
    for u in sorted(range(U), key=lambda u: -int(pair_len[u])):
        n = int(pair_len[u])
        seq = next((k for k, used in enumerate(seq_len) if used + n <= width), len(seq_len))
        if seq == len(seq_len):
            seq_len.append(0)
        pair_seq[u], pair_start[u] = seq, seq_len[seq]
        seq_len[seq] += n
    # segments follow their pair's prompt and shared tokens, in row order
    row_start = torch.empty_like(row_len)
    cursor = (pair_start + pair_prompt + pair_shared).tolist()
    for r, (u, n) in enumerate(zip(row_pair.tolist(), row_len.tolist())):
        row_start[r] = cursor[u]
        cursor[u] += n
    return PackedLayout(pairs, pair_seq, pair_start, pair_len, torch.tensor(seq_len, dtype=own.dtype), row_pair,
                        shared, row_start, row_len)


def group_layout(group: "RowGroup") -> PackedLayout:
    if group.prompt_len is None or group.common_len is None:
        raise ValueError("this row group was planned without prompt and common-prefix lengths (shared_prompt=False)")
    return packed_layout(group.pair, group.kept, group.prompt_len, group.common_len)


def packed_group_inputs(batch: "PreferenceBatch", group: "RowGroup") -> "GroupInputs":
    """The inputs of ``group`` in the shared-prompt layout: ``[S, W]`` ids and positions, ``[S, 1, W, W]`` mask."""
    from lit_prunedpo.scoring import GroupInputs

    device = batch.prompt_ids.device
    layout = group_layout(group.to("cpu"))
    S, W, P = layout.num_sequences, layout.width, batch.prompt_width
    ids = torch.zeros(S, W, dtype=torch.long)
    positions = torch.zeros(S, W, dtype=torch.long)
    block = torch.full((S, W), -1, dtype=torch.long)  # the pair a column belongs to; -1 padding
    segment = torch.full((S, W), -1, dtype=torch.long)  # 0 prompt + shared, r + 1 row r's own tokens
    prompt_ids, response_ids = batch.prompt_ids.cpu(), batch.response_ids.cpu()
    pair, branch = group.pair.cpu(), group.branch.cpu()
    prompt_len = group.prompt_len.cpu()
    first_row = {}
    for r, u in enumerate(layout.row_pair.tolist()):
        first_row.setdefault(u, r)
    for u, r in first_row.items():
        i, p, c = int(pair[r]), int(prompt_len[r]), int(layout.shared[r])
        s, a = int(layout.pair_seq[u]), int(layout.pair_start[u])
        ids[s, a : a + p + c] = torch.cat([prompt_ids[i, P - p:], response_ids[i, int(branch[r]), :c]])
        positions[s, a : a + p + c] = torch.arange(p + c)
        block[s, a : a + int(layout.pair_len[u])] = u
        segment[s, a : a + p + c] = 0
    row_seq = layout.row_seq
    for r in range(group.num_rows):
        s, start, n = int(row_seq[r]), int(layout.row_start[r]), int(layout.row_len[r])
        p, c = int(prompt_len[r]), int(layout.shared[r])
        ids[s, start : start + n] = response_ids[int(pair[r]), int(branch[r]), c : c + n]
        positions[s, start : start + n] = torch.arange(p + c, p + c + n)
        segment[s, start : start + n] = r + 1
    # token j attends token k: k <= j in the same pair, k in the pair's prompt + shared tokens or in j's own
    # segment; padding attends itself only (a query with no key would give NaN)
    causal = torch.ones(W, W, dtype=torch.bool).tril()
    same_pair = (block[:, None, :] == block[:, :, None]) & (block[:, None, :] >= 0)
    key, query = segment[:, None, :], segment[:, :, None]
    mask = causal & same_pair & ((key == 0) | (key == query))
    mask |= torch.eye(W, dtype=torch.bool)
    # scored position t of row r is predicted by its input token t - 1 (the prompt's last token for t = 0)
    t = group.scored_t.cpu()
    row = group.scored_row.cpu()
    a = layout.pair_start[layout.row_pair[row]]
    p, c, start = prompt_len[row], layout.shared[row], layout.row_start[row]
    column = torch.where(t == 0, a + p - 1, torch.where(t - 1 < c, a + p + t - 1, start + t - 1 - c))
    return GroupInputs(
        input_ids=ids.to(device),
        attention_mask=mask[:, None].to(device),
        position_ids=positions.to(device),
        gather_row=row_seq[row].to(device),
        gather_col=column.to(device),
        targets=response_ids[pair[row], branch[row], t].to(device),
    )


def prompt_and_common_lengths(batch: "PreferenceBatch") -> tuple[Tensor, Tensor]:
    """``([B] real prompt tokens, [B] length of the responses' common prefix)`` of every pair, on the CPU."""
    prompt_len = batch.prompt_mask.sum(1).cpu()
    ids, mask = batch.response_ids.cpu(), batch.response_mask.cpu()
    differ = (ids[:, 0] != ids[:, 1]) | ~mask[:, 0] | ~mask[:, 1]
    T = ids.shape[-1]
    first = differ.int().argmax(-1)
    common = torch.where(differ.any(-1), first, torch.full_like(first, T))
    return prompt_len, common


def attention_implementation(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)


def check_attention(model: nn.Module) -> None:
    """Refuse a model whose attention cannot take the shared-prompt layout's 4-D mask.

    Raises:
        ValueError: naming the model, its attention implementation and the two ways out.
    """
    impl = attention_implementation(model)
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"shared-prompt execution needs a custom 4-D attention mask, which {type(model).__name__} with "
            f"attn_implementation={impl!r} cannot take (supported: {', '.join(SUPPORTED_ATTENTION)}); "
            "set model.shared_prompt=false, or build the model with attn_implementation='sdpa'"
        )


def model_attention_mask(body: nn.Module, mask: Tensor) -> Tensor:
    """The boolean ``[S, 1, W, W]`` mask in the form ``body``'s attention adds or selects with."""
    check_attention(body)
    if attention_implementation(body) == "sdpa":
        return mask
    dtype = body.get_input_embeddings().weight.dtype
    if torch.is_autocast_enabled(mask.device.type):
        dtype = torch.get_autocast_dtype(mask.device.type)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
