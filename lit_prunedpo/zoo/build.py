"""Building a tiny model of a type and checking it: :func:`build_tiny`, and :func:`zoo`, every type sorted into
buildable and :class:`~lit_prunedpo.zoo.catalogue.Unbuildable`.

A type is buildable when its model builds on CPU in float32 and, in eval mode, a forward of :data:`CHECK_SHAPE`
random tokens returns finite logits ``[2, 20, V]`` (``V >= vocab_size``), the same on a second forward, with the
first 15 positions unchanged when the last 5 tokens change (causal) (:func:`_check`).
"""

from __future__ import annotations

import copy
import functools
import re

import torch

from lit_prunedpo.zoo.catalogue import (
    Unbuildable, UnbuildableError, causal_lm_class_name, causal_lm_types, exception_reason, quiet, static_reason,
)
from lit_prunedpo.zoo.shrink import tiny_config

#: Shape of the build check's forward: ``(batch, length)``; longer than the sliding window.
CHECK_SHAPE = (2, 20)

#: A shrunk model with more parameters than this is "not tiny" (checked on the meta device before building).
MAX_PARAMETERS = 2_000_000


def _check(model: torch.nn.Module, model_type: str, vocab_size: int) -> None:
    """Eval-mode forwards of random tokens: finite logits ``[B, T, V >= vocab_size]``, the same twice, and the first
    positions unchanged when the last ones change (causal). Raises :class:`UnbuildableError`; restores the mode."""
    batch, length = CHECK_SHAPE
    cut = length - 5
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (batch, length), generator=g)
    changed = ids.clone()
    changed[:, cut:] = (ids[:, cut:] + torch.randint(1, vocab_size, (batch, length - cut), generator=g)) % vocab_size
    mask = torch.ones_like(ids)

    def fail(reason: str) -> UnbuildableError:
        return UnbuildableError(Unbuildable(model_type, reason))

    training = model.training
    model.eval()  # dropout off: the checks compare forwards
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
            again = model(input_ids=ids, attention_mask=mask).logits
            later = model(input_ids=changed, attention_mask=mask).logits
    except Exception as err:  # noqa: BLE001 - reported as the reason
        raise fail(exception_reason("the forward", err)) from err
    finally:
        model.train(training)
    shape = None if logits is None else list(logits.shape)
    if shape is None or len(shape) != 3 or shape[:2] != [batch, length] or shape[2] < vocab_size:
        raise fail(f"logits of shape {shape}, not [{batch}, {length}, >={vocab_size}]")
    if not torch.isfinite(logits).all():
        raise fail("non-finite logits")
    if not torch.equal(logits, again):
        raise fail("nondeterministic: two eval-mode forwards of the same tokens differ")
    if not torch.allclose(logits[:, :cut], later[:, :cut], rtol=1e-4, atol=1e-5):
        raise fail("not causal: logits at a position depend on later tokens")


def _meta_model(config, attn_implementation: str | None) -> torch.nn.Module | None:
    """``config``'s model built on the meta device (no memory, no init); ``None`` where that fails."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=attn_implementation,
                                                    dtype=torch.float32)
    except Exception:  # noqa: BLE001 - the real build reports it
        return None


#: Parameter names of cross-attention to an encoder's states (a decoder half: TrOCR's, BERT's with cross-attention).
_ENCODER_ATTENTION = re.compile(r"(^|\.)(encoder_attn|crossattention)\.")


def build_tiny(model_type: str, *, attn_implementation: str | None = None, sliding_window: int = 8,
               vocab_size: int = 128,
               seed: int = 0, perturb: float = 0.02) -> torch.nn.Module:
    """A tiny float32 ``AutoModelForCausalLM`` of ``model_type`` (:func:`tiny_config`), its random weights seeded by
    ``seed`` without touching the global RNG, checked with forwards (see the module docstring). The model is
    returned in the mode ``from_config`` leaves it (training).

    ``perturb``: Gaussian noise of this scale added to every weight after the initialisation, so that what an
    initialisation leaves at zero or near it (RecurrentGemma's recurrence, zero-initialised output projections) is
    not silent: a layout that leaks padding into a recurrent state is then seen to.

    Raises :class:`UnbuildableError` when the type is not decoder-only text or cannot be built or run tiny.
    """
    from transformers import AutoModelForCausalLM

    def unbuildable(reason: str) -> UnbuildableError:
        return UnbuildableError(Unbuildable(model_type, reason))

    if (reason := static_reason(model_type)) is not None:
        raise unbuildable(reason)
    try:
        config = tiny_config(model_type, sliding_window=sliding_window, vocab_size=vocab_size)
    except Exception as err:  # noqa: BLE001 - reported as the reason
        raise unbuildable(exception_reason("the tiny config", err)) from err
    with torch.random.fork_rng(devices=[]), quiet():
        # the structure first (eager builds where the requested attention is missing): size, cross-attention
        if (meta := _meta_model(config, attn_implementation) or _meta_model(config, "eager")) is not None:
            if (size := sum(p.numel() for p in meta.parameters())) > MAX_PARAMETERS:
                raise unbuildable(f"not tiny: {size:,} parameters after shrinking")
            if any(_ENCODER_ATTENTION.search(name) for name, _ in meta.named_parameters()):
                raise unbuildable(f"encoder-decoder: {causal_lm_class_name(model_type)} is a decoder with "
                                  "cross-attention to an encoder's states")
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                     dtype=torch.float32)
        except Exception as err:  # noqa: BLE001 - reported as the reason
            if "does not support an attention implementation" in str(err):  # eager-only classes, for one
                raise unbuildable(f"{causal_lm_class_name(model_type)} does not support "
                                  f"attn_implementation={attn_implementation!r}") from err
            raise unbuildable(exception_reason("the model", err)) from err
        if bad := sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32}):
            raise unbuildable(f"parameters in {', '.join(bad)}, not float32")
        if perturb:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(torch.randn_like(parameter) * perturb)
        _check(model, model_type, vocab_size)
    return model


@functools.lru_cache(maxsize=None)
def zoo(attn_implementation: str | None = None) -> tuple[list[str], list[Unbuildable]]:
    """``(buildable model types, the others with reasons)`` for ``attn_implementation``, both sorted by type.

    Builds every type once (about 5-10 s on 2 CPU cores, after imports); the answer is cached per
    ``attn_implementation``: do not mutate it.
    """
    ok: list[str] = []
    out: list[Unbuildable] = []
    for model_type in causal_lm_types():
        try:
            build_tiny(model_type, attn_implementation=attn_implementation)
        except UnbuildableError as err:
            out.append(err.unbuildable)
        else:
            ok.append(model_type)
    return ok, out
