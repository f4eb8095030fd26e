"""``ChunkedScorer`` against the plain ``TokenScorer``: same loss and gradients through a full PrunedDPO step,
less peak memory on a big vocabulary.

Tolerances: float32 models, values and gradients compared with ``atol=1e-5, rtol=1e-4`` (the chunked
log-softmax is ``logit - logsumexp`` per chunk, the plain one ``log_softmax``: equal up to float rounding).
"""

from __future__ import annotations

import gc

import pytest
import torch
from helpers import TINY_LLAMA, config_args, make_batch
from lit_prunedpo.callbacks import _memory
from torch import nn

from lit_prunedpo import PrunedDPO
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.models import FromConfig
from lit_prunedpo.modes import load_mode
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.scoring import TokenScorer

TOL = dict(atol=1e-5, rtol=1e-4)
MODES = {name: load_mode(name).samplers for name in ("vanilla", "all")}


def _module(tied: bool, scorer) -> PrunedDPO:
    config = dict(TINY_LLAMA, tie_word_embeddings=tied)
    module = PrunedDPO(policy=FromConfig("llama", config, seed=0), beta=0.1, scorer=scorer)
    with torch.no_grad():  # policy != reference, so margins and gradients are not trivial
        g = torch.Generator().manual_seed(7)
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return module


def _step(module: PrunedDPO, batch, samplers, seed: int):
    plan = plan_step(batch, *samplers, torch.Generator().manual_seed(seed))
    est = module.execute_and_estimate(batch, plan)
    est.objective.backward()
    grads = {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}
    return est, grads


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("chunk_size", [1, 7, 10_000])
def test_full_step_matches_plain_scorer(tied, mode, chunk_size):
    batch = make_batch([3, 1, 4, 2], [5, 2, 7, 9], [4, 6, 1, 8])
    plain = _module(tied, TokenScorer())
    chunked = _module(tied, ChunkedScorer(chunk_size=chunk_size))
    if tied:
        assert chunked.policy.get_output_embeddings().weight is chunked.policy.get_input_embeddings().weight
    for seed in range(3):
        plain.policy.zero_grad(set_to_none=True)
        chunked.policy.zero_grad(set_to_none=True)
        est_p, grads_p = _step(plain, batch, MODES[mode], seed)
        est_c, grads_c = _step(chunked, batch, MODES[mode], seed)
        torch.testing.assert_close(est_c.objective, est_p.objective, **TOL)
        torch.testing.assert_close(est_c.policy_logps, est_p.policy_logps, **TOL)
        assert grads_c.keys() == grads_p.keys()
        head_name = next(n for n,
                         p in chunked.policy.named_parameters() if p is chunked.policy.get_output_embeddings().weight)
        assert head_name in grads_c  # the (shared, when tied) head weight gets its gradient
        for name in grads_p:
            torch.testing.assert_close(grads_c[name], grads_p[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("bias", [False, True])
def test_head_gradients_with_bias_and_fallback(bias):
    g = torch.Generator().manual_seed(0)
    head = nn.Linear(16, 50, bias=bias)
    hidden = torch.randn(13, 16, generator=g)
    targets = torch.randint(0, 50, (13,), generator=g)
    weights = torch.randn(13, generator=g)

    def run(scorer, module):
        module.zero_grad(set_to_none=True)
        h = hidden.clone().requires_grad_()
        out = scorer.log_probs(module, h, targets)
        (out * weights).sum().backward()
        return out.detach(), h.grad, [p.grad for p in module.parameters()]

    expected = run(TokenScorer(), head)
    for scorer, module in ((ChunkedScorer(4), head), (ChunkedScorer(4), nn.Sequential(nn.Identity(), head))):
        got = run(scorer, module)  # nn.Sequential is not an nn.Linear: the checkpoint fallback
        torch.testing.assert_close(got[0], expected[0], **TOL)
        torch.testing.assert_close(got[1], expected[1], **TOL)
        for a, b in zip(got[2], expected[2], strict=True):
            torch.testing.assert_close(a, b, **TOL)


def test_no_grad_and_empty():
    head = nn.Linear(8, 20)
    hidden, targets = torch.randn(5, 8), torch.randint(0, 20, (5,))
    with torch.no_grad():
        torch.testing.assert_close(ChunkedScorer(2).log_probs(head, hidden, targets),
                                   TokenScorer().log_probs(head, hidden, targets))
    assert ChunkedScorer(2).log_probs(head, hidden[:0], targets[:0]).shape == (0,)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_rejects_bad_chunk_size(bad):
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkedScorer(chunk_size=bad)


def _peak_step_bytes(scorer, head, hidden, targets) -> int:
    """Peak RSS above the starting RSS while scoring and back-propagating ``K`` positions."""
    gc.collect()
    h = hidden.clone().requires_grad_()
    _memory.reset_peak_rss()
    before = _memory.read_rss_bytes()
    scorer.log_probs(head, h, targets).sum().backward()
    peak = _memory.read_peak_rss_bytes()
    head.zero_grad(set_to_none=True)
    return peak - before


@pytest.mark.skipif(_memory.cpu_peak_rss_status() != "resettable",
                    reason="needs a resettable peak RSS (Linux clear_refs)")
def test_chunked_head_lowers_peak_memory():
    V, K, d = 32_000, 2048, 64
    g = torch.Generator().manual_seed(0)
    head = nn.Linear(d, V, bias=False)
    hidden, targets = torch.randn(K, d, generator=g), torch.randint(0, V, (K,), generator=g)
    logits_bytes = K * V * 4  # 262 MB: the plain scorer holds at least two such tensors at once
    plain = min(_peak_step_bytes(TokenScorer(), head, hidden, targets) for _ in range(2))
    # 64-row chunks hold ~8 MB of logits each. The RSS probe sees the allocator's reuse as well, so a chunked
    # peak varies from run to run (0-25 MiB here, 30-190 MiB with 256-row chunks); the bound leaves a wide margin.
    chunked = min(_peak_step_bytes(ChunkedScorer(64), head, hidden, targets) for _ in range(2))
    assert plain > 1.5 * logits_bytes, (plain, logits_bytes)
    assert chunked < plain / 4, f"chunked peak {chunked / 2**20:.0f} MiB vs plain {plain / 2**20:.0f} MiB"


@pytest.mark.parametrize("mode", MODES)
def test_selectable_by_config_for_every_mode(mode, tmp_path):
    from lit_prunedpo.cli import build_cli

    scorer = '{"class_path": "lit_prunedpo.chunked_scorer.ChunkedScorer", "init_args": {"chunk_size": 256}}'
    cli = build_cli(
        [*config_args(mode), f"--trainer.default_root_dir={tmp_path}", f"--model.scorer={scorer}"],
        run=False,
    )
    assert isinstance(cli.model.scorer, ChunkedScorer) and cli.model.scorer.chunk_size == 256


def test_fit_with_chunked_scorer(tmp_path):
    from lit_prunedpo.cli import build_cli

    build_cli([
        "fit", *config_args("all"), f"--trainer.default_root_dir={tmp_path}",
        "--model.scorer=lit_prunedpo.chunked_scorer.ChunkedScorer", "--model.scorer.init_args.chunk_size=7",
        "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--data.init_args.max_rows=80", "--data.init_args.val_fraction=0.2",
    ])
    assert any(tmp_path.rglob("*.ckpt"))


def test_default_chunk_is_sized_from_each_forward():
    scorer = ChunkedScorer(num_chunks=4)
    assert scorer.chunk_size is None
    assert [scorer.rows_per_chunk(k) for k in (1, 4, 10, 400)] == [1, 1, 3, 100]
    with pytest.raises(ValueError, match="num_chunks"):
        ChunkedScorer(num_chunks=0)


def test_default_chunks_match_plain_scorer():
    batch = make_batch([3, 1, 4], [5, 2, 7], [4, 6, 1])
    results = []
    for scorer in (TokenScorer(), ChunkedScorer()):
        module = _module(False, scorer)
        est = module.execute_and_estimate(batch, plan_step(batch, *MODES["vanilla"], generator=torch.Generator()))
        est.objective.backward()
        results.append((est.objective.detach(), torch.cat([p.grad.flatten() for p in module.policy.parameters()])))
    torch.testing.assert_close(results[1][0], results[0][0], **TOL)
    torch.testing.assert_close(results[1][1], results[0][1], **TOL)


def test_a_chunk_covering_the_whole_forward_is_reported_once(recwarn):
    scorer = ChunkedScorer(chunk_size=1024)
    head = nn.Linear(8, 16)
    for _ in range(2):
        scorer.log_probs(head, torch.randn(5, 8, requires_grad=True), torch.zeros(5, dtype=torch.long)).sum().backward()
    assert sum("in one chunk" in str(w.message) for w in recwarn) == 1
