"""Shrinking a config: ``model_type``'s default config with every size field set small (:func:`tiny_config`).

The steps, in order (their values are in :mod:`lit_prunedpo.zoo.shrink_values`): the generic sizes, vocabulary and
context lengths; sliding windows switched on; no-op head transforms and multipliers made to bite; special token ids
wrapped into the small vocabulary; multi-head latent attention made consistent; the causal mode of a bidirectional
stack; then :data:`~lit_prunedpo.zoo.shrink_values.OVERRIDES`. Per-layer lists keep one layer of each kind the
default has (:func:`_layer_lists`), and text sub-configs are shrunk the same way (:func:`_shrunk_tree`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lit_prunedpo.zoo.catalogue import config_class, quiet
from lit_prunedpo.zoo.shrink_values import (
    AT_MOST, CAUSAL_MODES, CONTEXTS, HEAD_TRANSFORMS, LAYER_LISTS, MEDIA_SUB_CONFIGS, MULTIPLIER, OVERRIDES, SIZES,
    SIZES_IF_SET, TOP_K, VOCABS, VOCABS_IF_SET, WINDOW_SWITCHES, WINDOWS,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

#: ``name -> the config field that holds it, or None`` (:func:`_field_namer`)
FieldOf = Callable[[str], "str | None"]


def _distinct(values) -> list:
    out: list = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _field_namer(cls: type):
    """``name -> the dataclass field of cls that holds it`` (or ``None``), through the ``attribute_map`` both ways:
    GPT-2's field ``n_embd`` holds ``hidden_size``; Qwen3-MoE's field ``num_experts`` is stored as
    ``num_local_experts``. Config kwargs are passed under field names, so the class's own ``__post_init__`` sees
    them."""
    fields = {f.name for f in dataclasses.fields(cls)}
    alias = dict(getattr(cls, "attribute_map", {}) or {})
    back = {target: name for name, target in alias.items() if name in fields}

    def field_of(name: str) -> str | None:
        for candidate in (name, alias.get(name), back.get(name)):
            if candidate in fields:
                return candidate
        return None

    return field_of


@functools.lru_cache(maxsize=None)
def _modeling_source(config_module: str) -> str:
    """The source of the modeling files beside a config's module (``transformers.models.mpt.configuration_mpt``)."""
    spec = importlib.util.find_spec(config_module)
    if spec is None or spec.origin is None:
        return ""
    return "\n".join(p.read_text() for p in sorted(Path(spec.origin).parent.glob("modeling_*.py")))


def _modeling_reads(cls: type, field: str) -> bool:
    """Whether ``cls``'s modeling code mentions ``field`` (MPT's config has a ``logit_scale`` its model ignores)."""
    return field in _modeling_source(cls.__module__)


def _shrink_kwargs(cls: type, default, *, vocab_size: int, sliding_window: int) -> dict[str, Any]:
    """The generic kwargs that shrink ``cls``'s ``default`` config (no per-architecture overrides). A step sets
    only the fields no earlier step set, but for the last two, which correct what the earlier ones set."""
    fields = {f.name for f in dataclasses.fields(cls)}
    field_of = _field_namer(cls)
    kwargs: dict[str, Any] = {}
    _put_sizes(kwargs, field_of, default, vocab_size, sliding_window)
    _put_head_transforms(kwargs, cls, fields, field_of, default)
    _wrap_special_tokens(kwargs, fields, default, vocab_size)
    if field_of("kv_lora_rank") is not None:  # multi-head latent attention: per-head keys, rotary on a slice
        if (f := field_of("num_key_value_heads")) is not None:
            kwargs[f] = kwargs.get(field_of("num_attention_heads"), 4)
        f = field_of("head_dim")
        if f is not None and getattr(default, f, None) == getattr(default, "qk_rope_head_dim", 0):
            kwargs[f] = SIZES["qk_rope_head_dim"]  # LongCat: the rotary embedding's width
    if not getattr(default, "is_encoder_decoder", False):  # the causal mode of a stack that has another
        for name, value in CAUSAL_MODES.items():
            if name in fields:
                kwargs[name] = value
    return kwargs


def _put(kwargs: dict[str, Any], field_of: FieldOf, name: str, value: Any) -> None:
    """Set the field that holds ``name`` to ``value``, unless the class has none or an earlier step set it."""
    if (f := field_of(name)) is not None and f not in kwargs:
        kwargs[f] = value


def _put_sizes(kwargs: dict[str, Any], field_of: FieldOf, default, vocab_size: int, sliding_window: int) -> None:
    """Sizes, expert counts and top-k, vocabulary and context lengths, and sliding windows switched on."""
    for name, value in SIZES.items():
        _put(kwargs, field_of, name, value)
    for name, value in SIZES_IF_SET.items():
        if (f := field_of(name)) is not None and getattr(default, f, None) is not None:
            _put(kwargs, field_of, name, value)
    for name, cap in AT_MOST.items():
        if (f := field_of(name)) is None:
            continue
        old = getattr(default, f, None)
        if (isinstance(old, int) and old > cap) or (old is None and name in TOP_K):
            _put(kwargs, field_of, name, cap)
    for name in VOCABS:
        _put(kwargs, field_of, name, vocab_size)
    for name in VOCABS_IF_SET:
        if (f := field_of(name)) is not None and getattr(default, f, None) is not None:
            _put(kwargs, field_of, name, vocab_size)
    for name in CONTEXTS:
        _put(kwargs, field_of, name, 256)
    for name, factor in WINDOWS.items():
        _put(kwargs, field_of, name, factor * sliding_window)
    for name, value in WINDOW_SWITCHES.items():
        _put(kwargs, field_of, name, value)


def _put_head_transforms(kwargs: dict[str, Any], cls: type, fields: set[str], field_of: FieldOf, default) -> None:
    """Output-head transforms and body multipliers whose default is a no-op, where the modeling code reads them,
    set to values that change the log-probs."""
    for name, value in HEAD_TRANSFORMS.items():
        f = field_of(name)
        if f is not None and getattr(default, f, None) in (None, 0, 0.0, 1, 1.0) and _modeling_reads(cls, f):
            _put(kwargs, field_of, name, value)
    for f in sorted(fields):
        if f in kwargs or not f.endswith(("_multiplier", "_multipliers")) or "dim_multiplier" in f \
                or not _modeling_reads(cls, f):
            continue  # (LFM2's ``block_ffn_dim_multiplier`` is a size)
        value = getattr(default, f, None)
        if f.endswith("_multiplier") and value == 1.0 and not isinstance(value, bool):
            kwargs[f] = MULTIPLIER
        elif f.endswith("_multipliers") and isinstance(value, (list, tuple)) and value and all(v == 1.0 for v in value):
            kwargs[f] = [MULTIPLIER] * len(value)


def _wrap_special_tokens(kwargs: dict[str, Any], fields: set[str], default, vocab_size: int) -> None:
    """Special token ids inside the small vocabulary (a padding index must be a row of the embedding)."""
    for f in fields:
        if f.endswith(("_token_id", "_token_index", "_token_ids")) and f not in kwargs:
            value = getattr(default, f, None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= vocab_size:
                kwargs[f] = value % vocab_size
            elif isinstance(value, (list, tuple)) and any(isinstance(v, int) and v >= vocab_size for v in value):
                kwargs[f] = [v % vocab_size if isinstance(v, int) else v for v in value]


def _layer_lists(cls: type, default, tiny, names: set[str], depth: int | None) -> dict[str, Any]:
    """Per-layer lists spelled out for ``names``: one layer of each kind ``default`` has, in the order they first
    appear, cycled to ``depth`` layers (``None``: as many as the most kinds, at least 2; the depth is returned too).
    With ``tiny`` (the config built without them) given, only its lists that lost a kind of ``default``'s."""
    field_of = _field_namer(cls)
    layers_field = field_of("num_hidden_layers")
    default_layers = getattr(default, layers_field, None) if layers_field else None
    lists: dict[str, list] = {}
    for name in names:
        f = field_of(name)
        value = getattr(default, f, None) if f is not None else None
        if not (isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value)):
            continue
        if default_layers is not None and len(value) != default_layers:
            continue  # a pattern of its own length, not one entry per layer
        kinds = _distinct(value)
        if tiny is not None:
            now = list(getattr(tiny, f, None) or [])
            if set(kinds) <= set(now):
                continue
            kinds = _distinct([*kinds, *now])
        lists[f] = kinds
    if not lists:
        return {}
    out: dict[str, Any] = {}
    if depth is None:
        depth = max(2, *(len(kinds) for kinds in lists.values()))
        if tiny is not None and layers_field is not None:
            depth = max(depth, getattr(tiny, layers_field))
        if layers_field is not None:
            out[layers_field] = depth
    out.update({f: [kinds[i % len(kinds)] for i in range(depth)] for f, kinds in lists.items()})
    return out


def _shrunk(cls: type, *, vocab_size: int, sliding_window: int, extra: dict[str, Any], overrides: dict[str, Any]):
    """``cls``'s config shrunk: generic kwargs, ``extra`` (a shrunk sub-config) and ``overrides``, with the per-layer
    lists the class spells out cut to one layer of each kind; then, where a list the class derives lost a kind of
    layer the default has (a pattern longer than the tiny depth), built again with that list spelled out."""
    default = cls()
    field_of = _field_namer(cls)
    overrides = {field_of(k) or k: v for k, v in overrides.items()}
    kwargs = {**_shrink_kwargs(cls, default, vocab_size=vocab_size, sliding_window=sliding_window), **extra,
              **overrides}
    layers_field = field_of("num_hidden_layers")
    depth = overrides.get(layers_field) if layers_field in overrides else None
    free = {n for n in LAYER_LISTS if field_of(n) is not None and field_of(n) not in overrides}
    literal = {f.name for f in dataclasses.fields(cls)
               if f.default is not dataclasses.MISSING and f.default is not None}
    kwargs.update(_layer_lists(cls, default, None, {n for n in free if field_of(n) in literal}, depth))
    config = cls(**kwargs)
    missing = _layer_lists(cls, default, config, {n for n in free if field_of(n) not in literal}, depth)
    if missing:
        config = cls(**{**kwargs, **missing})
    return config


def _shrunk_tree(cls: type, *, vocab_size: int, sliding_window: int, overrides: dict[str, Any]):
    """``cls``'s config shrunk, its text sub-configs (``text_config``, DBRX's ``ffn_config``, BLT's four stacks, ...)
    first, each with the :data:`OVERRIDES` of its own ``model_type``."""
    default = cls()
    extra = {}
    for key in getattr(cls, "sub_configs", None) or {}:
        sub = getattr(default, key, None)
        if key in overrides or any(m in key for m in MEDIA_SUB_CONFIGS) or not dataclasses.is_dataclass(sub):
            continue
        extra[key] = _shrunk_tree(type(sub), vocab_size=vocab_size, sliding_window=sliding_window,
                                  overrides=OVERRIDES.get(sub.model_type, {}))
    return _shrunk(cls, vocab_size=vocab_size, sliding_window=sliding_window, extra=extra, overrides=overrides)


def tiny_config(model_type: str, *, sliding_window: int = 8, vocab_size: int = 128) -> PretrainedConfig:
    """``model_type``'s default config, shrunk (see the module docstring): generic sizes, sliding windows switched
    on with window ``sliding_window``, no-op head transforms made non-trivial, then :data:`OVERRIDES`.

    A composite config gets its text sub-configs shrunk the same way (media sub-configs are left alone). Raises
    whatever the config class raises for a combination it rejects.
    """
    with quiet():
        return _shrunk_tree(config_class(model_type), vocab_size=vocab_size, sliding_window=sliding_window,
                            overrides=OVERRIDES.get(model_type, {}))
