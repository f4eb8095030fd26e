"""Stage 2 of a step, **execute**: run a causal LM on a row group's truncated inputs and score its positions.

``group_inputs`` slices the batch to the group's executed width (prefix pruning shortens the tensor that
runs) and lists the scored positions. ``TokenScorer`` runs the model *body* on those inputs, gathers the
hidden states at the scored positions, and only then applies the LM head and the log-softmax (position
pruning shrinks the ``K x V`` logits, never computing the rest). The scorer knows nothing about sampling.
A group planned with ``shared_prompt`` is laid out as packed blocks, one per pair, with a 4-D attention mask
(``lit_prunedpo.shared_prompt``); the scorer runs it the same way.

Departure from a stock ``model(input_ids).logits``: the body and the head are called separately, so models
that transform logits after the head (Gemma-2's soft-capping, Cohere's ``logit_scale``) are refused rather
than scored wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.plan import RowGroup
from lit_prunedpo.shared_prompt import model_attention_mask, packed_group_inputs


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
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    gather_row: Tensor
    gather_col: Tensor
    targets: Tensor


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
        """``[n, W, d]`` last hidden states of the model body on the group's inputs."""
        mask = inputs.attention_mask
        if mask.ndim == 4:
            mask = model_attention_mask(body, mask)
        out = body(
            input_ids=inputs.input_ids,
            attention_mask=mask,
            position_ids=inputs.position_ids,
            use_cache=False,
        )
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
