"""What shrinking a config sets, by config field name: the generic tables and the per-architecture :data:`OVERRIDES`.

A name is looked up in the config class's fields directly and through its ``attribute_map`` (GPT-2's ``n_embd`` is
its ``hidden_size``); the first name that reaches a field sets it (:mod:`lit_prunedpo.zoo.shrink` applies them, in
the order the package docstring gives).
"""

from __future__ import annotations

from typing import Any

#: Sizes set wherever the config class has the field.
SIZES: dict[str, Any] = {
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
SIZES_IF_SET: dict[str, Any] = {
    "q_lora_rank": 32, "o_lora_rank": 16, "moe_latent_size": 32, "mamba_d_ssm": 128,
    "indexer_head_dim": 16, "indexer_n_heads": 2, "top_k_experts": 2, "prefix_dense_intermediate_size": 128,
}

#: Capped at a maximum (the default may be smaller and mean something: one shared expert, top-1 routing).
AT_MOST: dict[str, int] = {
    "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_k": 2, "moe_topk": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1, "n_group": 2, "topk_group": 1,
    "zero_expert_num": 2, "shared_intermediate_size": 64,  # 0 keeps meaning "none"
    "max_window_layers": 1,  # Qwen2-style: layers from this index on use the sliding window
}

#: Top-k fields: set where unset too (DeepSeek-V2 ships ``None`` and routes anyway).
TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk")

#: Vocabulary-sized fields (set to ``vocab_size``).
VOCABS = ("vocab_size", "vocab_size_per_layer_input", "shape_vocab_size", "pronunciation_vocab_size")
VOCABS_IF_SET = ("unpadded_vocab_size", "output_vocab_size")

#: Context-length fields (set to 256).
CONTEXTS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "context_length",
             "max_target_positions", "model_max_length")

#: Sliding-window lengths (set to ``sliding_window`` times the factor), and switches that turn the window on.
WINDOWS = {"sliding_window": 1, "window_size": 1, "attention_window_size": 1, "sliding_window_size": 1,
            "local_attention_window_len": 1, "attention_chunk_size": 1,
            "local_attention": 2}  # ModernBERT-decoder: both sides; its decoder window is half
WINDOW_SWITCHES = {"use_sliding_window": True}

#: Output-head transforms: set where the default is a no-op (1.0, 0 or ``None``) and the modeling code reads the
#: field, so that a scorer ignoring them scores a different model. The values bite on a tiny model's small logits
#: (|logit| < ~1): ignoring any of them moves the log-probs by 0.01 or more. (A soft-cap of 30, Gemma 2's default
#: that is kept, moves them by ~1e-4 only.)
HEAD_TRANSFORMS: dict[str, float] = {
    "logits_scaling": 4.0, "logit_scale": 0.25, "lm_head_multiplier": 0.5, "final_logit_softcapping": 2.0,
}

#: Body multipliers (Granite's embedding/residual/attention multipliers, Falcon-H1's muP multipliers): any field
#: named ``*_multiplier`` (or a list ``*_multipliers``) that defaults to 1.0 and the modeling code reads gets this.
MULTIPLIER = 0.5

#: Switches to the causal (left-to-right) mode of architectures whose default is bidirectional: BERT-style
#: stacks are causal LMs only as decoders, XLM has a causal (CLM) mode.
CAUSAL_MODES: dict[str, Any] = {"is_decoder": True, "causal": True}

#: Per-layer lists: one layer of each kind the default has, in the order they first appear.
LAYER_LISTS = ("layer_types", "mlp_layer_types", "block_types", "layers_block_type", "indexer_types")

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
    "ergo": {"first_dense_intermediate_size": 128},  # its dense first layer's MLP (32768 wide: 4.3M parameters)
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
    # Its indexer reads the first index_num_heads query heads of key head 0 (the default, 12, is more than tiny has);
    # a budget (top-k, sink and local tokens) shorter than the test sequences, so that the sparse selection bites.
    "kolibri1_1": {"index_num_heads": 2, "index_topk": 4, "index_pool_size": 8, "index_compression": 2,
                   "index_num_local_tokens": 2, "index_num_sink_tokens": 1, "mlp_only_layers": [0],
                   "mlp_only_intermediate_size": 128},
}


#: Sub-configs left as they are: media towers a text-only causal-LM class does not build.
MEDIA_SUB_CONFIGS = ("vision", "audio", "image", "video", "speech", "vq")
