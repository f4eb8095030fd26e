"""The model's own output head: how its last hidden states become the logits ``model(...).logits`` returns.

The scorers run the model body, gather the hidden states of the scored positions and only then apply the head,
so that position pruning computes ``K x V`` logits instead of ``n x W x V``. Many models do more after the LM
head's linear layer than return its output: Granite divides by ``logits_scaling``, Cohere multiplies by
``logit_scale``, Falcon-H1 by ``lm_head_multiplier``, Gemma 2 and 3 soft-cap with ``tanh``, others slice a padded
vocabulary or mask tokens. Skipping that step scores a different model.

:func:`output_head` therefore **reads the transform from the model itself**: it runs the model's own
``forward`` on a few random hidden states with the body replaced by a stand-in that returns them
(:func:`model_tail_logits`; no body computation), so whatever the model's code does after its head, known
field or new one, is in the probe's answer. Then:

* where the answer equals a known element-wise transform of the linear head (:class:`Scale`, :class:`SoftCap`,
  read from the config fields TRL's and transformers' models use), the head is that linear layer and that
  transform: the chunked scorer can fuse it (:attr:`OutputHead.transform` gives the derivative its backward
  needs);
* otherwise the head *is* the model's own forward tail (:attr:`OutputHead.tail`): exact by construction, at the
  price of the chunked scorer's generic (checkpointed) path.

A model whose forward cannot be run with a stand-in body, or one sharded by FSDP (its root's parameters are
only gathered inside its own forward), gets the config-read transform unverified; the set-up conformance check
(:mod:`lit_prunedpo.conformance`) compares the scored log-probs with the model's plain forward and catches a
transform the config does not name.
"""

from __future__ import annotations

import types
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


class LogitTransform:
    """An element-wise map applied to the linear head's output, with the derivative a fused backward needs."""

    def __call__(self, logits: Tensor) -> Tensor:
        raise NotImplementedError

    def derivative(self, logits: Tensor) -> Tensor:
        """``d f(l) / d l`` at the linear head's output ``logits``."""
        raise NotImplementedError


@dataclass(frozen=True)
class Scale(LogitTransform):
    """``l * factor`` (Cohere's ``logit_scale``, Falcon-H1's ``lm_head_multiplier``, Granite's ``1 /
    logits_scaling``)."""

    factor: float

    def __call__(self, logits: Tensor) -> Tensor:
        return logits * self.factor

    def derivative(self, logits: Tensor) -> Tensor:
        return torch.full_like(logits, self.factor)


@dataclass(frozen=True)
class SoftCap(LogitTransform):
    """``cap * tanh(l / cap)`` (Gemma 2 and 3's ``final_logit_softcapping``)."""

    cap: float

    def __call__(self, logits: Tensor) -> Tensor:
        return torch.tanh(logits / self.cap) * self.cap

    def derivative(self, logits: Tensor) -> Tensor:
        return 1 - torch.tanh(logits / self.cap).square()


@dataclass(frozen=True)
class Chain(LogitTransform):
    """``second(first(l))``."""

    first: LogitTransform
    second: LogitTransform

    def __call__(self, logits: Tensor) -> Tensor:
        return self.second(self.first(logits))

    def derivative(self, logits: Tensor) -> Tensor:
        inner = self.first(logits)
        return self.second.derivative(inner) * self.first.derivative(logits)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def config_transform(model: nn.Module) -> LogitTransform | None:
    """The element-wise transform the config fields known to transformers' models describe (``None``: none), in the
    order the models apply them: scaling first, soft-capping last."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    steps: list[LogitTransform] = []
    for name, invert in (("logits_scaling", True), ("logit_scale", False), ("lm_head_multiplier", False),
                         ("output_multiplier", False), ("output_multiplier_scale", False)):
        value = _number(getattr(model, name, None) if name == "logit_scale" else None) or _number(
            getattr(text, name, None))
        if value is not None and value not in (0.0, 1.0):
            steps.append(Scale(1.0 / value if invert else value))
    for name in ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap"):
        cap = _number(getattr(text, name, None))
        if cap is not None and cap > 0:
            steps.append(SoftCap(cap))
            break
    if not steps:
        return None
    out = steps[0]
    for step in steps[1:]:
        out = Chain(out, step)
    return out


class _StandInBody(nn.Module):
    """Returns given hidden states as the body's output, whatever it is called with; the real body's other
    attributes (Falcon-H1's ``lm_head_multiplier``) read through, its submodules are the stand-in again."""

    def __init__(self, hidden: Tensor, body: nn.Module) -> None:
        super().__init__()
        self.hidden = hidden
        object.__setattr__(self, "_real", body)  # not registered: the stand-in has no parameters

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _BodyOutput(self.hidden)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_"):
                raise
            value = getattr(self._real, name)
            # a forward that calls a part of its body (OPT's ``self.model.decoder(...)``) gets the stand-in
            return self if isinstance(value, nn.Module) else value


class _BodyOutput(types.SimpleNamespace):
    """A body output with ``last_hidden_state`` (also ``[0]``) and ``None`` for anything else a forward reads."""

    def __init__(self, hidden: Tensor) -> None:
        super().__init__(last_hidden_state=hidden)

    def __getattr__(self, name: str) -> Any:
        return None

    def __getitem__(self, index: int) -> Any:
        return self.last_hidden_state if index == 0 else None

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


def body_name(model: nn.Module) -> str | None:
    """The attribute of a ``transformers`` causal LM that holds its body (``model.model``, ``model.transformer``, ...):
    its ``base_model_prefix`` where that names a child, else its only child besides the LM head (Llama 4's and
    Mllama's text models name a prefix they do not have); ``None`` when neither says."""
    prefix = getattr(model, "base_model_prefix", None)
    if prefix and isinstance(model._modules.get(prefix), nn.Module):
        return prefix
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    others = [name for name, child in model.named_children()
              if child is not head and not any(m is head for m in child.modules())]
    return others[0] if len(others) == 1 else None


def model_tail_logits(model: nn.Module, hidden: Tensor) -> Tensor:
    """``[K, V]`` logits that ``model``'s own ``forward`` computes from last hidden states ``hidden`` (``[K, d]``):
    its body is replaced by a stand-in returning them for the duration of the call, so no layer runs.

    Raises:
        whatever the model's forward raises when it needs more of its body's output than the hidden states.
    """
    prefix = body_name(model)
    body = model._modules.get(prefix) if prefix is not None else None
    if not isinstance(body, nn.Module):
        raise ValueError(f"cannot find the body of {type(model).__name__}")
    ids = torch.zeros(1, hidden.shape[0], dtype=torch.long, device=hidden.device)
    model._modules[prefix] = _StandInBody(hidden[None], body)
    try:
        out = model.forward(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        model._modules[prefix] = body
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[0]


@dataclass(frozen=True)
class OutputHead:
    """Gathered hidden states ``[K, d]`` to the model's logits ``[K, V]``.

    Attributes:
        linear: the LM head module (``model.get_output_embeddings()``).
        transform: the element-wise map after it (``None``: the linear head's output is the logits).
        tail: when set, the model whose own forward tail computes the logits (:func:`model_tail_logits`): used
            instead of ``linear`` and ``transform`` for a head this module does not know.
        how: one line saying how the head was read, for the set-up log.
    """

    linear: nn.Module
    transform: LogitTransform | None = None
    tail: nn.Module | None = None
    how: str = ""

    def __call__(self, hidden: Tensor) -> Tensor:
        if self.tail is not None:
            return model_tail_logits(self.tail, hidden)
        weight = getattr(self.linear, "weight", None)
        if weight is not None and weight.is_floating_point() and hidden.dtype != weight.dtype:
            # a body that returns float32 under 16-bit weights (Mamba's norm): its own forward casts to the head's dtype
            hidden = hidden.to(weight.dtype)
        logits = self.linear(hidden)
        return logits if self.transform is None else self.transform(logits)

    @property
    def fusable(self) -> bool:
        """Whether the logits are a known element-wise map of an ``nn.Linear`` (the chunked scorer's fused path)."""
        return self.tail is None and plain_linear(self.linear)


def plain_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` whose forward is ``F.linear(x, weight, bias)`` (a subclass may scale or normalise its weight
    in ``forward``: then the weight alone is not the head)."""
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


_HEADS: "weakref.WeakKeyDictionary[nn.Module, OutputHead]" = weakref.WeakKeyDictionary()
_PROBE_ROWS = 4


def _sharded(module: nn.Module) -> bool:
    return any(hasattr(p, "to_local") for p in module.parameters(recurse=False)) or any(
        hasattr(p, "to_local") for p in module.parameters()
    )


def output_head(model: nn.Module, linear: nn.Module) -> OutputHead:
    """The output head of ``model`` (a ``transformers`` causal LM whose LM head module is ``linear``), read once and
    remembered for the model's lifetime (see the module docstring)."""
    head = _HEADS.get(model)
    if head is None or head.linear is not linear:
        head = _read_head(model, linear)
        _HEADS[model] = head
    return head


@torch.no_grad()
def _read_head(model: nn.Module, linear: nn.Module) -> OutputHead:
    known = config_transform(model)
    weight = getattr(linear, "weight", None)
    if weight is None or _sharded(model) or getattr(weight, "is_meta", False):
        return OutputHead(linear, known, how="from the config (not probed: sharded or weightless head)")
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(_PROBE_ROWS, weight.shape[1], generator=generator).to(weight.device, weight.dtype)
    # logits of about +-50, where any soft-cap (Gemma's 30, NanoChat's 15) and any scale is far from the identity
    # (a random model's own hidden states give logits of a few hundredths, where tanh is the identity)
    span = float(linear(hidden).float().abs().max())
    hidden = hidden * (50.0 / span if 0 < span < float("inf") else 1.0)
    try:
        own = model_tail_logits(model, hidden).float()
    except Exception as err:  # the forward needs more than hidden states from its body: fall back to the config
        return OutputHead(linear, known, how=f"from the config (the model's forward tail could not be probed: "
                                             f"{type(err).__name__})")
    plain = linear(hidden)
    if not bool(torch.isfinite(own).all() and torch.isfinite(plain).all()):  # weights of a diverged run
        return OutputHead(linear, known, how="from the config (the head's logits are not finite on the probe)")
    tolerance = 1e-5 if weight.dtype in (torch.float32, torch.float64) else 2e-2
    scale = float(own.abs().max()) if own.numel() else 1.0
    for candidate in (None, known):
        logits = (plain if candidate is None else candidate(plain)).float()
        if logits.shape == own.shape and torch.allclose(logits, own, rtol=tolerance, atol=tolerance * scale):
            return OutputHead(linear, candidate,
                              how="linear head" if candidate is None else f"linear head, then {candidate}")
    return OutputHead(linear, None, tail=model, how="the model's own forward tail (its logits are not a known "
                                                    "transform of the linear head)")
