"""Activation-memory model of one PrunedDPO step: its predicted peak above the step's start, from the forwards it runs.

What a step allocates on top of what it starts with (weights, optimizer state, the batch), for a Llama-style layer
(``transformers``' ``LlamaDecoderLayer`` with ``sdpa`` attention, no dropout), in four phases; the step's peak is the
largest:

* **forward**: what autograd keeps for backward from the gradient forward (``S``, below), plus the LM head's
  float32 ``K x V`` logits beside their saved log-softmax (and the keys and values it keeps for the next forward);
* **no-grad forwards** (the policy's no-grad rows, then an online reference): ``S`` plus the largest one's transient
  working set (one layer's MLP, the mask, its keys and values cache, its ``K x V`` logits and log-softmax);
* **backward's start**: ``S`` plus the plain scorer's two more ``K x V`` float32 buffers (the gradients of the
  log-softmax and of the logits, while the saved log-softmax lives), or the LM head's weight gradient if larger;
* **optimizer**: every parameter's gradient (``set_to_none``: allocated in backward, freed after the step) and
  the optimizer's temporaries (AdamW single-tensor on the CPU: two of the largest parameter; ``foreach`` on CUDA:
  one of every parameter).

Saved bytes per token and layer (counted by walking the autograd graph of a real step, ``_saved_*`` tensors that are
not parameters, de-duplicated by storage; float32 and bfloat16, 1 and 4 KV heads, padded and packed layouts: the
count below matched to the byte): each RMSNorm keeps its float32 input and rsqrt and its normalised output (``d``
in the parameter dtype); the q/k/v and gate/up projections keep their inputs (``2d``), ``o_proj`` its input
(``a = heads * head_dim``); attention keeps q, k, v after rotary (``a + 2 kv``; with a mask and GQA, ``transformers``
repeats keys and values to every head first, a copy unless there is one KV head: then ``3 a``, and a gradient forward
that keeps its keys and values for the next one holds the ``2 kv`` originals too) and float32 log-sum-exps
(``heads``); the MLP keeps gate, SiLU(gate), up and their product (``4 f``). Per forward:
the mask, ``rows x W x (cached + W)`` in the parameter dtype **per layer** (packed layout always; padded only with
padding), the rotary cos/sin, the final norm, the gathered hidden states ``K x d`` and the log-softmax ``K x V``
float32 (plain scorer; the chunked one keeps one log-sum-exp per row), the input ids and the per-position indices
and weights.

Checked against live tensor bytes (the CPU profiler's allocations, one step of every mode on Llamas of 1-42M
parameters, float32 and bfloat16): within 4%; that is what the benchmark's CPU meter reads since it counts live tensor
storage. Not counted: allocator rounding, caching and fragmentation (an RSS meter also holds freed heap memory glibc
keeps), the backward's activation gradients (a few
``tokens x d`` at a time), other architectures' extra norms (Gemma's four per layer, q/k norms); the CUDA kernels'
saved tensors are assumed to be the CPU's (memory-efficient attention keeps the same q, k, v, output and mask).
Gemma 3's sliding-window layers are counted as full attention (the mask term assumes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

from lit_prunedpo.layout import SharedPromptLayout

FP32 = 4
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# Saved for backward, per token and layer, in units of the sizes below (see the module docstring).
NORM_FP32 = 2  # two RMSNorms: each its float32 input (the upcast copy; in float32 the residual stream itself)
NORM_RSQRT = 2  # and one float32 rsqrt per token each
NORM_OUT = 2  # two RMSNorms: each its normalised output, before the weight (parameter dtype)
LINEAR_IN_D = 2  # inputs of q/k/v (one tensor) and of gate/up (one tensor), d each
LINEAR_IN_A = 1  # input of o_proj: the attention output, a
ATTN_Q = 1  # q after rotary, a
ATTN_KV = 2  # k and v, kv each (a each when GQA's repeat_kv copies them: a mask and 1 < kv heads < heads)
MLP_F = 4  # gate, SiLU(gate), up, SiLU(gate) * up: f each
ROPE = 2  # cos and sin, head_dim per token, once per forward
HEAD_FORWARD_KV = 1  # the gradient forward's float32 logits, alive beside their (saved) log-softmax
HEAD_NO_GRAD_KV = 2  # a no-grad forward's float32 logits and log-softmax (the head's bf16 output is freed first)
PLAIN_BACKWARD_KV = 2  # the plain scorer's backward: d log-softmax and d logits, K x V float32 each
NO_GRAD_MLP_F = 3  # a no-grad layer's peak: SiLU(gate), up and their product alive together
NO_GRAD_D = 4  # and about four tokens x d tensors (residual, norm's float copy, output, attention output)
CHUNKED_KV = 3  # the chunked scorer: about 3 x chunk x V floats (its docstring)
TOKEN_IDS = 8  # bytes per token: the embedding's int64 input ids
SCORED_POSITION = 41  # bytes per scored position: the gather/index/index_add int64 indices (4 x 8), the float32
# index_add source and IPW weight (2 x 4), a bool mask (1): the head's and the estimate's per-position tensors

Scorer = Literal["plain", "chunked"]


@dataclass(frozen=True)
class LayerDims:
    """The sizes the memory model needs (a Llama-style decoder).

    Attributes:
        hidden: ``d``.
        q_dim: ``a = heads * head_dim`` (queries and the attention output).
        kv_dim: ``kv_heads * head_dim`` (keys, values).
        heads: attention heads.
        head_dim: per head.
        ffn: ``f``, the MLP's inner size.
        layers: decoder layers.
        vocab: ``V``.
        params: every parameter (tied embeddings counted once): the gradients' size.
        largest_param: elements of the largest parameter (the CPU optimizer's temporaries).
    """

    hidden: int
    q_dim: int
    kv_dim: int
    heads: int
    head_dim: int
    ffn: int
    layers: int
    vocab: int
    params: int
    largest_param: int

    def saved_kv(self, masked: bool) -> int:
        """Size of the keys (and of the values) attention keeps per token: ``transformers`` repeats them to every
        head before a masked ``sdpa`` call (``use_gqa_in_sdpa`` is false with a mask), a view for one KV head."""
        kv_heads = self.kv_dim // self.head_dim
        return self.q_dim if masked and kv_heads not in (1, self.heads) else self.kv_dim

    @classmethod
    def from_config(cls, config: Any, params: int, largest_param: int) -> "LayerDims":
        """From a ``transformers`` config (Llama, Qwen2, Gemma 3 field names) and the model's parameter counts."""
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        return cls(
            hidden=int(config.hidden_size), q_dim=heads * head_dim, kv_dim=kv_heads * head_dim, heads=heads,
            head_dim=head_dim, ffn=int(config.intermediate_size), layers=int(config.num_hidden_layers),
            vocab=int(config.vocab_size), params=int(params), largest_param=int(largest_param),
        )

    @classmethod
    def from_model(cls, model: Any) -> "LayerDims":
        """From a built (or ``meta``-device) ``transformers`` causal LM: its config and its parameters."""
        sizes = [p.numel() for p in model.parameters()]  # shared (tied) parameters are listed once
        return cls.from_config(model.config, sum(sizes), max(sizes))


@dataclass(frozen=True)
class ForwardShape:
    """One forward as the layout runs it.

    Attributes:
        rows: sequences.
        width: columns of each.
        scored: positions the LM head runs on (``K``).
        requires_grad: a gradient forward (its activations are kept for backward).
        cached: key columns read from the previous forward's keys and values.
        masked: the forward carries a materialised attention mask (the packed layout; the padded one with padding).
        keeps_cache: the forward keeps its keys and values for the next forward.
    """

    rows: int
    width: int
    scored: int
    requires_grad: bool
    cached: int = 0
    masked: bool = True
    keeps_cache: bool = False

    @property
    def tokens(self) -> int:
        return self.rows * self.width

    @property
    def mask_elements(self) -> int:
        return self.rows * self.width * (self.cached + self.width) if self.masked else 0


def saved_per_token_layer(dims: LayerDims, p: int, masked: bool = True) -> int:
    """Bytes kept for backward per token and layer, with parameters of ``p`` bytes."""
    d, a, kv, f = dims.hidden, dims.q_dim, dims.saved_kv(masked), dims.ffn
    fp32 = NORM_FP32 * d + NORM_RSQRT + dims.heads
    act = NORM_OUT * d + LINEAR_IN_D * d + (LINEAR_IN_A + ATTN_Q) * a + ATTN_KV * kv + MLP_F * f
    return FP32 * fp32 + p * act


def saved_bytes(dims: LayerDims, shape: ForwardShape, p: int, scorer: Scorer = "plain") -> int:
    """Bytes a gradient forward keeps for backward (0 for a no-grad one)."""
    if not shape.requires_grad:
        return 0
    T, K, d = shape.tokens, shape.scored, dims.hidden
    layers = dims.layers * (T * saved_per_token_layer(dims, p, shape.masked) + shape.mask_elements * p)
    final_norm = T * (FP32 * (d + 1) + p * d)
    rope = ROPE * T * dims.head_dim * p
    head = K * d * p + (K * dims.vocab * FP32 if scorer == "plain" else 2 * K * FP32)
    return layers + final_norm + rope + head + T * TOKEN_IDS + K * SCORED_POSITION


def kept_cache_bytes(dims: LayerDims, shape: ForwardShape, p: int) -> int:
    """Keys and values a forward keeps for the next one beyond what attention saved (when GQA's repeat copied
    them, the cache holds the originals); held until the policy's forwards are done."""
    copied = dims.saved_kv(shape.masked) != dims.kv_dim
    return dims.layers * shape.tokens * ATTN_KV * dims.kv_dim * p if shape.keeps_cache and copied else 0


def head_rows(scorer: Scorer, scored: int, chunk_size: int | None) -> int:
    """Rows of logits the head holds at once: all ``K`` for the plain scorer, one chunk for the chunked one."""
    return scored if scorer == "plain" or not chunk_size else min(scored, chunk_size)


def no_grad_transient(dims: LayerDims, shape: ForwardShape, p: int, scorer: Scorer = "plain",
                      chunk_size: int | None = None) -> int:
    """Peak working set of a no-grad forward: one layer's MLP and tensors, the mask (one layer's), the keys and
    values cache it builds when it reads the previous forward's, and its head's logits and log-softmax."""
    T, d = shape.tokens, dims.hidden
    layer = T * p * (NO_GRAD_MLP_F * dims.ffn + NO_GRAD_D * d) + shape.mask_elements * p
    cache = dims.layers * shape.rows * (shape.cached + shape.width) * ATTN_KV * dims.kv_dim * p if shape.cached else 0
    rows = head_rows(scorer, shape.scored, chunk_size)
    logits = rows * dims.vocab * HEAD_NO_GRAD_KV * FP32
    return max(layer + cache, cache + logits)


@dataclass(frozen=True)
class MemoryPrediction:
    """Predicted bytes above the step's start in each phase (see the module docstring)."""

    forward: int
    no_grad: int
    backward: int
    optimizer: int

    @property
    def peak(self) -> int:
        """The step's predicted peak above its start: what the benchmark's meter reads."""
        return max(self.forward, self.no_grad, self.backward, self.optimizer)

    @property
    def activation_peak(self) -> int:
        """The peak without the gradients and the optimizer: what pruning acts on."""
        return max(self.forward, self.no_grad)


def predict_step(
    dims: LayerDims, policy: Sequence[ForwardShape], reference: ForwardShape | None, dtype: str = "float32",
    scorer: Scorer = "plain", chunk_size: int | None = None, device: str = "cpu",
) -> MemoryPrediction:
    """Predicted peak memory of one step running ``policy`` forwards then ``reference`` (``None``: a cached
    reference, no forward), parameters and activations in ``dtype``, optimizer AdamW on ``device``."""
    if dtype not in BYTES:
        raise ValueError(f"dtype must be one of {sorted(BYTES)}, got {dtype!r}")
    p = BYTES[dtype]
    saved = sum(saved_bytes(dims, s, p, scorer) for s in policy)
    grad_k = sum(s.scored for s in policy if s.requires_grad)
    rows = head_rows(scorer, grad_k, chunk_size)
    head_forward = rows * dims.vocab * HEAD_FORWARD_KV * FP32
    if scorer == "plain":
        head_backward = max(PLAIN_BACKWARD_KV * grad_k * dims.vocab * FP32, p * dims.vocab * dims.hidden)
    else:
        head_backward = CHUNKED_KV * rows * dims.vocab * FP32 + p * dims.vocab * dims.hidden
    kept = sum(kept_cache_bytes(dims, s, p) for s in policy)
    no_grad = [kept + no_grad_transient(dims, s, p, scorer, chunk_size) for s in policy if not s.requires_grad]
    if reference is not None:
        no_grad.append(no_grad_transient(dims, reference, p, scorer, chunk_size))
    optimizer_temp = dims.params * p if device == "cuda" else 2 * dims.largest_param * p
    return MemoryPrediction(
        forward=saved + kept + head_forward, no_grad=saved + max(no_grad, default=0), backward=saved + head_backward,
        optimizer=dims.params * p + optimizer_temp,
    )


def shapes_of(forwards: Any) -> tuple[list[ForwardShape], ForwardShape]:
    """The policy forwards and the (online) reference forward of a
    :class:`~lit_prunedpo.step.execute.StepForwards`, as :class:`ForwardShape` objects."""
    packed = isinstance(forwards.layout, SharedPromptLayout)

    def shape(laid_out: Any, requires_grad: bool, keeps: bool = False) -> ForwardShape:
        rows, width = laid_out.shape
        masked = packed or laid_out.real_tokens < rows * width
        group = laid_out.group  # the whole head runs on num_head_positions (a split log-softmax: fewer than scored)
        scored = getattr(group, "num_head_positions", group.num_scored)
        return ForwardShape(rows, width, int(scored), requires_grad,
                            int(laid_out.cached_columns), masked, keeps)

    policy = [shape(f.laid_out, f.requires_grad, f.keeps_keys_values) for f in forwards.policy]
    return policy, shape(forwards.reference, False)
