"""LoRA through ``peft``: a policy source that wraps any other source with adapters, and the helpers that let
the rest of the package treat the base model as the reference.

With a LoRA policy the reference is the policy with its adapters switched off (what TRL, OpenRLHF and
torchtune do): ``OnlineReference`` with no model of its own scores ``policy`` under
:func:`adapters_off` instead of copying it, so the weights exist once. The reference holds the policy outside
its module tree (no duplicate parameters in ``state_dict``, the optimizer or FSDP). The cached reference
computes its log-probs under :func:`adapters_off` too.

Only the adapters train (peft freezes the base), so only they reach the optimizer; ``PrunedDPO`` leaves the
frozen base weights out of single-file checkpoints (:func:`drop_frozen`) and puts them back from the freshly
built base on resume (:func:`restore_frozen`). Under FSDP2 the sharded checkpoint keeps them: Lightning's
sharded loader asks the files for every key of the model.

Requires the ``lora`` extra: ``pip install "lit-prunedpo[lora]"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Mapping

from torch import Tensor, nn

from lit_prunedpo.models import ModelSource

__all__ = ["LoRA", "adapters_off", "drop_frozen", "is_peft_model", "load_adapter_state", "restore_frozen"]


def _peft() -> Any:
    try:
        import peft
    except ImportError as err:  # pragma: no cover - the test extra installs peft
        raise ImportError("LoRA needs peft: pip install 'lit-prunedpo[lora]'") from err
    return peft


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (without importing peft when it is not installed)."""
    return any(cls.__name__ == "PeftModel" and cls.__module__.startswith("peft") for cls in type(model).__mro__)


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` as its base model: peft's ``disable_adapter()`` for a peft model, nothing otherwise.

    The model is also put in eval mode for the duration (the reference never uses dropout), then restored.
    """
    if not is_peft_model(model):
        yield model
        return
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with model.disable_adapter():
            yield model
    finally:
        for module, mode in modes.items():
            module.training = mode


class LoRA(ModelSource):
    """A policy with LoRA adapters (``peft.LoraConfig``) on a base model from any other source.

    Args:
        base: where the base model comes from (``Pretrained`` for a real model, ``FromConfig`` in tests).
        r: adapter rank.
        alpha: scaling numerator (``lora_alpha``; the update is scaled by ``alpha / r``).
        dropout: dropout on the adapter input (``lora_dropout``); note ``PrunedDPO(disable_dropout=True)``, the
            default, sets every dropout of the policy to 0, this one included.
        target_modules: module names (or ``all-linear``) that get adapters; ``None``: peft's default for the
            model type (the attention projections for Llama).
        options: any other ``peft.LoraConfig`` field, e.g. ``{use_rslora: true, modules_to_save: [lm_head]}``.

    Raises:
        ValueError: on a non-positive ``r`` or ``alpha`` or a ``dropout`` outside [0, 1).
    """

    def __init__(
        self,
        base: ModelSource,
        r: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: list[str] | str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if not (isinstance(r, int) and r >= 1):
            raise ValueError(f"LoRA: r must be an int >= 1, got {r!r}")
        if not alpha > 0:
            raise ValueError(f"LoRA: alpha must be > 0, got {alpha!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"LoRA: dropout must be in [0, 1), got {dropout!r}")
        self.base = base
        self.r, self.alpha, self.dropout = r, float(alpha), float(dropout)
        self.target_modules = target_modules
        self.options = dict(options or {})

    def lora_config(self) -> Any:
        peft = _peft()
        known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
        unknown = sorted(set(self.options) - known)
        if unknown:
            raise ValueError(f"LoRA: options {unknown} are not peft.LoraConfig fields")
        return peft.LoraConfig(
            task_type="CAUSAL_LM", r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=self.target_modules, **self.options,
        )

    def build(self) -> nn.Module:
        return _peft().get_peft_model(self.base.build(), self.lora_config())

    def base_spec(self) -> dict[str, Any] | None:
        """The base source's spec (see :meth:`ModelSource.spec`): an export rebuilds the frozen base from it."""
        return self.base.spec()


def load_adapter_state(base: nn.Module, peft_config: Mapping[str, Any], state: Mapping[str, Tensor], where: str) -> nn.Module:
    """``base`` wrapped with the adapters described by ``peft_config`` (a ``LoraConfig.to_dict()``), loaded from
    ``state`` (keys as in the policy's ``state_dict``). Every trainable key must be in ``state``; keys it lacks
    may only be frozen base weights (which ``base`` already holds).

    Raises:
        ValueError: naming ``where`` when adapter weights are missing or ``state`` has keys the model lacks.
    """
    peft = _peft()
    known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    config = peft.LoraConfig(**{k: v for k, v in peft_config.items() if k in known})
    model = peft.get_peft_model(base, config)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    result = model.load_state_dict(dict(state), strict=False)
    missing = sorted(set(result.missing_keys) & trainable)
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{where}: the LoRA state does not match the model: missing adapter weights {missing[:4]}, "
            f"unexpected keys {list(result.unexpected_keys)[:4]}"
        )
    return model


def frozen_keys(module: nn.Module, prefix: str) -> set[str]:
    """``state_dict`` keys of ``module``'s frozen parameters and buffers, with ``prefix`` in front."""
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    return {prefix + k for k in module.state_dict() if k not in trainable}


def drop_frozen(state_dict: dict[str, Any], policy: nn.Module, prefix: str = "policy.") -> list[str]:
    """Remove the frozen base weights of a peft ``policy`` from a module ``state_dict``; returns the keys removed."""
    keys = sorted(frozen_keys(policy, prefix) & set(state_dict))
    for key in keys:
        del state_dict[key]
    return keys


def restore_frozen(state_dict: dict[str, Any], policy: nn.Module, prefix: str = "policy.") -> list[str]:
    """Put back the frozen base weights :func:`drop_frozen` removed, from ``policy`` as built (the base source's
    weights); returns the keys put back."""
    current = policy.state_dict()
    missing = sorted(k for k in frozen_keys(policy, prefix) if k not in state_dict)
    for key in missing:
        state_dict[key] = current[key[len(prefix):]]
    return missing
