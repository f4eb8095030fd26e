"""Training-time noise: config dropout fields, router jitter and training-mode sampling are off in the policy's
steps."""

from __future__ import annotations

import pytest
import torch
from helpers import Built

from lit_prunedpo import PrunedDPO
from lit_prunedpo.conformance import choose_layout
from lit_prunedpo.dropout import dropout_free_training, turn_off_dropout
from lit_prunedpo.layout import RightPaddedLayout
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.zoo import build_tiny, tiny_config

NOISY = {  # model type -> config fields that make its training-mode forward random
    "opt": {"dropout": 0.3, "attention_dropout": 0.3, "layerdrop": 0.3},
    "gpt_bigcode": {"attn_pdrop": 0.3, "resid_pdrop": 0.3, "embd_pdrop": 0.3},
    "seed_oss": {"attention_dropout": 0.3, "residual_dropout": 0.3},
    "mixtral": {"router_jitter_noise": 0.3, "attention_dropout": 0.3},
    "phimoe": {"input_jitter_noise": 0.3},  # and its router's Gumbel sampling, in training mode whatever the config
}
IDS = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(0))


def noisy(model_type: str) -> torch.nn.Module:
    config = tiny_config(model_type)
    for key, value in NOISY[model_type].items():
        setattr(config, key, value)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits


@pytest.mark.parametrize("model_type", list(NOISY))
def test_the_noise_is_there_before_and_gone_after(model_type):
    model = noisy(model_type).train()
    torch.manual_seed(1)
    first = logits(model)
    assert not torch.allclose(first, logits(model)), "the config should make the training forward random"
    changed = turn_off_dropout(model)
    model.train()
    dropout_free_training(model)
    assert torch.equal(logits(model), logits(model))
    assert torch.allclose(logits(model), logits(model.eval()), atol=1e-6)
    if model_type != "phimoe":
        assert changed


@pytest.mark.parametrize("model_type", list(NOISY))
def test_the_module_trains_without_noise_unless_asked(model_type):
    model = noisy(model_type)
    module = PrunedDPO(policy=Built(model))
    module.train()  # what Lightning does: the module re-applies noise-free training
    assert torch.equal(logits(module.policy), logits(module.policy))
    kept = PrunedDPO(policy=Built(model), disable_dropout=False)
    kept.train()
    assert not torch.allclose(logits(kept.policy), logits(kept.policy))


def test_phimoe_router_threshold_is_not_touched():
    """PhiMoE's ``router_jitter_noise`` is a routing threshold in eval mode too: zeroing it would change the model."""
    model = build_tiny("phimoe")
    before = logits(model.eval())
    turn_off_dropout(model)
    assert torch.equal(before, logits(model.eval()))


def test_gradient_checkpointing_still_runs_in_dropout_free_training(tiny_source):
    module = PrunedDPO(policy=tiny_source, gradient_checkpointing=True)
    module.train()
    layers = [m for m in module.policy.modules() if getattr(m, "gradient_checkpointing", False)]
    assert layers and all(m.training for m in layers)
    assert not any(m.training for m in module.policy.modules() if isinstance(m, torch.nn.Linear))


def test_an_unknown_noise_source_stops_the_run(tiny_source):
    """Noise added at the decoder layer, where noise-free training keeps training mode and no field names it."""
    module = PrunedDPO(policy=tiny_source)
    layer = module.policy.model.layers[0]

    def jitter(m, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        noisy = hidden + torch.randn_like(hidden) * 0.5 if m.training else hidden
        return (noisy, *output[1:]) if isinstance(output, tuple) else noisy

    layer.register_forward_hook(jitter)
    with pytest.raises(RuntimeError, match="training mode than in eval mode"):
        choose_layout(RightPaddedLayout(), [module.policy], TokenScorer())
