"""The memory model against hand-worked numbers and against the tensors autograd really keeps; the real shapes' sizes
read from ``meta``-device models against built models, closed-form counts and the published parameter totals."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.batches import make_batches
from lit_prunedpo_lab.bench.memory_model import ForwardShape, LayerDims, predict_step, saved_bytes, shapes_of
from lit_prunedpo_lab.bench.presets import MODES, Preset, llama_config
from lit_prunedpo_lab.bench.real_shapes import REAL_SHAPES, dims_of, meta_model, predict_real_shapes
from lit_prunedpo_lab.bench.scaling import SIZES
from lit_prunedpo.step.execute import layout_for
from lit_prunedpo.models import FromConfig
from lit_prunedpo.module import PrunedDPO
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.step.io import StepParts

# d=4, 2 heads of 2 (a=4), 1 KV head (kv=2), f=8, 2 layers, V=10; 1000 parameters, the largest 100.
DIMS = LayerDims(hidden=4, q_dim=4, kv_dim=2, heads=2, head_dim=2, ffn=8, layers=2, vocab=10, params=1000,
                 largest_param=100)
GRAD = ForwardShape(rows=1, width=3, scored=2, requires_grad=True)  # packed: masked
REFERENCE = ForwardShape(rows=1, width=3, scored=2, requires_grad=False)


def test_saved_bytes_by_hand():
    """float32, per token and layer: float32 2d + 2 + heads = 12 elements; 2d + 2d + 2a + 2kv + 4f = 60 elements
    (one KV head: GQA's repeat is a view, kv stays 2): 72 x 4 = 288 bytes. 3 tokens, 2 layers, a 1 x 3 x 3 mask per
    layer: 2 (3 x 288 + 9 x 4) = 1800; final norm 3 (4 (d + 1) + 4d) = 108; rotary 2 x 3 x 2 x 4 = 48; head: the
    gathered 2 x 4 hidden states 32 + the 2 x 10 log-softmax 80 = 112; 3 int64 token ids 24 and 41 bytes of indices
    and weights per scored position 82. Total 2174; no-grad forwards keep nothing."""
    assert saved_bytes(DIMS, GRAD, 4) == 2174
    assert saved_bytes(DIMS, REFERENCE, 4) == 0
    # bfloat16: float32 12 x 4 = 48 + 60 x 2 = 168 per token-layer; 2 (3 x 168 + 9 x 2) = 1044; final norm
    # 3 (20 + 8) = 84; rotary 24; head 2 x 4 x 2 + 80 = 96; ids and indices 106 -> 1354
    assert saved_bytes(DIMS, GRAD, 2) == 1354
    # 4 heads, 2 KV heads (a=8, kv=4): with a mask transformers repeats k and v to every head (copies): 2a, not 2kv
    gqa = LayerDims(4, 8, 4, 4, 2, 8, 2, 10, 1000, 100)
    assert gqa.saved_kv(masked=True) == 8 and gqa.saved_kv(masked=False) == 4 and DIMS.saved_kv(True) == 2


def test_step_phases_by_hand():
    """S = 2174. forward: S + the float32 logits 2 x 10 x 4 = 2254; backward's start: S + max(2 x 2 x 10 x 4,
    4 x 10 x 4 head gradient) = 2334; the reference (no grad): one layer 3 x 4 (3 x 8 + 4 x 4) + its 9 x 4 mask =
    516 > logits and log-softmax 2 x 10 x 2 x 4 = 160, so 2690; optimizer: gradients 1000 x 4 + the CPU's two
    temporaries of the largest parameter 2 x 100 x 4 = 4800 (CUDA foreach: one of everything, 8000)."""
    p = predict_step(DIMS, [GRAD], REFERENCE)
    assert (p.forward, p.backward, p.no_grad, p.optimizer) == (2254, 2334, 2690, 4800)
    assert p.peak == 4800 and p.activation_peak == 2690
    assert predict_step(DIMS, [GRAD], None).no_grad == 2174  # a cached reference runs no forward
    assert predict_step(DIMS, [GRAD], REFERENCE, device="cuda").optimizer == 8000
    with pytest.raises(ValueError, match="dtype"):
        predict_step(DIMS, [GRAD], REFERENCE, dtype="int8")


def _saved_by_autograd(output, params) -> int:
    """Bytes of the distinct tensors (not parameters) that the step's graph keeps for backward."""
    seen, stack, visited = {}, [output.estimate.objective.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    value = getattr(node, name)
                except RuntimeError:
                    continue
                for t in value if isinstance(value, (tuple, list)) else [value]:
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in params:
                        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        stack += [n for n, _ in node.next_functions]
    return sum(seen.values())


@pytest.mark.parametrize("kv_heads, shared, dtype", [(4, True, None), (2, True, "bfloat16"), (1, False, None)])
def test_saved_bytes_are_what_autograd_keeps(kv_heads, shared, dtype):
    """A real step of vanilla, branch and all (packed or padded layout, GQA or not): the model's saved bytes are
    within 1% of the distinct tensors the graph holds."""
    config = {**llama_config(64, 32, 2, 4, 48, 256), "num_key_value_heads": kv_heads}
    lengths = {"prompt": (3, 9), "chosen": (4, 20), "rejected": (4, 18)}
    batch = make_batches(Preset("t", "", model=config, batch_size=2, lengths=lengths), 1)[0]
    module = PrunedDPO(policy=FromConfig("llama", config, dtype=dtype), beta=0.1)
    module.train()
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    dims, p = LayerDims.from_model(module.policy), 2 if dtype else 4
    for mode in ("vanilla", "branch", "all"):
        parts = StepParts(*MODES[mode](), TokenScorer(), module.reference, layout_for(shared))
        out = module.step(batch, parts, torch.Generator().manual_seed(0))
        policy, _ = shapes_of(out.forwards)
        predicted = sum(saved_bytes(dims, s, p) for s in policy)
        assert predicted == pytest.approx(_saved_by_autograd(out, params), rel=0.01), mode


def _shrunk(config: dict) -> dict:
    """The same architecture, small: 2 layers, V=512, widths / 8 (heads kept, so head_dim / 8)."""
    small = dict(config, num_hidden_layers=2, vocab_size=512, hidden_size=config["hidden_size"] // 8,
                 intermediate_size=config["intermediate_size"] // 8)
    if "head_dim" in config:
        small["head_dim"] = config["head_dim"] // 8
    return small


@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_meta_dims_equal_a_built_models(name):
    shape = REAL_SHAPES[name]
    config = _shrunk(shape.config)
    with torch.random.fork_rng(devices=[]):
        built = AutoModelForCausalLM.from_config(AutoConfig.for_model(shape.model_type, **config))
    assert dims_of(shape.model_type, config) == (cost.ModelDims.from_model(built), LayerDims.from_model(built))


#: Published parameter totals (model cards / safetensors metadata).
PUBLISHED = {"Qwen2.5-0.5B": 494_032_768, "Gemma-3-1B": 999_885_952, "Llama-3-8B": 8_030_261_248,
             "Llama-3-70B": 70_553_706_496}


@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_real_shape_dims_by_arithmetic(name):
    """Full size, from the meta-device model: the body's linear layers per layer q d a, k and v d kv, o a d, MLP
    3 d f (Qwen2: q/k/v biases a + 2 kv); the parameters against the published total."""
    shape = REAL_SHAPES[name]
    c = shape.config
    d, f, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    head_dim = c.get("head_dim", d // c["num_attention_heads"])
    a, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    bias = a + 2 * kv if shape.model_type == "qwen2" else 0
    dims, layer = dims_of(shape.model_type, c)
    assert dims == cost.ModelDims(L * (2 * d * a + 2 * d * kv + 3 * d * f + bias), d, V, L, a)
    assert layer.params == PUBLISHED[name] and layer.largest_param == V * d
    assert (layer.q_dim, layer.kv_dim, layer.ffn, layer.layers, layer.vocab) == (a, kv, f, L, V)


def test_named_sizes_count_their_parameters():
    for size in SIZES.values():
        model = meta_model("llama", size.model(8192, 128))
        total = sum(p.numel() for p in model.parameters())
        assert size.params(8192) == (total, cost.ModelDims.from_model(model).body_params), size.name


def test_real_shape_predictions():
    rows = predict_real_shapes(["Qwen2.5-0.5B"], ["hh-rlhf", "512"], batch_size=2, num_batches=2)
    assert [(r["lengths"], r["mode"]) for r in rows] == [(s, m) for s in ("hh-rlhf", "512") for m in MODES]
    for r in rows:
        assert 0 < r["time_ratio_pred"] <= 1.0 + 1e-9 or r["mode"] == "branch"  # branch may pack worse (HH)
        assert 0 < r["memory_ratio_pred"] <= 1.0 + 1e-9 and 0 < r["activation_ratio_pred"] <= 1.0 + 1e-9
        if r["mode"] == "vanilla":
            assert r["time_ratio_pred"] == r["memory_ratio_pred"] == 1.0
    fixed = {r["mode"]: r for r in rows if r["lengths"] == "512"}
    assert fixed["all"]["time_ratio_pred"] < fixed["branch"]["time_ratio_pred"] < 1.0
    with pytest.raises(ValueError, match="unknown real shape"):
        predict_real_shapes(["GPT-5"])
    with pytest.raises(ValueError, match="length setting"):
        predict_real_shapes(["Qwen2.5-0.5B"], ["4k"])
