"""The conformance probe in the precisions people train in: exact layouts pass, every bug class the zoo found stops.

Each bug class is injected into the step's own code (a scorer that drops the model's logit transform, a mask that
ignores the sliding window, a left-padded layout let loose on a recurrent model) and the probe, run in bfloat16
(autocast as ``bf16-mixed`` runs it, and bfloat16 weights as ``bf16-true``), must stop it. The real model's share
(SmolLM2-135M-Instruct) is in ``test_probe_precision_real.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import pytest
import torch

from helpers import REPO, TINY_LLAMA
from lit_prunedpo.conformance import AutoLayout, choose_layout
from lit_prunedpo.layout import LeftPaddedLayout, RightPaddedLayout, SharedPromptLayout
from lit_prunedpo.layout.attention import AttentionForm
from lit_prunedpo.models import FromConfig
from lit_prunedpo.probe_precision import FLOAT32_TOLERANCE, WorkingPrecision, in_float32, rounding_tolerance
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.zoo import build_tiny
from test_conformance_zoo import FIRST_TRIED

#: (name, autocast dtype, weights dtype): Lightning's bf16-mixed / 16-mixed / bf16-true as the probe sees them
PRECISIONS = [("bf16-mixed", torch.bfloat16, None), ("16-mixed", torch.float16, None),
              ("bf16-true", None, torch.bfloat16)]
BF16 = [p for p in PRECISIONS if p[0] != "16-mixed"]


@contextlib.contextmanager
def running_in(model, autocast, weights):
    """``model`` as a step of that precision runs it: under autocast, or with its weights narrowed (and widened back
    afterwards, exactly)."""
    if weights is not None:
        model.to(weights)
    try:
        with torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext():
            yield model
    finally:
        model.float()


def test_the_working_precision_is_read_from_autocast_and_weights(tiny_source):
    model = tiny_source.build()
    assert WorkingPrecision.of(model) == WorkingPrecision(None, torch.float32)
    assert not WorkingPrecision.of(model).reduced
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert WorkingPrecision.of(model).describe() == "bfloat16 autocast"
    assert WorkingPrecision.of(model.to(torch.bfloat16)).describe() == "bfloat16 weights"


def test_float32_for_the_probe_restores_16_bit_weights_bit_for_bit(tiny_source):
    model = tiny_source.build().to(torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.set_default_dtype(torch.bfloat16)  # as Lightning's bf16-true runs a step
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with in_float32([model]):
                assert next(model.parameters()).dtype == torch.float32
                assert not torch.is_autocast_enabled("cpu")
                assert torch.get_default_dtype() == torch.float32
            assert torch.is_autocast_enabled("cpu")
        assert torch.get_default_dtype() == torch.bfloat16
    finally:
        torch.set_default_dtype(torch.float32)
    for key, value in model.state_dict().items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, before[key]), key


def test_the_tolerance_is_a_multiple_of_the_plain_forwards_rounding():
    assert rounding_tolerance(0.0) == FLOAT32_TOLERANCE
    assert rounding_tolerance(0.25) == pytest.approx(4.0)


@pytest.mark.parametrize("name, autocast, weights", PRECISIONS, ids=[p[0] for p in PRECISIONS])
def test_16_bit_steps_keep_the_packed_layout_and_say_how_it_was_checked(name, autocast, weights):
    """The fixed 1e-3 tolerance sent the quickstart's model to the slower right-padded layout in bf16-mixed."""
    model = FromConfig(model_type="llama", config=TINY_LLAMA, seed=0).build()
    with running_in(model, autocast, weights):
        choice = choose_layout(AutoLayout(), [model], TokenScorer())
    assert type(choice.layout) is SharedPromptLayout, choice.line
    described = WorkingPrecision(autocast, weights or torch.float32).describe()
    assert f"in float32 to 0.001 nats, and in {described} within" in choice.line
    assert "own rounding" in choice.line


# ------------------------------------------------------------------------------------------ the injected bugs
class DropsLogitTransform(TokenScorer):
    """A scorer that applies the LM head's linear layer alone: a logit scale or soft-cap the model applies after
    it is lost (the bug a head read from the config alone had on Cohere, Granite and Gemma 2)."""

    def log_probs(self, head, hidden, targets, stats=None):
        return super().log_probs(dataclasses.replace(head, transform=None, tail=None), hidden, targets, stats)


@pytest.fixture
def window_ignored(monkeypatch):
    """Masks built as if no layer had a sliding window (the bug of a layout that reads ``config.sliding_window``
    under another name than the model's)."""
    monkeypatch.setattr(AttentionForm, "of", classmethod(lambda cls, model: cls({"full_attention": None})))


def _stops(model, layout, scorer, autocast, weights):
    """The probe refuses ``layout`` under ``strict``; without it, the run falls back to the right-padded layout
    with a line naming the difference, or stops where no layout helps (a bug in the scorer)."""
    with running_in(model, autocast, weights):
        with pytest.raises(ValueError, match="does not run .* exactly: .*differ"):
            choose_layout(layout, [model], scorer, strict=True, dropout_check=False)
        try:
            fallback = choose_layout(layout, [model], scorer, dropout_check=False)
        except ValueError as err:
            assert "no layout runs" in str(err) and "differ" in str(err)
        else:
            assert type(fallback.layout) is RightPaddedLayout, fallback.line
            assert f"{type(layout).__name__}: its log-probs differ" in fallback.line


def _zoo(model_type, **changes):
    model = build_tiny(model_type).eval()
    for key, value in changes.items():
        setattr(model.config, key, value)
    return model


@pytest.mark.parametrize("name, autocast, weights", BF16, ids=[p[0] for p in BF16])
@pytest.mark.parametrize("model_type, changes", [
    ("cohere", {}), ("granite", {}),
    ("gemma2", {"final_logit_softcapping": 2.0}),  # the zoo's cap of 30 barely touches a tiny model's logits
], ids=["cohere", "granite", "gemma2"])
def test_a_dropped_logit_transform_is_stopped_in_bf16(model_type, changes, name, autocast, weights):
    model = _zoo(model_type, **changes)
    _stops(model, RightPaddedLayout(), DropsLogitTransform(), autocast, weights)


@pytest.mark.parametrize("name, autocast, weights", BF16, ids=[p[0] for p in BF16])
def test_an_ignored_sliding_window_is_stopped_in_bf16(window_ignored, name, autocast, weights):
    model = _zoo("mistral")  # sliding window 8; the probe has a row past it
    _stops(model, SharedPromptLayout(), TokenScorer(), autocast, weights)


@pytest.mark.parametrize("name, autocast, weights", BF16, ids=[p[0] for p in BF16])
def test_padding_read_by_a_recurrent_layer_is_stopped_in_bf16(name, autocast, weights):
    """RWKV takes no attention mask: left padding runs through its recurrence (Mamba zeroes its padded inputs)."""
    model = _zoo("rwkv")
    _stops(model, LeftPaddedLayout(), TokenScorer(), autocast, weights)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "16-mixed"])
def test_lightnings_16_bit_precisions_train_with_the_packed_layout(precision, tmp_path, caplog):
    """The quickstart through the real CLI: the probe runs inside Lightning's precision context (autocast, or bf16
    weights and default dtype) at the first step, keeps the packed layout and says it checked both ways."""
    from lit_prunedpo.cli import main

    caplog.set_level(logging.INFO)
    main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.precision={precision}",
          "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
          "--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={tmp_path}"])
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("layout: "))
    assert line.startswith("layout: SharedPromptLayout for LlamaForCausalLM: matches"), line
    assert "in float32 to 0.001 nats, and in bfloat16" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("name, autocast, weights", BF16, ids=[p[0] for p in BF16])
@pytest.mark.parametrize("model_type", FIRST_TRIED)
def test_the_first_tried_architectures_keep_their_float32_layout_in_bf16(model_type, name, autocast, weights):
    model = build_tiny(model_type).eval()
    float32 = choose_layout(AutoLayout(), [model], TokenScorer(), dropout_check=False).layout
    with running_in(model, autocast, weights):
        choice = choose_layout(AutoLayout(), [model], TokenScorer(), dropout_check=False)
    assert type(choice.layout) is type(float32), choice.line
