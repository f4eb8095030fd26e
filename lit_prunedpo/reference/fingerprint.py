"""What a reference cache was computed from, and how two such descriptions differ.

A cache's fingerprint is a JSON dict: ``data`` (the data's own
:meth:`~lit_prunedpo.reference.ReferenceData.cache_fingerprint`), ``reference`` (:func:`reference_identity`:
where the model comes from and a BLAKE2 hash of its weights), ``scorer``, ``precision`` and the format
``version``. Hashing weights reads every parameter once (about 1 s per GB). :func:`fingerprint_diff` names the
fields that differ, so a stale cache is refused with a reason.

A cache may be named by its fingerprint (:func:`cache_file_name`): ``{fingerprint}`` in a path template is
:func:`fingerprint_digest`, 12 hex digits of a BLAKE2b of the whole fingerprint, and ``{model}`` is
:func:`model_slug`, the model's name made safe for a file name; so another model, data set, tokenizer, length or
precision gets another file, and the same settings find the same one again.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
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


#: The placeholders a cache path template may hold: the model's name and the fingerprint's digest.
PLACEHOLDERS = ("model", "fingerprint")


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """12 hex digits (48 bits) of a BLAKE2b of the fingerprint's JSON (keys sorted): what names a derived cache file.
    Two fingerprints that collide are still told apart by the full fingerprint the file holds."""
    text = json.dumps(jsonable(fingerprint), sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def model_slug(model: nn.Module) -> str:
    """A short name of ``model`` for a file name: the last part of its ``name_or_path`` (a hub name or folder), else
    its ``config.model_type``, else its class; characters other than letters, digits, ``.``, ``_`` and ``-`` become
    ``-``, at most 40 of them."""
    config = getattr(model, "config", None)
    name = str(getattr(model, "name_or_path", "") or getattr(config, "_name_or_path", "") or "")
    name = name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    name = name or str(getattr(config, "model_type", "") or "") or type(model).__name__
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:40].strip("-.")
    return slug or "model"


def template_fields(template: str) -> set[str]:
    """The placeholders a path template names (``{model}``, ``{fingerprint}``); empty for a plain path.

    Raises:
        ValueError: a malformed template, an unknown placeholder, or placeholders without ``{fingerprint}`` (the name
            would not change with the settings).
    """
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as err:
        raise ValueError(f"CachedReference: path {template!r} is not a valid template ({err}); the placeholders are "
                         "{model} and {fingerprint}, e.g. runs/cache/ref-{model}-{fingerprint}.safetensors") from None
    unknown = sorted(fields - set(PLACEHOLDERS))
    if unknown:
        raise ValueError(f"CachedReference: path {template!r} names {{{unknown[0]}}}; the placeholders are {{model}} "
                         "and {fingerprint}, e.g. runs/cache/ref-{model}-{fingerprint}.safetensors")
    if fields and "fingerprint" not in fields:
        raise ValueError(f"CachedReference: path {template!r} has no {{fingerprint}}: every run would name the same "
                         "file; add it, e.g. runs/cache/ref-{model}-{fingerprint}.safetensors")
    return fields


def cache_file_name(template: str, fingerprint: Mapping[str, Any], model: nn.Module) -> str:
    """``template`` with ``{model}`` and ``{fingerprint}`` filled in
    (:func:`model_slug`, :func:`fingerprint_digest`)."""
    template_fields(template)
    return template.format(model=model_slug(model), fingerprint=fingerprint_digest(fingerprint))


_ABSENT = object()


def fingerprint_diff(cached: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "",
                     labels: tuple[str, str] = ("cache", "now")) -> list[str]:
    """The dotted fields whose values differ, each as ``field (cache: X, now: Y)`` (``labels`` name the two sides);
    a sub-dict present on one side only is one field."""

    def show(v: Any) -> str:
        if v is _ABSENT:
            return "<absent>"
        text = json.dumps(v, sort_keys=True)
        return text if len(text) <= 80 else text[:77] + "..."

    out = []
    for key in sorted(set(cached) | set(current)):
        a, b = cached.get(key, _ABSENT), current.get(key, _ABSENT)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(fingerprint_diff(a, b, f"{prefix}{key}.", labels))
        elif a != b:
            out.append(f"{prefix}{key} ({labels[0]}: {show(a)}, {labels[1]}: {show(b)})")
    return out
