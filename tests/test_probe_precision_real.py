"""SmolLM2-135M-Instruct, a real pretrained model: the probe passes it in float32, bf16-mixed and bf16-true, stops the
bug classes injected into it in bf16, and the default path gives plain Hugging Face DPO's loss and gradient.

The recurrent-padding class has no share here (SmolLM2 has no recurrent layer): ``test_probe_precision.py`` stops it
on RWKV. The sliding-window class runs SmolLM2's own weights as a Mistral model (the same architecture plus a
window) with an 8-token window.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from helpers import Built
from lit_prunedpo import PrunedDPO
from lit_prunedpo.conformance import AutoLayout, choose_layout, probe_batch
from lit_prunedpo.layout import SharedPromptLayout
from lit_prunedpo.scoring import TokenScorer
from test_conformance_zoo import plain_dpo_loss
from test_probe_precision import BF16, DropsLogitTransform, _stops, running_in, window_ignored  # noqa: F401

pytestmark = pytest.mark.slow

GGUF = (Path(__file__).resolve().parents[2] / "shared" / "models" / "smollm2-135m-instruct"
        / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def smollm2():
    if not GGUF.exists():
        pytest.fail(f"{GGUF} is missing: the tests expect the shared/ folder beside the checkout")
    from lit_prunedpo.models import Pretrained

    return Pretrained(str(GGUF)).build().eval()


@pytest.mark.parametrize("name, autocast, weights", [("32-true", None, None), *BF16], ids=["32-true", "bf16-mixed",
                                                                                          "bf16-true"])
def test_smollm2_keeps_the_packed_layout_in_every_precision(smollm2, name, autocast, weights):
    with running_in(smollm2, autocast, weights):
        choice = choose_layout(AutoLayout(), [smollm2], TokenScorer())
    assert type(choice.layout) is SharedPromptLayout, choice.line


@contextlib.contextmanager
def _with_logit_transform(model, transform):
    """SmolLM2 with ``transform`` after its LM head in its own forward (as Cohere's scale, Gemma 2's soft-cap),
    inside the ``with`` block."""
    cls = type(model)
    model.__class__ = type(f"{cls.__name__}WithTransform", (cls,), {
        "forward": lambda self, *a, **k: _transformed(cls.forward(self, *a, **k), transform)})
    try:
        yield model
    finally:
        model.__class__ = cls


def _transformed(out, transform):
    out.logits = transform(out.logits)
    return out


@pytest.mark.parametrize("name, autocast, weights", BF16, ids=[p[0] for p in BF16])
@pytest.mark.parametrize("transform", [lambda l: l * 0.0625, lambda l: 30.0 * torch.tanh(l / 30.0)],
                         ids=["logit-scale", "soft-cap"])
def test_a_dropped_logit_transform_on_smollm2_is_stopped_in_bf16(smollm2, transform, name, autocast, weights):
    with _with_logit_transform(smollm2, transform):
        _stops(smollm2, SharedPromptLayout(), DropsLogitTransform(), autocast, weights)


@pytest.fixture(scope="module")
def smollm2_windowed(smollm2):
    from transformers import MistralConfig, MistralForCausalLM

    own = smollm2.config.to_dict()
    config = MistralConfig(**{k: v for k, v in own.items() if k not in ("architectures", "model_type")})
    config.sliding_window = 8
    model = MistralForCausalLM(config)
    model.load_state_dict(smollm2.state_dict())
    return model.eval()


@pytest.mark.parametrize("name, autocast, weights", BF16, ids=[p[0] for p in BF16])
def test_an_ignored_sliding_window_on_smollm2_weights_is_stopped_in_bf16(smollm2_windowed, window_ignored, name,
                                                                         autocast, weights):
    _stops(smollm2_windowed, SharedPromptLayout(), TokenScorer(), autocast, weights)


def _loss_and_gradient(module, batch, autocast):
    context = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
    module.policy.zero_grad()
    with context:
        out = module.step(batch)
    out.estimate.objective.backward()
    ours = torch.cat([p.grad.flatten() for p in module.policy.parameters()])
    module.policy.zero_grad()
    with context:
        loss = plain_dpo_loss(module.policy.eval(), module.reference.models()[0], batch, module.beta)
    loss.backward()
    module.policy.train()
    plain = torch.cat([p.grad.flatten() for p in module.policy.parameters()])
    return float(out.estimate.objective), float(loss), ours, plain


def moved_off_reference(model):
    """The default ``PrunedDPO`` on ``model`` with its policy moved off the reference (or every loss is ln 2 whatever
    computes it), in training mode, and the probe's pairs."""
    module = PrunedDPO(policy=Built(model))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in module.policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)
    module.train()
    return module, probe_batch(model)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["32-true", "bf16-mixed"])
def test_the_default_path_gives_plain_dpos_loss_and_gradient_on_smollm2(smollm2, autocast):
    """The default path (automatic layout, online reference) against DPO from the plain forward of each response
    alone, on the probe's pairs with the policy moved off the reference. In float32 to 1e-4 relative; in bf16-mixed
    both run in bfloat16 and round differently, so the bound is the float32 one widened to bfloat16's rounding."""
    module, batch = moved_off_reference(smollm2)
    ours_loss, plain_loss, ours, plain = _loss_and_gradient(module, batch, autocast)
    relative = 1e-4 if autocast is None else 2e-2
    assert abs(ours_loss - plain_loss) <= relative * abs(plain_loss), (ours_loss, plain_loss)
    assert float((ours - plain).norm()) <= (1e-3 if autocast is None else 0.1) * float(plain.norm())
