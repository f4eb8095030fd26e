"""Stage 2 of a step, **execute**: run a causal LM on a row group's truncated inputs and score its positions.

``group_inputs`` slices the batch to the group's executed width (prefix pruning shortens the tensor that
runs) and lists the scored positions. ``TokenScorer`` runs the model *body* on those inputs, gathers the
hidden states at the scored positions, and only then applies the LM head and the log-softmax (position
pruning shrinks the ``K x V`` logits, never computing the rest). The scorer knows nothing about sampling.
A group planned with ``shared_prompt`` is laid out as packed blocks, one per pair, with a 4-D attention mask
(``lit_prunedpo.shared_prompt``); the scorer runs it the same way. :func:`score_groups` runs a plan's groups in
order and hands a group that reads its prompts from the previous forward (``RowGroup.cached_len``) that
forward's keys and values, detached.

Departure from a stock ``model(input_ids).logits``: the body and the head are called separately, so models
that transform logits after the head (Gemma-2's soft-capping, Cohere's ``logit_scale``) are refused rather
than scored wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.plan import RowGroup
from lit_prunedpo.shared_prompt import model_attention_mask, packed_group_inputs


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
                "the previous forward kept no keys and values (gradient checkpointing drops them): plan the step "
                "with prompt_cache=False"
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
        position_ids: ``[n, W]`` positions that ignore the left padding.
        gather_row: ``[K]`` row of each scored position.
        gather_col: ``[K]`` column whose hidden state predicts the scored token (one before it).
        targets: ``[K]`` the scored response tokens.
        past: the ``C`` cache columns the mask's first ``C`` key columns refer to (``None``: no cache, the
            mask is ``[S, 1, W, W]``).
        cache: keys and values the forward attends to before its own (gathered at ``past``), or an empty cache
            that it fills with its keys and values for the next group; ``None`` keeps none. Set by
            :func:`score_groups`, so that a scorer needs no argument for it.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    gather_row: Tensor
    gather_col: Tensor
    targets: Tensor
    past: PastColumns | None = None
    cache: DynamicCache | None = None


def group_inputs(batch: PreferenceBatch, group: RowGroup) -> GroupInputs:
    """Build the inputs of ``group``: prompt ``++ y_1..y_{L-1}``, cut to the group's width."""
    if group.shared_prompt:
        return packed_group_inputs(batch, group)
    P, W = batch.prompt_width, group.width
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


_UNSUPPORTED_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def split_causal_lm(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """Return ``(body, head)`` of a ``transformers`` causal LM: hidden states in, vocabulary logits out.

    A peft (LoRA) model is split as the ``transformers`` model it wraps: its adapters sit inside those layers."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        model = model.get_base_model()
    config = getattr(model, "config", None)
    for name in _UNSUPPORTED_LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            raise ValueError(
                f"{type(model).__name__} transforms its logits after the LM head ({name}={value}); "
                "lit_prunedpo scores gathered hidden states with the head alone and does not support it yet"
            )
    body = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if body is None or body is model or head is None:
        raise ValueError(
            f"cannot split {type(model).__name__} into a body and an LM head: expected a transformers "
            "*ForCausalLM model with `base_model` and `get_output_embeddings()`"
        )
    return body, head


class TokenScorer:
    """Per-token log-probabilities at gathered positions: body on all kept columns, head on ``K`` rows.

    Subclass and override :meth:`log_probs` for another head computation (e.g. a chunked one).
    """

    def hidden_states(self, body: nn.Module, inputs: GroupInputs) -> Tensor:
        """``[n, W, d]`` last hidden states of the model body on the group's inputs (and ``inputs.cache``)."""
        mask = inputs.attention_mask
        if mask.ndim == 4:
            mask = model_attention_mask(body, mask)
        cache = inputs.cache
        keys_values = {"cache": cache, "use_cache": True} if cache is not None else {"use_cache": False}
        out = body(input_ids=inputs.input_ids, attention_mask=mask, position_ids=inputs.position_ids, **keys_values)
        return out.last_hidden_state

    def log_probs(self, head: nn.Module, hidden: Tensor, targets: Tensor) -> Tensor:
        """``[K]`` log-probabilities of ``targets`` from gathered hidden states ``[K, d]``."""
        logits = head(hidden).float()
        return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)

    def __call__(self, model: nn.Module, inputs: GroupInputs) -> Tensor:
        body, head = split_causal_lm(model)
        hidden = self.hidden_states(body, inputs)
        gathered = hidden[inputs.gather_row, inputs.gather_col]
        return self.log_probs(head, gathered, inputs.targets)


def score_groups(
    scorer: TokenScorer, model: nn.Module, batch: PreferenceBatch, groups: Sequence[RowGroup]
) -> list[Tensor]:
    """Stage 2 for the policy: one forward per group, in order, with a graph only for the gradient groups.

    A group whose rows read their prompts from the previous group's forward (``RowGroup.cached_len``, planned
    with ``prompt_cache``) attends to that forward's keys and values, detached: its log-probs carry no graph.
    """
    logps: list[Tensor] = []
    kept: DynamicCache | None = None
    for i, group in enumerate(groups):
        inputs = group_inputs(batch, group.to(batch.prompt_ids.device))
        cache = None
        if inputs.past is not None:
            if kept is None:
                raise ValueError(
                    f"row group {i} of {len(groups)} reads its prompts from the previous group's forward, which "
                    "did not run first: score the plan's groups together, in order"
                )
            cache = inputs.past.gather(kept)
        keeps = i + 1 < len(groups) and groups[i + 1].cached_len is not None
        if keeps:
            cache = DynamicCache()
        if cache is not None:
            inputs = replace(inputs, cache=cache)
        with torch.set_grad_enabled(group.requires_grad and torch.is_grad_enabled()):
            logps.append(scorer(model, inputs))
        kept = cache if keeps else None
    return logps
