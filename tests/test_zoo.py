"""The tiny-model zoo (:mod:`lit_prunedpo.zoo`): every causal-LM type is accounted for, the architectures the
framework is known to serve build, sliding windows bite, hybrids hold both kinds of layer, head transforms and
training-time noise are as the module promises, and building leaves the global RNG alone."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo.zoo import Unbuildable, UnbuildableError, build_tiny, causal_lm_types, tiny_config, zoo

MUST_BUILD = ["llama", "mistral", "qwen2", "gemma2", "gemma3_text", "granite", "cohere", "gpt2", "opt", "bloom", "mpt",
              "mamba", "qwen3_next", "lfm2", "falcon_h1", "granitemoehybrid", "phimoe", "gpt_bigcode", "starcoder2"]


def build_any(model_type: str) -> torch.nn.Module:
    """Built with sdpa, or with eager where the class has no sdpa attention (Gemma 2, BLOOM, MPT, Mamba, ...)."""
    try:
        return build_tiny(model_type, attn_implementation="sdpa")
    except UnbuildableError as err:
        if "does not support attn_implementation='sdpa'" not in err.unbuildable.reason:
            raise
    return build_tiny(model_type, attn_implementation="eager")


def test_every_causal_lm_type_is_buildable_or_has_a_reason():
    types = causal_lm_types()
    assert types == sorted(types) and len(types) == len(set(types)) and "llama" in types
    ok, out = zoo("sdpa")
    assert zoo("sdpa") is zoo("sdpa")  # cached
    left_out = [u.model_type for u in out]
    assert sorted(ok + left_out) == types, "a type is missing or counted twice"
    assert ok == sorted(ok) and left_out == sorted(left_out)
    for u in out:
        assert isinstance(u, Unbuildable) and u.reason.strip() and "\n" not in u.reason, u
    assert len(ok) > 100  # transformers 5.24: 141 with sdpa
    reasons = {u.model_type: u.reason for u in out}
    assert reasons["bart"].startswith("encoder-decoder")
    assert reasons["gemma3"].startswith("multimodal")


@pytest.mark.parametrize("model_type", MUST_BUILD)
def test_known_architectures_build_tiny(model_type):
    model = build_any(model_type)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert logits.shape[:2] == (2, 12) and logits.shape[2] >= 128 and torch.isfinite(logits).all()


@pytest.mark.parametrize("model_type", ["gemma3_text", "mistral", "gpt_oss"])
def test_sliding_window_is_on_with_window_8(model_type):
    config = build_any(model_type).config
    assert config.sliding_window == 8
    kinds = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers  # Mistral: all
    assert "sliding_attention" in kinds
    if model_type != "mistral":  # alternating local/global: one of each
        assert "full_attention" in kinds


def test_sliding_window_bites_on_a_sequence_longer_than_it():
    """Mistral's 2 sliding layers see 2 x 7 tokens back: token 0 cannot reach position 15 or later."""
    model = build_tiny("mistral").eval()
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % 128
    with torch.no_grad():
        diff = (model(input_ids=ids).logits - model(input_ids=changed).logits).abs().amax(-1)[0]
    assert diff[:15].max() > 0 and diff[15:].max() == 0


@pytest.mark.parametrize("model_type, recurrent", [
    ("qwen3_next", "linear_attention"), ("lfm2", "conv"), ("granitemoehybrid", "linear_attention"),
    ("jamba", "linear_attention"), ("bamba", "linear_attention"), ("recurrent_gemma", "recurrent"),
])
def test_hybrids_hold_both_kinds_of_layer(model_type, recurrent):
    config = tiny_config(model_type)
    kinds = getattr(config, "block_types", None) or config.layer_types
    assert recurrent in kinds and any(k != recurrent for k in kinds), kinds


def test_head_transforms_are_non_trivial_and_defaults_kept():
    assert tiny_config("granite").logits_scaling == 4.0  # default 1.0
    assert tiny_config("falcon_h1").lm_head_multiplier == 0.5  # default 1.0
    assert tiny_config("gemma3_text").final_logit_softcapping == 2.0  # default None
    assert tiny_config("gemma2").final_logit_softcapping == 30.0  # its default, kept
    assert tiny_config("cohere").logit_scale == 0.0625  # its default, kept
    assert tiny_config("mpt").logit_scale is None  # MPT's model ignores the field: not set


def test_dropout_is_left_as_shipped():
    from transformers import GPT2Config, MixtralConfig, Qwen2MoeConfig

    gpt2 = tiny_config("gpt2")
    assert (gpt2.attn_pdrop, gpt2.resid_pdrop, gpt2.embd_pdrop) == (GPT2Config().attn_pdrop, GPT2Config().resid_pdrop,
                                                                    GPT2Config().embd_pdrop) == (0.1, 0.1, 0.1)
    assert tiny_config("mixtral").router_jitter_noise == MixtralConfig().router_jitter_noise
    assert tiny_config("qwen2_moe").attention_dropout == Qwen2MoeConfig().attention_dropout


def test_seeded_without_touching_the_global_rng():
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a = build_tiny("llama", seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = build_tiny("llama", seed=0)
    c = build_tiny("llama", seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


@pytest.mark.parametrize("model_type, reason", [
    ("bart", "encoder-decoder"), ("trocr", "encoder-decoder"), ("gemma3", "multimodal"),
    ("xlnet", "not causal"), ("reformer", "nondeterministic"),
])
def test_unbuildable_types_say_why(model_type, reason):
    with pytest.raises(UnbuildableError) as info:
        build_tiny(model_type, attn_implementation="eager")
    assert info.value.unbuildable.model_type == model_type
    assert info.value.unbuildable.reason.startswith(reason), info.value.unbuildable.reason
