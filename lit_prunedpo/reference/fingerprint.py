"""What a reference cache was computed from, and how two such descriptions differ.

A cache's fingerprint is a JSON dict: ``data`` (the data's own
:meth:`~lit_prunedpo.reference.ReferenceData.cache_fingerprint`), ``reference`` (:func:`reference_identity`:
where the model comes from and a BLAKE2 hash of its weights), ``scorer``, ``precision`` and the format
``version``. Hashing weights reads every parameter once (about 1 s per GB). :func:`fingerprint_diff` names the
fields that differ, so a stale cache is refused with a reason.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import torch
from torch import nn

from lit_prunedpo.models import ModelSource


def weights_hash(model: nn.Module) -> str:
    """BLAKE2b of every state-dict tensor's name, dtype, shape and bytes (the weights' identity)."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def jsonable(value: Any) -> Any:
    """``value`` made JSON-able: containers recursively, anything else by ``str``."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def reference_identity(source: ModelSource | None, model: nn.Module) -> dict[str, Any]:
    """The reference part of a fingerprint: where the model comes from and its weights' hash."""
    if source is None:
        origin: dict[str, Any] = {"source": "policy initial weights", "class": type(model).__name__}
    else:
        origin = {"source": f"{type(source).__module__}.{type(source).__qualname__}", "args": jsonable(vars(source))}
    return {**origin, "weights": weights_hash(model)}


_ABSENT = object()


def fingerprint_diff(cached: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted fields whose values differ, each as ``field (cache: X, now: Y)``; a sub-dict present on
    one side only is one field."""

    def show(v: Any) -> str:
        if v is _ABSENT:
            return "<absent>"
        text = json.dumps(v, sort_keys=True)
        return text if len(text) <= 80 else text[:77] + "..."

    out = []
    for key in sorted(set(cached) | set(current)):
        a, b = cached.get(key, _ABSENT), current.get(key, _ABSENT)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(fingerprint_diff(a, b, f"{prefix}{key}."))
        elif a != b:
            out.append(f"{prefix}{key} (cache: {show(a)}, now: {show(b)})")
    return out
