"""A token's two terms: the target logit as one row of the head (bias and logit transform included, gradient to
the hidden states and the head), the log-sum-exp of both scorers (the chunked one recomputed in backward), the
terms' weighting in the estimate, and the heads refused.

Tolerance: float32 against float32 (``atol=1e-5``), except where stated."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.step.estimate import split_terms
from lit_prunedpo.head import OutputHead, Scale, SoftCap
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import BothBranches, ExactTargetLogits, SharedFractionPrefix, StratifiedPositions
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.testing import synthetic_batch
from lit_prunedpo.token_terms import TokenTerms, fused_linear_head, linear_head_parts, log_sum_exp, target_logits


def head_and_inputs(bias: bool, transform, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(16, 40, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 16, generator=g))
        if bias:
            linear.bias.copy_(torch.randn(40, generator=g))
    hidden = torch.randn(9, 16, generator=g).requires_grad_()
    return OutputHead(linear, transform), hidden, torch.randint(40, (9,), generator=g)


@pytest.mark.parametrize("transform", [None, Scale(0.5), SoftCap(3.0)], ids=repr)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_target_logit_is_the_heads_row_and_so_is_its_gradient(bias, transform):
    head, hidden, targets = head_and_inputs(bias, transform)
    params = [hidden, *head.linear.parameters()]
    expected = head(hidden).gather(-1, targets[:, None]).squeeze(-1)
    got = target_logits(head.linear, head.transform, hidden, targets)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    u = torch.randn(9)
    for a, b in zip(torch.autograd.grad((u * got).sum(), params), torch.autograd.grad((u * expected).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("scorer", [TokenScorer(), ChunkedScorer(chunk_size=2)], ids=["plain", "chunked"])
@pytest.mark.parametrize("transform", [None, SoftCap(3.0)], ids=repr)
def test_both_scorers_log_sum_exp_and_gradient(scorer, transform):
    head, hidden, targets = head_and_inputs(True, transform, seed=1)
    params = [hidden, *head.linear.parameters()]
    expected = head(hidden).float().logsumexp(-1)
    got = scorer.log_sum_exp(head, hidden, targets)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    u = torch.randn(9)
    for a, b in zip(torch.autograd.grad((u * got).sum(), params), torch.autograd.grad((u * expected).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    stats = []
    with torch.no_grad():
        scorer.log_sum_exp(head, hidden, targets, stats)
    assert torch.cat(stats).shape == (9, 3)


def test_split_terms_weighs_the_target_everywhere_and_the_drawn_log_sum_exps_apart():
    batch = synthetic_batch(torch.tensor([[5, 3], [4, 6]]))
    plan = plan_step(batch, SharedFractionPrefix(0.5), ExactTargetLogits(StratifiedPositions(0.5)), BothBranches(),
                     torch.Generator().manual_seed(0))
    (group,) = plan.groups
    K, drawn = group.num_scored, group.lse_index
    target, lse, baseline = torch.randn(K), torch.randn(drawn.numel()), torch.randn(K)
    got = split_terms(group, TokenTerms(target, lse), baseline)
    expected = (target - baseline) * group.weight.float()
    expected[drawn] -= (lse - baseline[drawn]) * group.lse_weight[drawn].float()
    torch.testing.assert_close(got, expected)
    assert bool((group.lse_weight[drawn] > 0).all()) and int((group.lse_weight > 0).sum()) == drawn.numel()


def test_token_terms_split_detach_and_append():
    terms = TokenTerms(torch.arange(5.0, requires_grad=True), torch.tensor([10.0, 11.0]))
    first, second = terms.split([3, 2], [1, 1])
    assert first.target.tolist() == [0, 1, 2] and second.lse.tolist() == [11.0]
    assert not terms.detach().target.requires_grad
    assert terms.with_appended([torch.zeros(0)]).target.numel() == 5
    torch.testing.assert_close(terms.log_probs(torch.tensor([1, 4])), torch.tensor([-9.0, -7.0]))


class WeightNormed(nn.Linear):
    """A head module whose forward transforms its weight: the weight alone is not the head."""

    def forward(self, x):
        return nn.functional.linear(x, self.weight / self.weight.norm(dim=1, keepdim=True))


def test_a_head_module_that_transforms_its_weight_is_refused_naming_the_model():
    model = nn.Module()
    assert linear_head_parts(WeightNormed(4, 8)) is None and linear_head_parts(nn.Linear(4, 8)) is not None
    with pytest.raises(ValueError, match=re.escape(
            "Module: ExactTargetLogits and ReferenceLogSumExp compute each target's logit as one row of the LM head "
            "(h . W[y] + b, then the model's element-wise logit transform), but its head is a WeightNormed, not a "
            "plain nn.Linear (its forward may transform the weight); computing its full logits")):
        fused_linear_head(model, OutputHead(WeightNormed(4, 8)))


@pytest.mark.parametrize("scale", [0.01, 3.0, 300.0])
def test_log_sum_exp_equals_torchs_in_value_and_gradient(scale):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(7, 50, generator=g, dtype=torch.float64) * scale).requires_grad_()
    logits.data[2, 5:] = float("-inf")  # a row with masked entries (a padded vocabulary)
    weights = torch.randn(7, generator=g, dtype=torch.float64)
    ours, theirs = log_sum_exp(logits), logits.logsumexp(-1)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    (ours_grad,), (theirs_grad,) = (torch.autograd.grad(y, logits, weights) for y in (ours, theirs))
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(log_sum_exp, (logits[:, :6].detach().clone().requires_grad_(),))
