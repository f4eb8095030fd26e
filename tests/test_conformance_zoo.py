"""Every causal-LM architecture transformers ships, built tiny: exact through every layout and scorer, or refused.

The independent implementation is the plain Hugging Face forward of each response alone, unpadded, in eval mode
(:func:`lit_prunedpo.conformance.plain_logps`); the batch here is not the set-up probe's (other prompt and
response lengths, a shared start, rows past the zoo's sliding window of 8). For each architecture:

* every layout, with the plain and the chunked scorer, either matches it to 1e-4 nats per token on the unpruned
  plan and on the branch-split plan (the no-grad rows reading the gradient forward's keys and values), or is
  refused: statically with a message naming the feature, or by the conformance check, which then falls back to
  a layout that matches;
* the default path (``PrunedDPO`` with nothing but the policy: automatic layout, training mode, dropout
  disabled by the module) gives the plain DPO loss and its gradient (1e-3 relative) and the exact validation
  metrics;
* an architecture that does not build tiny is listed as left out in docs/supported-models.md with the reason the
  build gives (tests/test_supported_models.py holds the rest of the table to the code).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
import torch.nn.functional as F

from helpers import Built
from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.conformance import AutoLayout, choose_layout, layout_error, plain_logps
from lit_prunedpo.layout import LeftPaddedLayout, RightPaddedLayout, SharedPromptLayout
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.supported_models import REGENERATE, generated_with, left_out_cell, parse, parse_left_out
from lit_prunedpo.zoo import UnbuildableError, build_tiny, causal_lm_types

TYPES = causal_lm_types()
TABLE = (Path(__file__).parents[1] / "docs" / "supported-models.md").read_text()
PUBLISHED = parse(TABLE)
LEFT_OUT = parse_left_out(TABLE)
#: The table speaks for the transformers it was generated with; another one may add or change architectures (one
#: test fails then: tests/test_supported_models.py; the ones here check the code alone).
SAME_TRANSFORMERS = generated_with(TABLE) == transformers.__version__
LAYOUTS = {"packed": SharedPromptLayout, "padded": LeftPaddedLayout, "right-padded": RightPaddedLayout}
SCORERS = {"plain": TokenScorer, "chunked": lambda: ChunkedScorer(num_chunks=3)}


def zoo_batch(vocab: int, seed: int = 7) -> PreferenceBatch:
    """Four pairs: prompts of 1, 5, 7 and 3 tokens; responses of 1 to 15 tokens, two sharing their first 2 or 4."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, 6, 1, 0), (5, 9, 12, 4), (7, 15, 13, 2), (3, 2, 8, 0)]  # prompt, chosen, rejected, shared start
    P, T = 7, 15
    prompt_ids, prompt_mask = torch.zeros(4, P, dtype=torch.long), torch.zeros(4, P, dtype=torch.bool)
    response_ids, response_mask = torch.zeros(4, 2, T, dtype=torch.long), torch.zeros(4, 2, T, dtype=torch.bool)
    for i, (p, chosen, rejected, shared) in enumerate(shapes):
        prompt_ids[i, P - p:] = torch.randint(1, vocab, (p,), generator=g)
        prompt_mask[i, P - p:] = True
        start = torch.randint(1, vocab, (shared,), generator=g)
        for b, n in enumerate((chosen, rejected)):
            rest = torch.randint(1, vocab, (n - shared,), generator=g)
            if b == 1 and n > shared:
                rest[0] = response_ids[i, 0, shared] % (vocab - 1) + 1
            response_ids[i, b, :n] = torch.cat([start, rest])
            response_mask[i, b, :n] = True
    return PreferenceBatch(prompt_ids, prompt_mask, response_ids, response_mask, torch.arange(4))


@pytest.fixture(scope="module")
def built():
    cache: dict[str, tuple] = {}

    def get(model_type: str):
        if model_type not in cache:
            try:
                model = build_tiny(model_type).eval()
            except UnbuildableError as err:  # transformers cannot build it tiny on a CPU: the table says why
                reason = left_out_cell(err.unbuildable.reason)
                if SAME_TRANSFORMERS:
                    assert LEFT_OUT.get(model_type) == reason, (
                        f"{model_type} does not build ({reason}); docs/supported-models.md says "
                        f"{LEFT_OUT.get(model_type) or 'it does'}: regenerate it with {REGENERATE}")
                return None
            batch = zoo_batch(min(model.get_input_embeddings().num_embeddings, 128))
            cache.clear()  # one architecture at a time in memory
            cache[model_type] = (model, batch, plain_logps(model, batch))
        return cache[model_type]

    return get


@pytest.mark.parametrize("model_type", TYPES)
def test_every_layout_and_scorer_is_exact_or_refused(model_type, built):
    if (got := built(model_type)) is None:
        return  # left out, with the reason the table gives (checked by the fixture)
    model, batch, expected = got
    for layout_name, make_layout in LAYOUTS.items():
        for scorer_name, make_scorer in SCORERS.items():
            layout, scorer = make_layout(), make_scorer()
            choice = choose_layout(layout, [model], scorer, dropout_check=False)
            where = f"{model_type}, {layout_name} layout, {scorer_name} scorer ({choice.line})"
            if choice.layout is not layout:  # refused: the line names the layout and why, the fallback is exact
                assert type(layout).__name__ in choice.line and "RightPaddedLayout" in choice.line, where
                with pytest.raises(ValueError, match=type(layout).__name__):
                    choose_layout(layout, [model], scorer, strict=True, dropout_check=False)
            error = layout_error(model, choice.layout, scorer, batch, expected)
            assert error <= 1e-4, f"{where}: off by {error:.3g} nats"


def plain_dpo_loss(policy, reference, batch: PreferenceBatch, beta: float) -> torch.Tensor:
    """DPO's sigmoid loss from the plain forward of each response alone (TRL's definition)."""
    def sums(model):
        out = []
        for i in range(batch.num_pairs):
            prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
            for b in range(2):
                response = batch.response_ids[i, b][batch.response_mask[i, b]]
                ids = torch.cat([prompt, response])[None]
                logps = model(input_ids=ids, use_cache=False).logits[0].float().log_softmax(-1)
                out.append(logps[len(prompt) - 1 : -1].gather(-1, response[:, None]).sum())
        return torch.stack(out).view(-1, 2)

    with torch.no_grad():
        ref = sums(reference)
    ratio = sums(policy) - ref
    return -F.logsigmoid(beta * (ratio[:, 0] - ratio[:, 1])).mean()


@pytest.mark.parametrize("model_type", TYPES)
def test_the_default_path_gives_the_dpo_loss_and_gradient(model_type, built):
    if (got := built(model_type)) is None:
        return  # left out, with the reason the table gives (checked by the fixture)
    model, batch, _ = got
    module = PrunedDPO(policy=Built(model))
    with torch.no_grad():  # move the policy off the reference so that the margin is not 0
        g = torch.Generator().manual_seed(1)
        for p in module.policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    module.train()
    out = module.step(batch)
    out.estimate.objective.backward()
    ours = {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}
    module.policy.zero_grad()
    policy = module.policy.eval()  # the plain forward in eval mode: no dropout, the model as it serves
    reference = module.reference.models()[0]
    loss = plain_dpo_loss(policy, reference, batch, module.beta)
    loss.backward()
    theirs = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    where = f"{model_type} ({module._layout_choice.line})"
    assert torch.allclose(out.estimate.objective.detach(), loss.detach(), atol=1e-5), where
    names = sorted(set(ours) | set(theirs))
    flat = lambda grads: torch.cat([grads.get(n, torch.zeros_like(dict(policy.named_parameters())[n])).flatten()  # noqa: E731
                                    for n in names])
    mine, plain = flat(ours), flat(theirs)
    assert float((mine - plain).norm()) <= 1e-3 * float(plain.norm()) + 1e-8, where
    exact = module.exact_pair_metrics(batch)
    assert torch.allclose(exact["loss"].mean(), loss.detach(), atol=1e-5), where
    published = PUBLISHED.get(model_type) if SAME_TRANSFORMERS else type(module.resolved_layout()).__name__
    assert published == type(module.resolved_layout()).__name__, (
        f"{where}: docs/supported-models.md says {published!r}; regenerate it: {REGENERATE}")


#: The 45 architectures a new user tried first (sdpa above; here the same through eager attention, whose packed
#: mask is additive).
FIRST_TRIED = (
    "llama mixtral qwen2 qwen2_moe qwen3 qwen3_moe gemma phi phi3 gpt2 gpt_neox olmo2 smollm3 stablelm falcon "
    "deepseek_v3 glm4 olmoe glm4_moe ernie4_5 hunyuan_v1_dense apertus gptj gemma2 cohere cohere2 granite granitemoe "
    "granitemoehybrid falcon_h1 mistral gemma3_text gpt_oss starcoder2 olmo3 exaone4 opt gpt_bigcode seed_oss phimoe "
    "bloom mpt qwen3_next lfm2 mamba"
).split()


def test_the_first_tried_are_all_in_the_zoo():
    assert len(FIRST_TRIED) == 45
    assert set(FIRST_TRIED) <= set(PUBLISHED), sorted(set(FIRST_TRIED) - set(PUBLISHED))


@pytest.mark.parametrize("model_type", FIRST_TRIED)
def test_eager_attention_is_exact_too(model_type):
    model = build_tiny(model_type, attn_implementation="eager").eval()
    batch = zoo_batch(min(model.get_input_embeddings().num_embeddings, 128))
    expected = plain_logps(model, batch)
    choice = choose_layout(AutoLayout(), [model], TokenScorer(), dropout_check=False)
    if SAME_TRANSFORMERS:
        assert type(choice.layout).__name__ == PUBLISHED[model_type], choice.line
    assert layout_error(model, choice.layout, TokenScorer(), batch, expected) <= 1e-4, choice.line


#: Packed architectures with sliding windows or logit transforms, where pruning changes what the packed blocks hold.
PACKED_WITH_FEATURES = ("mistral", "gemma2", "gemma3_text", "cohere2", "gpt_oss", "starcoder2", "granite", "exaone4")


@pytest.mark.parametrize("mode", ["all", "all-coupled", "sequence"])
@pytest.mark.parametrize("model_type", PACKED_WITH_FEATURES)
def test_pruned_plans_score_the_same_in_the_packed_and_the_exact_layout(model_type, mode):
    """Cut prefixes, sampled positions and a no-grad branch reading the gradient forward's keys and values: the
    packed layout scores what the right-padded one (exact for any causal LM) scores, in every group."""
    from lit_prunedpo.modes import load_mode

    model = build_tiny(model_type).eval()
    samplers = load_mode(mode)
    module = PrunedDPO(policy=Built(model), prefix_sampler=samplers.prefix_sampler,
                       position_sampler=samplers.position_sampler, branch_sampler=samplers.branch_sampler)
    assert isinstance(module.resolved_layout(), SharedPromptLayout), module._layout_choice.line
    batch = zoo_batch(min(model.get_input_embeddings().num_embeddings, 128))
    for seed in range(3):
        plan = module.plan(batch, generator=torch.Generator().manual_seed(seed))
        packed = module.execute(batch, plan)
        exact = module.execute(batch, plan, dataclasses.replace(module.parts, layout=RightPaddedLayout()))
        for ours, truth in zip(packed.policy + packed.reference, exact.policy + exact.reference):
            assert torch.allclose(ours, truth, atol=1e-4), (model_type, mode, seed, float((ours - truth).abs().max()))


@pytest.mark.parametrize("model_type", ["gemma3_text", "cohere2", "granite", "qwen3_next", "mamba", "roberta"])
def test_gradient_checkpointing_changes_nothing(model_type):
    model = build_tiny(model_type).eval()
    batch = zoo_batch(min(model.get_input_embeddings().num_embeddings, 128))
    grads = []
    for checkpointing in (False, True):
        module = PrunedDPO(policy=Built(model), gradient_checkpointing=checkpointing)
        module.train()
        module.step(batch).estimate.objective.backward()
        grads.append(torch.cat([p.grad.flatten() for p in module.policy.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
