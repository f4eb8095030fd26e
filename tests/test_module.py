"""The pruned DPO step against hand-written DPO, exactly: vanilla equality, branch enumeration, and
unbiasedness of prefix and position pruning by enumerating every draw of a short batch.

Tolerances: float32 models, so values and gradients are compared with ``atol=1e-5, rtol=1e-4``.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from lit_prunedpo import PrunedDPO
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import (
    AllPositions,
    AntitheticBranch,
    BernoulliPositions,
    BothBranches,
    BranchSampler,
    FullPrefix,
    RandomBranch,
    SharedFractionPrefix,
)

from helpers import ForcedPositions, ForcedPrefix, make_batch

TOL = dict(atol=1e-5, rtol=1e-4)
BETA = 0.1


def handwritten_logps(model, batch):
    """Sum of response-token log-probs, one unpadded sequence at a time, through the stock forward."""
    out = torch.zeros(batch.num_pairs, 2)
    rows = []
    for i in range(batch.num_pairs):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
        for b in range(2):
            resp = batch.response_ids[i, b][batch.response_mask[i, b]]
            ids = torch.cat([prompt, resp])[None]
            logits = model(input_ids=ids).logits[0, :-1].float()
            logps = logits.log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            rows.append(logps[len(prompt) - 1 :].sum())
    return torch.stack(rows).view(batch.num_pairs, 2) + out


def handwritten_dpo(module, batch):
    policy = handwritten_logps(module.policy, batch)
    with torch.no_grad():
        reference = handwritten_logps(module.reference.models()[0], batch)
    margin = (policy[:, 0] - reference[:, 0]) - (policy[:, 1] - reference[:, 1])
    return -F.logsigmoid(BETA * margin).mean()


def grads(module):
    return torch.cat([p.grad.flatten() for p in module.policy.parameters()])


def perturbed(tiny_source):
    """A module whose policy differs from its reference, so margins and gradients are not trivial."""
    module = PrunedDPO(policy=tiny_source, beta=BETA)
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in module.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return module


def step_objective(module, batch, prefix, position, branch, generator=None):
    plan = plan_step(batch, prefix, position, branch, generator or torch.Generator().manual_seed(0))
    return module.execute_and_estimate(batch, plan), plan


def test_vanilla_equals_handwritten_dpo(tiny_source, small_batch):
    module = perturbed(tiny_source)
    expected = handwritten_dpo(module, small_batch)
    expected.backward()
    want = grads(module)
    module.policy.zero_grad()

    est, plan = step_objective(module, small_batch, FullPrefix(), AllPositions(), BothBranches())
    assert len(plan.groups) == 1 and plan.groups[0].num_rows == 2 * small_batch.num_pairs  # concatenated
    est.objective.backward()
    torch.testing.assert_close(est.objective.detach(), expected.detach(), **TOL)
    torch.testing.assert_close(grads(module), want, **TOL)


class ForcedBranch(BranchSampler):
    """Draws a fixed mask but reports another sampler's probabilities (to enumerate its support)."""

    def __init__(self, mask, like):
        self.mask, self.like = mask, like

    def probabilities(self, num_pairs):
        return self.like.probabilities(num_pairs)

    def draw(self, num_pairs, generator):
        return self.mask


@pytest.mark.parametrize("branch", [RandomBranch(0.3), AntitheticBranch()], ids=["random0.3", "antithetic-branch"])
def test_branch_pruning_expected_gradient_is_exact_dpo_gradient(tiny_source, small_batch, branch):
    module = perturbed(tiny_source)
    handwritten_dpo(module, small_batch).backward()
    want = grads(module)

    expected = torch.zeros_like(want)
    total = 0.0
    for mask, prob in branch.support(small_batch.num_pairs):
        module.policy.zero_grad()
        est, plan = step_objective(module, small_batch, FullPrefix(), AllPositions(), ForcedBranch(mask, branch))
        assert plan.branches_backpropagated == small_batch.num_pairs
        est.objective.backward()
        expected += prob * grads(module)
        total += prob
    assert total == pytest.approx(1.0)
    torch.testing.assert_close(expected, want, **TOL)




def test_prefix_and_position_pruning_unbiased_by_enumeration(tiny_source):
    """One pair whose responses both have 3 tokens: the shared cut gives L_w = L_l = L with the pmf, and
    Bernoulli positions are enumerated for each L. E[R_hat] and E[grad R_hat] must equal the exact ones."""
    module = perturbed(tiny_source)
    batch = make_batch([2], [3], [3], seed=3)
    prefix, position = SharedFractionPrefix(0.4), BernoulliPositions(0.5, min_expected=0.0)
    T = 3

    exact = handwritten_logps(module.policy, batch)  # [1, 2]
    exact_grads = []
    for b in range(2):
        module.policy.zero_grad()
        handwritten_logps(module.policy, batch)[0, b].backward()
        exact_grads.append(grads(module))

    pmf = prefix.pmf(torch.tensor([T]), T)[0]
    mean_value = torch.zeros(2)
    mean_grads = [torch.zeros_like(exact_grads[0]) for _ in range(2)]
    for L in range(1, T + 1):
        if pmf[L - 1] == 0:
            continue
        supports = list(position.support(L))
        for (mw, pw), (ml, pl) in itertools.product(supports, supports):
            prob = float(pmf[L - 1]) * pw * pl
            mask = torch.zeros(2, T, dtype=torch.bool)
            mask[0, :L], mask[1, :L] = mw, ml
            est, _ = step_objective(
                module, batch, ForcedPrefix(torch.tensor([L, L]), prefix), ForcedPositions(mask, position),
                BothBranches()
            )
            mean_value += prob * est.policy_logps[0].detach()
            for b in range(2):
                module.policy.zero_grad()
                est.policy_logps[0, b].backward(retain_graph=b == 0)
                mean_grads[b] += prob * grads(module)
    torch.testing.assert_close(mean_value, exact[0].detach(), **TOL)
    for b in range(2):
        torch.testing.assert_close(mean_grads[b], exact_grads[b], **TOL)


def test_monte_carlo_all_pruning_matches_exact_log_ratio(tiny_source):
    """All three samplers on a longer batch: the Monte Carlo mean of R_hat is within 5 standard errors."""
    module = perturbed(tiny_source)
    batch = make_batch([3, 2], [9, 5], [4, 8], seed=5)
    with torch.no_grad():
        exact = handwritten_logps(module.policy, batch)
        g = torch.Generator().manual_seed(0)
        draws = torch.stack([
            step_objective(module, batch, SharedFractionPrefix(0.5), BernoulliPositions(0.4, 1.0), AntitheticBranch(),
                           g)[0].policy_logps
            for _ in range(600)
        ])
    stderr = draws.std(0) / 600**0.5
    assert bool(((draws.mean(0) - exact).abs() <= 5 * stderr + 1e-6).all()), (draws.mean(0), exact, stderr)


def test_validation_is_exact_whatever_the_samplers(tiny_source):
    """Trainer.validate gives identical val/ metrics for a heavily pruned module and a vanilla one."""
    import lightning as L

    from lit_prunedpo.data import SyntheticPreferenceData

    results = []
    for samplers in ({}, dict(prefix_sampler=SharedFractionPrefix(0.3), position_sampler=BernoulliPositions(0.2),
                              branch_sampler=RandomBranch())):
        module = PrunedDPO(policy=tiny_source, beta=BETA, **samplers)
        data = SyntheticPreferenceData(vocab_size=32, num_train=16, num_val=24, batch_size=8)
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
        results.append(trainer.validate(module, datamodule=data, verbose=False)[0])
    assert set(results[0]) >= {"val/loss", "val/rewards/accuracies", "val/logps/chosen"}
    assert results[0] == results[1]
