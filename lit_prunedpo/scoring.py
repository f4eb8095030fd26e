"""Scoring one forward: run a causal LM on a forward's inputs and return the log-probs of its scored positions.

``TokenScorer`` runs the model *body* on a :class:`~lit_prunedpo.layout.GroupInputs` (the inputs a layout built,
:mod:`lit_prunedpo.layout`), gathers the hidden states at the scored positions, and only then applies the LM
head and the log-softmax (position pruning shrinks the ``K x V`` logits, never computing the rest). A packed
forward's 4-D mask is put in the form the model's attention takes. The scorer knows nothing about sampling or
layouts; which forwards run, in which order, is the executor's (:mod:`lit_prunedpo.step.execute`).

With a ``stats`` list (what a training step's metrics ask for), the scorer also appends ``[K, 3]`` detached
per-position statistics of the logits it already computed (:func:`token_stats`: TRL's mean logit over the
vocabulary, the entropy, and whether the arg-max is the target), a few element-wise passes over the ``K x V``
logits while they exist anyway; without it, nothing more is computed.

A group whose log-softmax is split (a control-variate position sampler, :mod:`lit_prunedpo.samplers.control_variates`;
``inputs.lse_index`` set) gets :class:`~lit_prunedpo.token_terms.TokenTerms` instead: the target logits at all ``K``
gathered positions (one row of the head each) and the log-sum-exps at the ``K_s`` drawn ones (the whole head there
only); the statistics then cover those ``K_s``.

Departure from a stock ``model(input_ids).logits``: the body and the head are called separately. What a model
does after its LM head (Gemma 2's soft-capping, Cohere's ``logit_scale``, Granite's ``logits_scaling``, ...) is
read from the model itself (:func:`lit_prunedpo.head.output_head`) and applied to the gathered rows, so the
scored log-probs are the model's own.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.head import OutputHead, body_name, output_head
from lit_prunedpo.layout.base import GroupInputs, PastColumns
from lit_prunedpo.layout.attention import model_attention_mask
from lit_prunedpo.layout.padded import padded_inputs
from lit_prunedpo.step.plan import RowGroup
from lit_prunedpo.token_terms import TokenTerms, fused_linear_head, log_sum_exp, target_logits

__all__ = ["GroupInputs", "PastColumns", "TOKEN_STATS", "TokenScorer", "group_inputs", "model_head", "split_causal_lm",
           "token_stats"]

#: The columns of :func:`token_stats`.
TOKEN_STATS = ("logits", "entropy", "correct")


@torch.no_grad()
def token_stats(logits: Tensor, targets: Tensor, log_probs: Tensor | None = None) -> Tensor:
    """``[K, 3]`` float32, detached: each row's mean logit over the vocabulary, its entropy (nats), and 1.0 where its
    arg-max is the target (TRL's ``logits/*``, ``entropy`` and ``mean_token_accuracy`` before averaging).

    ``log_probs`` (the rows' log-softmax, when the caller has it) saves recomputing it. Rows are taken a block at a
    time, so the temporaries stay near ``2**22`` floats (16 MiB) above what the caller already holds."""
    rows = max(1, (1 << 22) // max(1, logits.shape[-1]))
    out = logits.new_empty(logits.shape[0], 3, dtype=torch.float32)
    for start in range(0, logits.shape[0], rows):
        block = logits[start : start + rows].float()
        logp = block.log_softmax(-1) if log_probs is None else log_probs[start : start + rows].float()
        out[start : start + rows, 0] = block.mean(-1)
        out[start : start + rows, 1] = -torch.linalg.vecdot(logp.exp(), logp)
        out[start : start + rows, 2] = (block.argmax(-1) == targets[start : start + rows]).float()
    return out


def group_inputs(batch: PreferenceBatch, group: RowGroup) -> GroupInputs:
    """The inputs of ``group`` in the padded layout (prompt ``++ y_1..y_{L-1}``, cut to ``P + max(L) - 1``): what
    a forward outside a step scores (a reference cache, a test); a step's forwards are the executor's."""
    return padded_inputs(batch, group)


def split_causal_lm(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """Return ``(body, head)`` of a ``transformers`` causal LM: hidden states in, the LM head module's output out
    (what the model does after that module is :func:`model_head`'s).

    A peft (LoRA) model is split as the ``transformers`` model it wraps: its adapters sit inside those layers."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        model = model.get_base_model()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    name = body_name(model)
    body = getattr(model, name) if name is not None else None
    if body is None or head is None:
        raise ValueError(
            f"cannot split {type(model).__name__} into a body and an LM head: expected a transformers "
            "*ForCausalLM model with `base_model` and `get_output_embeddings()`"
        )
    return body, head


def model_head(model: nn.Module, linear: nn.Module | None = None) -> OutputHead:
    """The head that turns ``model``'s gathered hidden states into its own logits, output transform included
    (:func:`lit_prunedpo.head.output_head`); ``linear``, its LM head module when the caller has split it already."""
    unwrapped = model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model
    return output_head(unwrapped, linear if linear is not None else split_causal_lm(model)[1])


class TokenScorer:
    """Per-token log-probabilities at gathered positions: body on all kept columns, head on ``K`` rows.

    Subclass and override :meth:`log_probs` for another head computation (e.g. a chunked one); to report the
    token metrics it appends :func:`token_stats` of its logits to ``stats`` when given one.
    """

    def hidden_states(self, body: nn.Module, inputs: GroupInputs) -> Tensor:
        """``[n, W, d]`` last hidden states of the model body on the group's inputs (and ``inputs.cache``)."""
        mask = inputs.attention_mask
        if mask.ndim == 4:
            mask = model_attention_mask(body, mask, inputs.key_positions, inputs.position_ids)
        cache = inputs.cache
        keys_values = {"cache": cache, "use_cache": True} if cache is not None else {"use_cache": False}
        out = body(input_ids=inputs.input_ids, attention_mask=mask, position_ids=inputs.position_ids, **keys_values)
        return out.last_hidden_state

    def log_probs(self, head: OutputHead, hidden: Tensor, targets: Tensor, stats: list[Tensor] | None = None) -> Tensor:
        """``[K]`` log-probabilities of ``targets`` from gathered hidden states ``[K, d]`` (``head(hidden)`` are the
        model's logits); with ``stats``, appends the rows' :func:`token_stats`."""
        logits = head(hidden).float()
        log_probs = logits.log_softmax(-1)
        if stats is not None:
            stats.append(token_stats(logits, targets, log_probs))
        return log_probs.gather(-1, targets[:, None]).squeeze(-1)

    def log_sum_exp(self, head: OutputHead, hidden: Tensor, targets: Tensor,
                    stats: list[Tensor] | None = None) -> Tensor:
        """``[K]`` float32 log-sum-exps of the model's logits at gathered hidden states ``[K, d]`` (the whole head);
        with ``stats``, appends the rows' :func:`token_stats` (``targets``: what those compare the arg-max with)."""
        logits = head(hidden).float()
        if stats is not None:
            stats.append(token_stats(logits, targets))
        return log_sum_exp(logits)

    def token_terms(self, model: nn.Module, head: OutputHead, hidden: Tensor, targets: Tensor, lse_index: Tensor,
                    stats: list[Tensor] | None = None) -> TokenTerms:
        """The target logits of all ``K`` gathered hidden states ``[K, d]`` and the log-sum-exps of the ``lse_index``
        ones (:meth:`log_sum_exp`, with ``stats`` for those); ``model``'s head must be a plain linear one.

        Raises:
            ValueError: naming the model, for a head whose target logit is not one row of a linear layer
                (:func:`~lit_prunedpo.token_terms.fused_linear_head`).
        """
        linear, transform = fused_linear_head(model, head)
        index = lse_index.to(hidden.device)
        lse = self.log_sum_exp(head, hidden[index], targets[index], stats)
        return TokenTerms(target_logits(linear, transform, hidden, targets), lse)

    def __call__(self, model: nn.Module, inputs: GroupInputs, stats: list[Tensor] | None = None) -> Tensor | TokenTerms:
        """``[K]`` log-probs of the scored positions of ``inputs``, or their :class:`TokenTerms` where
        ``inputs.lse_index`` is set; with ``stats``, appends the ``[K, 3]`` (or ``[K_s, 3]``) :func:`token_stats`
        of the positions the whole head ran on (possibly in several pieces, in row order)."""
        body, linear = split_causal_lm(model)
        head = model_head(model, linear)
        if inputs.lse_index is not None:
            fused_linear_head(model, head)  # a head that cannot be split is refused before the body runs
        hidden = self.hidden_states(body, inputs)
        gathered = hidden[inputs.gather_row, inputs.gather_col]
        if inputs.lse_index is not None:
            return self.token_terms(model, head, gathered, inputs.targets, inputs.lse_index, stats)
        if stats is None:  # a subclass's log_probs written without the stats argument still works
            return self.log_probs(head, gathered, inputs.targets)
        return self.log_probs(head, gathered, inputs.targets, stats)
