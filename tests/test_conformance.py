"""The set-up conformance check and the automatic layout."""

from __future__ import annotations

import logging

import pytest
import torch

from helpers import Built, make_batch
from lit_prunedpo import PrunedDPO
from lit_prunedpo.conformance import AutoLayout, choose_layout, layout_error, plain_logps, probe_batch
from lit_prunedpo.layout import LeftPaddedLayout, RightPaddedLayout, SharedPromptLayout
from lit_prunedpo.layout.padded import RightPaddedGroup
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.zoo import build_tiny


def test_the_probe_has_left_padding_a_shared_start_and_a_row_past_the_window():
    model = build_tiny("mistral")  # sliding window 8
    batch = probe_batch(model)
    assert not batch.prompt_mask.all()  # left padding
    chosen, rejected = batch.response_ids[0]
    assert torch.equal(chosen[:3], rejected[:3]) and chosen[3] != rejected[3]
    longest = int((batch.prompt_mask.sum(-1)[:, None] + batch.response_mask.sum(-1)).max())
    assert longest > 8 + 4


@pytest.mark.parametrize("model_type, layout", [
    ("llama", SharedPromptLayout), ("mistral", SharedPromptLayout), ("gemma3_text", SharedPromptLayout),
    ("mamba", RightPaddedLayout), ("bloom", RightPaddedLayout), ("mpt", RightPaddedLayout),
    ("recurrent_gemma", RightPaddedLayout), ("roberta", RightPaddedLayout),
])
def test_auto_picks_the_fastest_exact_layout_and_says_why(model_type, layout, caplog):
    module = PrunedDPO(policy=Built(build_tiny(model_type)))
    with caplog.at_level(logging.INFO):
        chosen = module.resolved_layout()
    assert type(chosen) is layout
    line = module._layout_choice.line
    assert line.startswith(f"layout: {layout.__name__} for ") and "plain forward" in line
    if layout is not SharedPromptLayout:
        assert "SharedPromptLayout: " in line  # why the faster one was passed over


def test_mamba_packed_refusal_names_the_recurrent_layer():
    with pytest.raises(ValueError, match="MambaForCausalLM exactly: .*recurrent"):
        SharedPromptLayout().check_model(build_tiny("mamba"))


def test_alibi_refusal_is_named():
    with pytest.raises(ValueError, match="ALiBi"):
        SharedPromptLayout().check_model(build_tiny("mpt"))


class OffByOne(RightPaddedLayout):
    """A wrong layout: every token one column late (what an off-by-one in a layout looks like)."""

    def arrange(self, group, pairs, previous=None):
        laid = super().arrange(group, pairs, previous)

        class Shifted(RightPaddedGroup):
            def inputs(self, batch):
                inputs = super().inputs(batch)
                return type(inputs)(**{**inputs.__dict__, "input_ids": inputs.input_ids.roll(1, dims=1)})

        return Shifted(laid.group, laid.pairs)


def test_a_wrong_layout_falls_back_with_one_line_or_stops_when_strict(tiny_source):
    module = PrunedDPO(policy=tiny_source, layout=OffByOne())
    assert type(module.resolved_layout()) is RightPaddedLayout
    assert "OffByOne: its log-probs differ from the plain forward by up to" in module._layout_choice.line
    strict = PrunedDPO(policy=tiny_source, layout=OffByOne(), strict_layout=True)
    with pytest.raises(ValueError, match="model.layout OffByOne does not run LlamaForCausalLM exactly"):
        strict.resolved_layout()


def test_without_the_check_the_given_layout_runs_as_is(tiny_source):
    module = PrunedDPO(policy=tiny_source, layout=OffByOne(), check_layout=False)
    assert isinstance(module.resolved_layout(), OffByOne)
    assert "check_layout is off" in module._layout_choice.line


def test_layout_and_its_shorthand_are_not_both_given(tiny_source):
    with pytest.raises(ValueError, match="not both"):
        PrunedDPO(policy=tiny_source, layout=LeftPaddedLayout(), shared_prompt=True)
    assert isinstance(PrunedDPO(policy=tiny_source, shared_prompt=False).resolved_layout(), LeftPaddedLayout)


def test_an_unresolved_auto_layout_arranges_nothing(small_batch):
    with pytest.raises(RuntimeError, match="resolved"):
        AutoLayout().arrange(None, None)
    with pytest.raises(ValueError, match="at least one"):
        AutoLayout([])


@pytest.mark.parametrize("layout", [SharedPromptLayout, LeftPaddedLayout, RightPaddedLayout])
def test_each_layout_is_exact_on_llama_on_other_shapes(tiny_source, layout):
    model = tiny_source.build().eval()
    batch = make_batch([3, 1, 4, 2], [12, 2, 7, 9], [4, 14, 1, 6], seed=3)
    assert layout_error(model, layout(), TokenScorer(), batch, plain_logps(model, batch)) < 1e-5


def test_the_right_padded_layout_runs_no_left_padding(tiny_source):
    module = PrunedDPO(policy=tiny_source, layout=RightPaddedLayout())
    batch = make_batch([3, 1, 4], [5, 2, 7], [4, 6, 1])
    out = module.step(batch)
    (forward,) = out.forwards.policy
    inputs = forward.laid_out.inputs(batch)
    lengths = inputs.attention_mask.sum(-1)
    assert torch.equal(inputs.attention_mask, (torch.arange(inputs.attention_mask.shape[1]) < lengths[:, None]).long())
    assert forward.laid_out.real_tokens == int(lengths.sum())


def test_a_reference_model_is_checked_too(tiny_source):
    """The frozen reference runs the chosen layout as well: a layout it cannot run is not chosen."""
    module = PrunedDPO(policy=tiny_source)
    models = [module.policy, build_tiny("mamba").eval()]
    choice = choose_layout(AutoLayout(), models, TokenScorer(), dropout_check=False)
    assert type(choice.layout) is not SharedPromptLayout
