"""Turn off every training-time noise source of a policy, as TRL's ``disable_dropout`` intends.

DPO compares the policy's log-probs with the reference's; the reference runs in eval mode, so any noise the
policy's forward adds in training mode (dropout, router jitter) makes the two disagree even at identical weights,
and makes the gradient noisy. TRL sets the ``p`` of every ``nn.Dropout`` to 0; many models apply dropout
without an ``nn.Dropout`` module, reading a probability their attention or decoder layer copied from the config
(OPT's ``dropout``, GPT-BigCode's ``attn_pdrop``, Seed-OSS's ``residual_dropout``), or jitter their MoE router's
input (Mixtral's and PhiMoE's ``router_jitter_noise``, ``input_jitter_noise``). :func:`turn_off_dropout`
zeroes all three kinds:

* ``p`` of every ``nn.Dropout`` (and its subclasses);
* every float attribute of a module whose name says dropout or jitter (``dropout``, ``attention_dropout``,
  ``attn_pdrop``, ``jitter_noise``, ...);
* the same fields of the model's config and its sub-configs, which some layers read at every forward;
* and what no field controls: code that samples whenever its module is in training mode (PhiMoE's router draws
  its experts by Gumbel sampling in training). :func:`dropout_free_training` keeps every module in eval mode
  except the decoder layers and their ancestors, which ``transformers`` needs in training mode for gradient
  checkpointing (their own functional dropout is zeroed above). The gradient is then the exact gradient of the
  function the reference and validation compute.

What it does not know by name, the set-up conformance check (:mod:`lit_prunedpo.conformance`) finds: it
compares the policy's training-mode log-probs with the model's plain eval-mode forward.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

#: Names of module attributes and config fields that hold a training-time noise level.
NOISE_NAME = re.compile(r"(dropout|pdrop|drop_prob|drop_rate|layerdrop|^jitter_noise$|^input_jitter_noise$)",
                        re.IGNORECASE)
# Not matched on purpose: PhiMoE's ``router_jitter_noise`` is a routing threshold in eval mode too.


def _zero_fields(owner: Any, where: str, changed: list[str]) -> None:
    for name, value in list(vars(owner).items()):
        if isinstance(value, float) and not isinstance(value, bool) and value != 0.0 and NOISE_NAME.search(name):
            setattr(owner, name, 0.0)
            changed.append(f"{where}.{name}={value:g}")


def _configs(config: Any, seen: set[int]) -> list[tuple[str, Any]]:
    """The config and every sub-config it holds (a multimodal model's ``text_config``, ...)."""
    if config is None or id(config) in seen or not hasattr(config, "to_dict"):
        return []
    seen.add(id(config))
    out = [("", config)]
    for name, value in list(vars(config).items()):
        for sub, nested in _configs(value, seen):
            out.append((f".{name}{sub}", nested))
    return out


def turn_off_dropout(model: nn.Module) -> list[str]:
    """Zero every dropout probability and router jitter of ``model`` (in place); returns what was changed, e.g.
    ``["model.layers.0.self_attn.attention_dropout=0.1", "config.attention_dropout=0.1"]``."""
    changed: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Dropout) and module.p != 0.0:
            changed.append(f"{name or 'model'}.p={module.p:g}")
            module.p = 0.0
        _zero_fields(module, name or "model", changed)
    for where, config in _configs(getattr(model, "config", None), set()):
        _zero_fields(config, f"config{where}", changed)
    return changed


def _checkpointing_layer(module: nn.Module) -> bool:
    """A module whose ``training`` flag switches gradient checkpointing (transformers' decoder layers)."""
    return "gradient_checkpointing" in vars(type(module)) or "gradient_checkpointing" in vars(module) or any(
        "gradient_checkpointing" in vars(cls) for cls in type(module).__mro__[1:]
        if cls.__module__.startswith("transformers")
    )


def training_switches(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules noise-free training keeps in training mode: the root, the decoder layers that switch gradient
    checkpointing, and their ancestors (named as in ``named_modules``)."""
    keep: dict[str, nn.Module] = {"": model}
    for name, module in model.named_modules():
        if name and _checkpointing_layer(module):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                keep[prefix] = model.get_submodule(prefix)
    return list(keep.items())


def dropout_free_training(model: nn.Module) -> int:
    """Put every module of ``model`` in eval mode except its :func:`training_switches` (call it after each
    ``train()``); returns how many modules stay in training mode."""
    keep = {id(module) for _, module in training_switches(model)}
    for module in model.modules():
        if id(module) not in keep:
            module.training = False
    return len(keep)
