"""The noise model's math on constructed cases with known variances, the prediction rule, and the measurement
through the real module: per-pair gradients that average to the batch gradient, and no extra variance for an
exact step."""

from __future__ import annotations

import math

import pytest
import torch

from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.noise import (
    agreement,
    between_variance,
    measure,
    pair,
    predict,
    squared_distance,
    within_variance,
    _gradient,
)
from lit_prunedpo_lab.study.runner import make_run
from lit_prunedpo_lab.study.tasks import QUICKSTART_MODEL, EditedTask

TINY = {**QUICKSTART_MODEL, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
        "num_key_value_heads": 1}


def test_between_variance_by_hand():
    # deviations from the mean (5, -1): (1,0), (-1,0), (0,2), (0,-2): squared norms 1+1+4+4 = 10, over n-1 = 3
    mu = torch.tensor([5.0, -1.0])
    g = mu + torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    assert between_variance(g) == pytest.approx(10 / 3)
    with pytest.raises(ValueError, match="n >= 2"):
        between_variance(g[:1])


def test_between_variance_is_unbiased_for_the_trace_of_the_covariance():
    # per-pair gradients with covariance diag(1, 4, 9): trace 14; mean of the estimate over many small batches
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    estimates = [between_variance(torch.randn(4, 3, generator=g,
                                              dtype=torch.float64) * scale + 7.0) for _ in range(20_000)]
    mean = sum(estimates) / len(estimates)
    se = math.sqrt(sum((e - mean) ** 2 for e in estimates) / len(estimates) / len(estimates))
    assert abs(mean - 14.0) < 5 * se


def test_within_variance_recovers_the_mean_per_pair_variance():
    # B = 4 pairs, each pruned estimate = exact + independent noise of variance (trace) s_i^2 = 1, 4, 0, 9:
    # E|g_hat - g_B|^2 = sum_i s_i^2 / B^2, so within = B * that = mean_i s_i^2 = 3.5
    g = torch.Generator().manual_seed(1)
    B, P = 4, 5
    exact_pairs = torch.randn(B, P, generator=g, dtype=torch.float64)
    exact = exact_pairs.mean(0)
    sigma = torch.tensor([1.0, 2.0, 0.0, 3.0], dtype=torch.float64) / math.sqrt(P)  # per coordinate
    distances = []
    for _ in range(20_000):
        noisy = exact_pairs + torch.randn(B, P, generator=g, dtype=torch.float64) * sigma[:, None]
        distances.append(squared_distance(noisy.mean(0), exact))
    within = within_variance(distances, B)
    se = B * math.sqrt(torch.tensor(distances).var().item() / len(distances))
    assert abs(within - 3.5) < 5 * se
    # exact by hand: two draws at distance^2 0.5 and 1.5 from the exact gradient, B = 2 -> 2 * 1.0
    assert within_variance([0.5, 1.5], 2) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least one draw"):
        within_variance([], 2)


def test_the_rule_is_the_variance_comparison_at_equal_cost():
    # total variance of a pruned step at batch B: (between + within) / B; vanilla at B / k: k * between / B
    between, B = 2.0, 12
    for within, k in ((1.0, 1.6), (1.4, 1.6), (0.0, 1.0), (5.0, 4.0), (7.0, 4.0)):
        pruned, vanilla = (between + within) / B, k * between / (B)
        expected = "prune better" if pruned < vanilla else "vanilla better"
        assert predict(between, within, k) == expected
    assert predict(2.0, 1.0, 1.5) == "vanilla better"  # equal variances: no gain, vanilla (strict rule)
    assert predict(2.0, 0.99, 1.5) == "prune better"
    assert predict(2.0, 0.0, 0.9) == "vanilla better"  # a pruned step that costs more never wins
    with pytest.raises(ValueError, match="k > 0"):
        predict(1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="variances >= 0"):
        predict(-1.0, 1.0, 2.0)
    assert agreement("prune better", "WIN") == "agrees"
    assert agreement("prune better", "LOSS") == "disagrees"
    assert agreement("vanilla better", "LOSS") == "agrees"
    assert agreement("vanilla better", "TIE") == "undecided (TIE)"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    task = EditedTask(name="tiny-noise", num_rows=64, batch_size=4, model=dict(TINY))
    dm = task.datamodule(tmp_path_factory.mktemp("noise-data"))
    run = make_run(task, Arm("vanilla", 4), 0, dm)
    return run, next(iter(run.loader))


def test_per_pair_gradients_average_to_the_batch_gradient(tiny_run):
    run, batch = tiny_run
    g = torch.Generator()
    per_pair = torch.stack([_gradient(run.module, pair(batch, i), "vanilla", g) for i in range(batch.num_pairs)])
    exact = _gradient(run.module, batch, "vanilla", g)
    torch.testing.assert_close(per_pair.mean(0), exact, rtol=1e-4, atol=1e-7)
    assert float(exact.norm()) > 0


def test_measure_on_the_real_step(tiny_run):
    run, batch = tiny_run
    report = measure(run.module, batch, ["vanilla", "branch", "position-coupled"], draws=3)
    assert set(report.within) == {"branch", "position-coupled"}  # vanilla is the reference, not a mode measured
    assert report.between > 0 and report.within["branch"] > 0 and report.within["position-coupled"] > 0
    # an exact step as the "pruned" one leaves no extra variance: the draws equal the exact gradient
    exact = _gradient(run.module, batch, "vanilla", torch.Generator())
    again = [squared_distance(_gradient(run.module, batch, "vanilla", torch.Generator()), exact) for _ in range(2)]
    assert within_variance(again, batch.num_pairs) < 1e-10 * report.grad_norm_sq + 1e-20
    with pytest.raises(ValueError, match="unknown modes"):
        measure(run.module, batch, ["nope"], draws=1)
