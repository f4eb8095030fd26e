"""What a model's attention takes, and what packed blocks cannot run: the model knowledge of the packed layout.

* :func:`model_attention_mask`: the packed layout's boolean ``[S, 1, W, C + W]`` mask in the form a model's
  attention takes (boolean for ``sdpa``, additive for ``eager``), with each layer kind's sliding window cut from it
  (:class:`AttentionForm`: one tensor for a model with one layer kind, a dict keyed by kind, as
  ``config.layer_types`` names them, otherwise);
* :func:`packed_refusal`: why a model cannot run packed blocks exactly (an attention that takes no custom mask,
  recurrent, linear, convolutional or chunked layers, ALiBi, positions that ignore ``position_ids``), so that
  :meth:`~lit_prunedpo.layout.packed.SharedPromptLayout.check_model` can refuse it naming the feature. What no rule
  here knows, the conformance check (:mod:`lit_prunedpo.conformance`) finds against the model's plain forward.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lit_prunedpo.head import body_name

SUPPORTED_ATTENTION = ("sdpa", "eager")


def attention_implementation(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)


def check_attention(model: nn.Module) -> None:
    """Refuse a model whose attention cannot take the shared-prompt layout's 4-D mask.

    Raises:
        ValueError: naming the model, its attention implementation and the two ways out.
    """
    impl = attention_implementation(model)
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"shared-prompt execution needs a custom 4-D attention mask, which {type(model).__name__} with "
            f"attn_implementation={impl!r} cannot take (supported: {', '.join(SUPPORTED_ATTENTION)}); "
            "use another layout (model.layout: lit_prunedpo.layout.LeftPaddedLayout), or build the model with "
            "attn_implementation='sdpa'"
        )


#: Layer kinds (``config.layer_types``) the packed mask can express, with the window each one reads.
ATTENTION_KINDS = ("full_attention", "sliding_attention")


def _text_config(model: nn.Module) -> object:
    config = getattr(model, "config", None)
    return getattr(config, "text_config", None) or config


@dataclass(frozen=True)
class AttentionForm:
    """How a model's layers read a 4-D mask: the window of each layer kind (``None``: full causal attention).

    ``windows`` has one entry per kind present; with more than one, the mask goes in as a dict keyed by kind (what
    ``transformers`` models with ``config.layer_types`` take); with one, as a single tensor.
    """

    windows: dict[str, int | None]

    @classmethod
    def of(cls, model: nn.Module) -> "AttentionForm":
        config = _text_config(model)
        window = getattr(config, "sliding_window", None)
        window = int(window) if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
        kinds = getattr(config, "layer_types", None)
        if kinds:
            return cls({kind: window if kind == "sliding_attention" else None for kind in dict.fromkeys(kinds)})
        if getattr(config, "use_sliding_window", True) is False:
            window = None
        return cls({"full_attention": window})


def packed_refusal(model: nn.Module) -> str | None:
    """Why ``model`` cannot run packed blocks exactly (``None``: nothing known against it; the conformance check
    still compares it with the model's plain forward).

    A packed sequence holds a pair's two branches one after the other: exact only where every token mixes
    with others through attention under the 4-D mask. Refused: an attention that takes no custom mask, layers of a
    kind other than (sliding-window) attention (recurrent, linear-attention, convolutional, chunked), any
    ``Conv1d`` (a causal convolution runs across the segments), and ALiBi biases (they grow with the distance in
    the packed sequence, not in the branch).
    """
    impl = attention_implementation(model)
    if impl not in SUPPORTED_ATTENTION:
        return (f"attention implementation {impl!r} takes no custom 4-D mask (supported: "
                f"{', '.join(SUPPORTED_ATTENTION)})")
    config = _text_config(model)
    other = [k for k in dict.fromkeys(getattr(config, "layer_types", None) or ()) if k not in ATTENTION_KINDS]
    if other:
        return (f"layers of kind {', '.join(map(repr, other))} (config.layer_types): recurrent, linear or chunked "
                "token mixing that a mask cannot confine to a branch")
    convs = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.Conv1d)})
    if convs:
        mixers = sorted({type(m).__name__ for m in model.modules() if any(isinstance(c, nn.Conv1d)
                                                                          for c in m.children())})
        return f"recurrent or convolutional token mixing ({', '.join(mixers or convs)}): it runs across packed segments"
    if _uses_alibi(model, config):
        return "ALiBi position biases: they follow the distance in the packed sequence, not in the branch"
    if _ignores_position_ids(model):
        return ("its positions do not follow position_ids (they come from the token's column): a branch placed "
                "after the other would see the wrong positions")
    return None


@torch.no_grad()
def _ignores_position_ids(model: nn.Module) -> bool:
    """Whether ``model``'s output is unchanged when the position ids of a short sequence skip ahead (RoFormer's
    sinusoidal positions, for one, are computed from the column): the packed layout relies on them."""
    name = body_name(model)
    body = getattr(model, name, None) if name is not None else None
    if not isinstance(body, nn.Module):
        return False
    parameter = next(model.parameters(), None)
    if parameter is None:
        return False
    device = parameter.device
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.arange(1, 7, device=device)[None] % vocab
    gap = torch.tensor([[0, 1, 2, 9, 10, 11]], device=device)
    modes = {m: m.training for m in body.modules()}
    body.eval()
    try:
        outs = [body(input_ids=ids, position_ids=p, use_cache=False).last_hidden_state
                for p in (torch.arange(6, device=device)[None], gap)]
    except Exception:  # a body that takes no position_ids at all ignores them
        return True
    finally:
        for m, mode in modes.items():
            m.training = mode
    return bool(torch.equal(outs[0], outs[1]))


def _uses_alibi(model: nn.Module, config: object) -> bool:
    for owner in (config, getattr(config, "attn_config", None)):
        value = getattr(owner, "alibi", None) if not isinstance(owner, dict) else owner.get("alibi")
        if value is not None:
            return bool(value)
    source = sys.modules.get(type(model).__module__)
    try:
        return source is not None and "alibi" in inspect.getsource(source).lower()
    except (OSError, TypeError):
        return False


def model_attention_mask(body: nn.Module, mask: Tensor, key_positions: Tensor | None = None,
                         query_positions: Tensor | None = None) -> Tensor | dict[str, Tensor]:
    """The boolean ``[S, 1, W, C + W]`` mask in the form ``body``'s attention adds or selects with: each layer kind's
    sliding window cut from it (by ``key_positions`` ``[S, C + W]`` and ``query_positions`` ``[S, W]``), additive for
    ``eager`` attention, one tensor for a model with one layer kind, a dict keyed by kind otherwise."""
    check_attention(body)
    form = AttentionForm.of(body)
    eager = attention_implementation(body) != "sdpa"
    dtype = body.get_input_embeddings().weight.dtype
    if torch.is_autocast_enabled(mask.device.type):
        dtype = torch.get_autocast_dtype(mask.device.type)

    def shaped(window: int | None) -> Tensor:
        out = mask
        if window is not None and key_positions is not None and query_positions is not None:
            # transformers' sliding window: a query at position q reads keys at positions k > q - window
            out = mask & (key_positions[:, None, None, :] > query_positions[:, None, :, None] - window)
        if not eager:
            return out
        return torch.zeros(out.shape, dtype=dtype, device=out.device).masked_fill_(~out, torch.finfo(dtype).min)

    masks = {kind: shaped(window) for kind, window in form.windows.items()}
    return next(iter(masks.values())) if len(masks) == 1 else masks
