"""A tiny, randomly initialised float32 model for every decoder-only text architecture transformers knows.

For the conformance tests and the generated supported-models table. :func:`causal_lm_types` lists every
``model_type`` of transformers' causal-LM auto mapping; :func:`tiny_config` shrinks a type's default config (no hub
access: configs come from the config classes) to a model of about 100k parameters; :func:`build_tiny` builds it and
checks it; :func:`zoo` sorts every type into buildable and :class:`Unbuildable` (with a one-line reason).

How a config is shrunk (:func:`tiny_config`):

1. **Generically**, for every size field the config class has (under its own name or through its
   ``attribute_map``): ``hidden_size`` 64, 2 layers, 4 attention heads, 2 key/value heads, ``head_dim`` 16,
   ``intermediate_size`` 128, expert sizes 64, 4 experts with top-2 routing, the vocabulary (special token ids
   wrapped into it), ``max_position_embeddings`` 256, small Mamba/conv/linear-attention sizes. Per-layer lists
   (``layer_types``, ``mlp_layer_types``, ...) keep one layer of each kind the default config has, so a hybrid's
   layers hold both kinds (a linear-attention/Mamba/conv layer and an attention layer; a sliding and a full one).
   Text sub-configs of a composite config are shrunk the same way; image/audio sub-configs are left alone.
2. **Sliding windows** are switched on with a window of ``sliding_window`` tokens (8: shorter than the test
   sequences, so it bites) wherever the architecture has one.
3. **Head transforms and multipliers** whose default is a no-op (Granite's ``logits_scaling`` and multipliers,
   Falcon-H1's ``lm_head_multiplier``, an unset soft-cap or ``logit_scale``), where the modeling code reads them,
   get a value that changes the log-probs, so that a scorer ignoring them fails the conformance tests. Non-trivial
   defaults (Gemma 2's soft-cap of 30, Cohere's ``logit_scale``) are kept.
4. Architectures whose default is bidirectional but which have a causal mode get it (``is_decoder`` of the
   BERT-style stacks, XLM's ``causal``).
5. **Per-architecture overrides** (:data:`OVERRIDES`, one dict, by ``model_type``) come last.

Training-time noise (dropout, router jitter) is left as the config ships it: the framework has to disable it
itself. Nothing else that changes the numerics is touched.

A type is *buildable* (:func:`build_tiny`) when its model builds on CPU in float32 and, in eval mode, a forward of
``(2, 20)`` random tokens returns finite logits ``[2, 20, V]`` (``V >= vocab_size``), the same on a second forward,
with the first 15 positions unchanged when the last 5 tokens change (causal). Left out (:class:`Unbuildable`):
encoder-decoder models (and decoders with cross-attention to an encoder), causal-LM classes that take image or
audio inputs, speculative-decoding assistants, models over :data:`MAX_PARAMETERS` after shrinking, classes without
the requested ``attn_implementation`` (``None``, the default: transformers' own choice, ``sdpa`` where the class
has it and ``eager`` otherwise, as a user who names none gets), and whatever transformers fails to build or run, or that fails a check.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import inspect
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["OVERRIDES", "Unbuildable", "UnbuildableError", "build_tiny", "causal_lm_types", "tiny_config", "zoo"]

#: Shape of the build check's forward: ``(batch, length)``; longer than the sliding window.
CHECK_SHAPE = (2, 20)

#: A shrunk model with more parameters than this is "not tiny" (checked on the meta device before building).
MAX_PARAMETERS = 2_000_000


@dataclass(frozen=True)
class Unbuildable:
    """Why a model type is left out of the zoo."""

    model_type: str
    reason: str  # one line


class UnbuildableError(Exception):
    """A model type that cannot be built tiny; ``.unbuildable`` says why."""

    def __init__(self, unbuildable: Unbuildable) -> None:
        super().__init__(f"{unbuildable.model_type}: {unbuildable.reason}")
        self.unbuildable = unbuildable


# --------------------------------------------------------------------------------------------------------------
# What is set, by field name. A name is looked up in the config class's fields directly and through its
# ``attribute_map`` (GPT-2's ``n_embd`` is its ``hidden_size``); the first name that reaches a field sets it.

#: Sizes set wherever the config class has the field.
_SIZES: dict[str, Any] = {
    # width, depth, heads
    "hidden_size": 64, "n_embd": 64, "d_model": 64, "emb_dim": 64, "embedding_dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2, "decoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4, "decoder_attention_heads": 4,
    "attention_heads": 4, "swa_num_attention_heads": 4,
    "num_key_value_heads": 2, "swa_num_key_value_heads": 2,
    "head_dim": 16, "attention_head_dim": 16, "d_head": 16, "dim_head": 16, "attention_head_size": 16,
    "swa_head_dim": 16, "kv_channels": 16,
    # feed-forward
    "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "ffn_hidden_size": 128, "dff": 128, "dim_ff": 128,
    "decoder_ffn_dim": 128, "d_inner": 128, "feed_forward_size": 128, "intermediate_size_mlp": 128,
    "dense_intermediate_size": 128,
    # mixture of experts
    "moe_intermediate_size": 64, "expert_ffn_hidden_size": 64, "shared_expert_intermediate_size": 64,
    "shared_experts_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    # multi-head latent attention, sparse-attention indexers
    "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "qk_head_dim": 16, "v_head_dim": 16,
    "index_head_dim": 16, "index_n_heads": 2,
    # state-space / recurrent / linear attention
    "state_size": 8, "mamba_d_state": 8, "ssm_state_size": 8, "time_step_rank": 8, "mamba_dt_rank": 8,
    "expand": 2, "mamba_expand": 2, "n_groups": 1, "mamba_n_groups": 1, "mamba_ngroups": 1,
    "mamba_n_heads": 8, "mamba_num_heads": 8, "mamba_d_head": 16, "mamba_head_dim": 16, "mamba_headdim": 16,
    "chunk_size": 8, "mamba_chunk_size": 8,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_num_heads": 4, "linear_head_dim": 16,
    "lru_width": 64,
    # smaller side sizes
    "hidden_size_per_layer_input": 16, "laurel_rank": 8, "word_embed_proj_dim": 64, "embedding_size": 64,
    "input_embedding_size": 64, "output_embedding_size": 64, "rotary_dim": 8, "router_hidden_size": 32,
    "adapter_rank": 8, "hc_lowrank": 16, "gated_norm_rank": 8, "loop_gate_rank": 8, "backbone_hidden_size": 64,
    "pronunciation_embed_dim": 16, "shape_embed_dim": 16,
}

#: Sizes set only where the default is set (``None`` switches the feature off: keep it off).
_SIZES_IF_SET: dict[str, Any] = {
    "q_lora_rank": 32, "o_lora_rank": 16, "moe_latent_size": 32, "mamba_d_ssm": 128,
    "indexer_head_dim": 16, "indexer_n_heads": 2, "top_k_experts": 2, "prefix_dense_intermediate_size": 128,
}

#: Capped at a maximum (the default may be smaller and mean something: one shared expert, top-1 routing).
_AT_MOST: dict[str, int] = {
    "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_k": 2, "moe_topk": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1, "n_group": 2, "topk_group": 1,
    "zero_expert_num": 2, "shared_intermediate_size": 64,  # 0 keeps meaning "none"
    "max_window_layers": 1,  # Qwen2-style: layers from this index on use the sliding window
}

#: Top-k fields: set where unset too (DeepSeek-V2 ships ``None`` and routes anyway).
_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk")

#: Vocabulary-sized fields (set to ``vocab_size``).
_VOCABS = ("vocab_size", "vocab_size_per_layer_input", "shape_vocab_size", "pronunciation_vocab_size")
_VOCABS_IF_SET = ("unpadded_vocab_size", "output_vocab_size")

#: Context-length fields (set to 256).
_CONTEXTS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "context_length",
             "max_target_positions", "model_max_length")

#: Sliding-window lengths (set to ``sliding_window`` times the factor), and switches that turn the window on.
_WINDOWS = {"sliding_window": 1, "window_size": 1, "attention_window_size": 1, "sliding_window_size": 1,
            "local_attention_window_len": 1, "attention_chunk_size": 1,
            "local_attention": 2}  # ModernBERT-decoder: both sides; its decoder window is half
_WINDOW_SWITCHES = {"use_sliding_window": True}

#: Output-head transforms: set where the default is a no-op (1.0, 0 or ``None``) and the modeling code reads the
#: field, so that a scorer ignoring them scores a different model. The values bite on a tiny model's small logits
#: (|logit| < ~1): ignoring any of them moves the log-probs by 0.01 or more. (A soft-cap of 30, Gemma 2's default
#: that is kept, moves them by ~1e-4 only.)
_HEAD_TRANSFORMS: dict[str, float] = {
    "logits_scaling": 4.0, "logit_scale": 0.25, "lm_head_multiplier": 0.5, "final_logit_softcapping": 2.0,
}

#: Body multipliers (Granite's embedding/residual/attention multipliers, Falcon-H1's muP multipliers): any field
#: named ``*_multiplier`` (or a list ``*_multipliers``) that defaults to 1.0 and the modeling code reads gets this.
_MULTIPLIER = 0.5

#: Switches to the causal (left-to-right) mode of architectures whose default is bidirectional: BERT-style
#: stacks are causal LMs only as decoders, XLM has a causal (CLM) mode.
_CAUSAL_MODES: dict[str, Any] = {"is_decoder": True, "causal": True}

#: Per-layer lists: one layer of each kind the default has, in the order they first appear.
_LAYER_LISTS = ("layer_types", "mlp_layer_types", "block_types", "layers_block_type", "indexer_types")

#: Per-architecture config kwargs, applied after everything above: ``model_type -> kwargs`` (a sub-config is looked
#: up by its own ``model_type``: BLT's ``blt_local_encoder``, Qwen3.5's ``qwen3_5_text``).
OVERRIDES: dict[str, dict[str, Any]] = {
    # Hybrids whose tiny depth would hold one kind of layer only: one recurrent (Mamba, conv, RG-LRU) layer and
    # one attention layer.
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},  # layer 0 Mamba + MLP, layer 1 attention + MoE
    "lfm2": {"full_attn_idxs": [1]},  # the default makes every layer attention
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # the default (None) does not build
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "zamba": {"layers_block_type": ["hybrid", "hybrid"]},  # the shared block is tied across hybrid layers: two
    "zamba2": {"layers_block_type": ["linear_attention", "hybrid"]},
    "zaya": {"layer_types": ["hybrid_sliding", "hybrid"]},
    # Sliding windows the default leaves unused: one sliding layer, one full.
    "laguna": {"layer_types": ["sliding_attention", "full_attention"]},
    "mellum": {"layer_types": ["sliding_attention", "full_attention"]},
    "smollm3": {"no_rope_layers": [1, 0]},  # its NoPE layers are the sliding ones
    # Windows the config has and the model ignores (it masks causally only): the default, not a false claim.
    "moshi": {"sliding_window": 3000},
    "nemotron_h": {"sliding_window": None},
    # Depths the layer patterns need.
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1},
    "gemma3n_text": {"num_hidden_layers": 4, "num_kv_shared_layers": 2,  # the last two reuse the first two's KV
                     "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # Sizes the generic pass gets wrong.
    "mamba2": {"num_heads": 8},  # num_heads * head_dim == expand * hidden_size
    "xlstm": {"hidden_size": 128, "embedding_dim": 128},  # at 64 wide the native mLSTM kernel fails (qk 8, v 16)
    "dots3_note": {"vision_config": {"adapter_out_dim": 64}, "audio_config": {"adapter_out_dim": 64}},  # = hidden
    "dots3_note_text": {"swa_num_attention_heads": 4, "swa_num_key_value_heads": 4, "swa_q_lora_rank": 32,
                        "swa_kv_lora_rank": 16, "swa_head_dim": 16, "swa_qk_nope_head_dim": 8, "swa_v_head_dim": 16},
    "blt": {"encoder_hash_byte_group_vocab": 64, "encoder_hash_byte_group_size": [3, 4],
            "use_cache": False},  # with a cache, the forward fails (DynamicCache(config=BltConfig): no layer count)
    "blt_local_encoder": {"hidden_size_global": 64, "num_hidden_layers": 1},
    "blt_local_decoder": {"hidden_size_global": 64},
    "reformer": {"attn_layers": ["local", "lsh"], "axial_pos_shape": [16, 16], "axial_pos_embds_dim": [32, 32],
                 "local_attn_chunk_length": 8, "lsh_attn_chunk_length": 8},  # (left out: LSH is random per forward)
    # Defaults that do not build or run: what the released checkpoints set.
    "dbrx": {"attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 500000.0},
             "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}},
    "dots1": {"n_shared_experts": 1},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                       "indexer_compress_ratio": 4},
    "cohere_compass_text": {"layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
        kind: {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}
        for kind in ("sliding_attention", "full_attention")}},
    "xmod": {"default_language": "en_XX"},
}

#: Forward arguments that mark a multimodal causal-LM class (image, video or audio inputs).
_MEDIA_INPUTS = ("pixel_values", "image_patches", "image_pixel_values", "pixel_values_videos", "input_features",
                 "audio_input_features", "input_values")


def causal_lm_types() -> list[str]:
    """Every ``model_type`` of transformers' causal-LM auto mapping, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _causal_lm_class_name(model_type: str) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]


def _config_class(model_type: str) -> type:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers' logger and Python warnings while configs and models are built."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


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
    """The generic kwargs that shrink ``cls``'s ``default`` config (no per-architecture overrides)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    field_of = _field_namer(cls)
    kwargs: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        if (f := field_of(name)) is not None and f not in kwargs:
            kwargs[f] = value

    for name, value in _SIZES.items():
        put(name, value)
    for name, value in _SIZES_IF_SET.items():
        if (f := field_of(name)) is not None and getattr(default, f, None) is not None:
            put(name, value)
    for name, cap in _AT_MOST.items():
        if (f := field_of(name)) is None:
            continue
        old = getattr(default, f, None)
        if (isinstance(old, int) and old > cap) or (old is None and name in _TOP_K):
            put(name, cap)
    for name in _VOCABS:
        put(name, vocab_size)
    for name in _VOCABS_IF_SET:
        if (f := field_of(name)) is not None and getattr(default, f, None) is not None:
            put(name, vocab_size)
    for name in _CONTEXTS:
        put(name, 256)
    for name, factor in _WINDOWS.items():
        put(name, factor * sliding_window)
    for name, value in _WINDOW_SWITCHES.items():
        put(name, value)
    for name, value in _HEAD_TRANSFORMS.items():
        f = field_of(name)
        if f is not None and getattr(default, f, None) in (None, 0, 0.0, 1, 1.0) and _modeling_reads(cls, f):
            put(name, value)
    for f in sorted(fields):
        if f in kwargs or not f.endswith(("_multiplier", "_multipliers")) or "dim_multiplier" in f \
                or not _modeling_reads(cls, f):
            continue  # (LFM2's ``block_ffn_dim_multiplier`` is a size)
        value = getattr(default, f, None)
        if f.endswith("_multiplier") and value == 1.0 and not isinstance(value, bool):
            kwargs[f] = _MULTIPLIER
        elif f.endswith("_multipliers") and isinstance(value, (list, tuple)) and value and all(v == 1.0 for v in value):
            kwargs[f] = [_MULTIPLIER] * len(value)
    for f in fields:  # special tokens inside the small vocabulary (a padding index must be a row of the embedding)
        if f.endswith(("_token_id", "_token_index", "_token_ids")) and f not in kwargs:
            value = getattr(default, f, None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= vocab_size:
                kwargs[f] = value % vocab_size
            elif isinstance(value, (list, tuple)) and any(isinstance(v, int) and v >= vocab_size for v in value):
                kwargs[f] = [v % vocab_size if isinstance(v, int) else v for v in value]
    if field_of("kv_lora_rank") is not None:  # multi-head latent attention: per-head keys, rotary on a slice
        if (f := field_of("num_key_value_heads")) is not None:
            kwargs[f] = kwargs.get(field_of("num_attention_heads"), 4)
        f = field_of("head_dim")
        if f is not None and getattr(default, f, None) == getattr(default, "qk_rope_head_dim", 0):
            kwargs[f] = _SIZES["qk_rope_head_dim"]  # LongCat: the rotary embedding's width
    if not getattr(default, "is_encoder_decoder", False):  # the causal mode of a stack that has another
        for name, value in _CAUSAL_MODES.items():
            if name in fields:
                kwargs[name] = value

    return kwargs


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
    free = {n for n in _LAYER_LISTS if field_of(n) is not None and field_of(n) not in overrides}
    literal = {f.name for f in dataclasses.fields(cls)
               if f.default is not dataclasses.MISSING and f.default is not None}
    kwargs.update(_layer_lists(cls, default, None, {n for n in free if field_of(n) in literal}, depth))
    config = cls(**kwargs)
    missing = _layer_lists(cls, default, config, {n for n in free if field_of(n) not in literal}, depth)
    if missing:
        config = cls(**{**kwargs, **missing})
    return config


#: Sub-configs left as they are: media towers a text-only causal-LM class does not build.
_MEDIA_SUB_CONFIGS = ("vision", "audio", "image", "video", "speech", "vq")


def _shrunk_tree(cls: type, *, vocab_size: int, sliding_window: int, overrides: dict[str, Any]):
    """``cls``'s config shrunk, its text sub-configs (``text_config``, DBRX's ``ffn_config``, BLT's four stacks, ...)
    first, each with the :data:`OVERRIDES` of its own ``model_type``."""
    default = cls()
    extra = {}
    for key in getattr(cls, "sub_configs", None) or {}:
        sub = getattr(default, key, None)
        if key in overrides or any(m in key for m in _MEDIA_SUB_CONFIGS) or not dataclasses.is_dataclass(sub):
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
    with _quiet():
        return _shrunk_tree(_config_class(model_type), vocab_size=vocab_size, sliding_window=sliding_window,
                            overrides=OVERRIDES.get(model_type, {}))


def _static_reason(model_type: str) -> str | None:
    """Why ``model_type`` is not decoder-only text, from its classes alone (``None``: nothing found)."""
    import transformers

    name = _causal_lm_class_name(model_type)
    model_cls = getattr(transformers, name, None)
    if model_cls is None:
        return f"transformers has no class {name}"
    params = inspect.signature(model_cls.forward).parameters
    media = [p for p in _MEDIA_INPUTS if p in params]
    if media:
        return f"multimodal: {name} takes {media[0]}"
    if "shared_kv_states" in params:
        return f"speculative-decoding assistant: {name} needs its main model's shared_kv_states"
    with _quiet():
        try:
            default = _config_class(model_type)()
        except Exception as err:  # noqa: BLE001 - reported as the reason
            return _exception_reason("its default config", err)
    if getattr(default, "is_encoder_decoder", False):
        return f"encoder-decoder: {name} is its decoder half"
    return None


def _exception_reason(what: str, err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if first.endswith(":") and len(lines) > 1:  # a validation error names the validator, then the error
        first = f"{first} {lines[1]}"
    return f"transformers raised {type(err).__name__} building {what}: {first}"[:300]


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
        raise fail(_exception_reason("the forward", err)) from err
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


def build_tiny(model_type: str, *, attn_implementation: str | None = None, sliding_window: int = 8, vocab_size: int = 128,
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

    if (reason := _static_reason(model_type)) is not None:
        raise unbuildable(reason)
    try:
        config = tiny_config(model_type, sliding_window=sliding_window, vocab_size=vocab_size)
    except Exception as err:  # noqa: BLE001 - reported as the reason
        raise unbuildable(_exception_reason("the tiny config", err)) from err
    with torch.random.fork_rng(devices=[]), _quiet():
        # the structure first (eager builds where the requested attention is missing): size, cross-attention
        if (meta := _meta_model(config, attn_implementation) or _meta_model(config, "eager")) is not None:
            if (size := sum(p.numel() for p in meta.parameters())) > MAX_PARAMETERS:
                raise unbuildable(f"not tiny: {size:,} parameters after shrinking")
            if any(_ENCODER_ATTENTION.search(name) for name, _ in meta.named_parameters()):
                raise unbuildable(f"encoder-decoder: {_causal_lm_class_name(model_type)} is a decoder with "
                                  "cross-attention to an encoder's states")
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                     dtype=torch.float32)
        except Exception as err:  # noqa: BLE001 - reported as the reason
            if "does not support an attention implementation" in str(err):  # eager-only classes, for one
                raise unbuildable(f"{_causal_lm_class_name(model_type)} does not support "
                                  f"attn_implementation={attn_implementation!r}") from err
            raise unbuildable(_exception_reason("the model", err)) from err
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
