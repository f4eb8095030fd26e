"""The output head: the model's own logits from gathered hidden states, transform included, in every scorer."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import TINY_LLAMA
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.head import Chain, Scale, SoftCap, model_tail_logits, output_head
from lit_prunedpo.scoring import TokenScorer, model_head, split_causal_lm
from lit_prunedpo.zoo import build_tiny


@pytest.mark.parametrize("transform", [Scale(0.25), SoftCap(3.0), Chain(Scale(2.0), SoftCap(5.0))], ids=repr)
def test_transform_derivatives_match_autograd(transform):
    logits = (torch.randn(64, 50, dtype=torch.float64) * 8).requires_grad_()
    (grad,) = torch.autograd.grad(transform(logits).sum(), logits)
    assert torch.allclose(transform.derivative(logits.detach()), grad)


def _last_hidden(model, ids):
    body, _ = split_causal_lm(model)
    return body(input_ids=ids).last_hidden_state


@pytest.mark.parametrize("model_type, how", [
    ("llama", "linear head"), ("granite", "Scale"), ("cohere", "Scale"), ("falcon_h1", "Scale"),
    ("gemma2", "SoftCap"), ("gemma3_text", "SoftCap"),
])
def test_the_head_gives_the_models_own_logits(model_type, how):
    model = build_tiny(model_type).eval()
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    head = model_head(model)
    assert how in head.how or how in repr(head.transform), head
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        ours = head(_last_hidden(model, ids).flatten(0, 1)).view_as(expected)
    assert torch.allclose(ours, expected, atol=1e-5), float((ours - expected).abs().max())


class ShiftedLogits(LlamaForCausalLM):
    """A model whose forward does something after its head that no config field names."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits.roll(1, dims=-1) * 1.5 - 0.5
        return out


def _shifted() -> ShiftedLogits:
    torch.manual_seed(0)
    return ShiftedLogits(LlamaConfig(**TINY_LLAMA)).eval()


def test_an_unknown_transform_is_read_from_the_models_own_forward():
    model = _shifted()
    head = model_head(model)
    assert head.tail is model and not head.fusable and "own forward" in head.how
    h = torch.randn(5, TINY_LLAMA["hidden_size"])
    assert torch.allclose(head(h), model_tail_logits(model, h))
    assert torch.allclose(head(h), (model.lm_head(h).roll(1, -1) * 1.5 - 0.5), atol=1e-6)


@pytest.mark.parametrize("model_source", ["gemma2", "granite", "shifted"])
def test_chunked_scorer_equals_the_plain_one_with_a_transform(model_source):
    """Values and gradients of the fused (scale, soft-cap) and the checkpointed (own forward tail) chunked paths."""
    results = []
    for scorer in (TokenScorer(), ChunkedScorer(chunk_size=3)):
        model = _shifted() if model_source == "shifted" else build_tiny(model_source)
        hidden = torch.randn(7, model.get_input_embeddings().embedding_dim, generator=torch.Generator().manual_seed(2))
        hidden.requires_grad_()
        targets = torch.randint(0, 32, (7,), generator=torch.Generator().manual_seed(3))
        logps = scorer.log_probs(model_head(model), hidden, targets)
        logps.sum().backward()
        results.append((logps.detach(), hidden.grad, split_causal_lm(model)[1].weight.grad))
    (a, ha, wa), (b, hb, wb) = results
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(ha, hb, atol=1e-5) and torch.allclose(wa, wb, atol=1e-5)


def test_the_head_is_read_once_per_model():
    model = build_tiny("granite")
    assert output_head(model, model.lm_head) is output_head(model, model.lm_head)
