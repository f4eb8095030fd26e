"""Every loss against TRL 1.16.0's formula on the same per-token log-probs: value and gradient, float64.

TRL is not a dependency: its formulas are transcribed below, each with the file and lines it comes from
(``pip download --no-deps "trl==1.16.0"``; ``dpo_trainer.py`` is ``trl/trainer/dpo_trainer.py``, method
``_compute_loss``). Our side runs the real step path: ``plan_step`` (no pruning) -> per-group log-probs gathered
from the same token grid -> ``estimate``; the objective's value and its gradient w.r.t. the per-token policy
log-probs must equal TRL's loss and its gradient.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lit_prunedpo.step.estimate import estimate
from lit_prunedpo.metrics import pair_metrics
from lit_prunedpo.losses import (
    ApoDownLoss, ApoZeroLoss, BcoPairLoss, DiscoPopLoss, ExoPairLoss, HingeLoss, IPOLoss, LengthNormalized,
    NcaPairLoss, OddsRatioLoss, RobustLoss, SftLoss, SigmoidLoss, SigmoidNormLoss, SimPOLoss, SppoHardLoss,
    TRL_LOSS_TYPES, TRLLoss, WeightedLoss, trl_loss,
)
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import AllPositions, BothBranches, FullPrefix
from lit_prunedpo.testing import synthetic_batch

B, T, BETA, EPS, TAU, GAMMA = 5, 9, 0.3, 0.1, 0.05, 0.5


def trl_dpo(loss_type: str, logps, ref_logps, completion_mask, beta=BETA, label_smoothing=EPS, tau=TAU):
    """TRL's per-sequence loss for one ``loss_type``; rows are ``[chosen..., rejected...]`` as in TRL."""
    chosen_logps, rejected_logps = logps.sum(1).chunk(2)  # 1313, 1326
    ref_chosen_logps, ref_rejected_logps = ref_logps.sum(1).chunk(2)
    chosen_logratios = chosen_logps - ref_chosen_logps  # 1356-1357
    rejected_logratios = rejected_logps - ref_rejected_logps
    chosen_scores, rejected_scores = chosen_logratios, rejected_logratios  # 1360-1361 (reverse_kl)
    delta_score = chosen_scores - rejected_scores  # 1383
    if loss_type == "sigmoid":  # 1388
        return -F.logsigmoid(beta * delta_score)
    if loss_type == "hinge":  # 1391
        return torch.relu(1 - beta * delta_score)
    if loss_type == "ipo":  # 1399-1404
        chosen_mask, rejected_mask = completion_mask.chunk(2, dim=0)
        chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)
        rejected_avg_score = rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
        ipo_delta = chosen_avg_score - rejected_avg_score
        return (ipo_delta - 1 / (2 * beta)) ** 2
    if loss_type == "exo_pair":  # 1409-1417
        epsilon = torch.tensor(label_smoothing, dtype=torch.float64)
        qw = torch.sigmoid(beta * delta_score)
        log_qw = F.logsigmoid(beta * delta_score)
        log_pw = torch.log1p(-epsilon)
        ql = torch.sigmoid(-beta * delta_score)
        log_ql = F.logsigmoid(-beta * delta_score)
        log_pl = torch.log(epsilon)
        return qw * (log_qw - log_pw) + ql * (log_ql - log_pl)
    if loss_type == "nca_pair":  # 1420-1426
        chosen_rewards, rejected_rewards = beta * chosen_logratios, beta * rejected_logratios
        return (-F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards) - 0.5
                * F.logsigmoid(-rejected_rewards))
    if loss_type == "robust":  # 1429-1431
        clean_loss_term = -(1 - label_smoothing) * F.logsigmoid(beta * delta_score)
        flipped_loss_term = -label_smoothing * F.logsigmoid(-beta * delta_score)
        return (clean_loss_term - flipped_loss_term) / (1 - 2 * label_smoothing)
    if loss_type == "bco_pair":  # 1434-1436
        chosen_rewards, rejected_rewards = beta * chosen_logratios, beta * rejected_logratios
        return -F.logsigmoid(chosen_rewards) - F.logsigmoid(-rejected_rewards)
    if loss_type == "sppo_hard":  # 1443-1445
        return (chosen_logratios - 0.5 / beta) ** 2 + (rejected_logratios + 0.5 / beta) ** 2
    if loss_type == "apo_zero":  # 1470-1473
        return 1 - torch.sigmoid(beta * chosen_logratios) + torch.sigmoid(beta * rejected_logratios)
    if loss_type == "apo_down":  # 1478-1481
        return (torch.sigmoid(beta * chosen_logratios) + 1
                - torch.sigmoid(beta * (chosen_logratios - rejected_logratios)))
    if loss_type == "discopop":  # 1485-1493
        logits = delta_score * beta
        log_ratio_modulation = torch.sigmoid(logits / tau)
        return -F.logsigmoid(logits) * (1 - log_ratio_modulation) + torch.exp(-logits) * log_ratio_modulation
    if loss_type == "sft":  # 1496-1502 (shift_completion_mask: our masks already index response tokens)
        chosen_mask, _ = completion_mask.chunk(2, dim=0)
        chosen_per_token_logps, _ = logps.chunk(2, dim=0)
        batch_loss = -chosen_per_token_logps[chosen_mask.bool()].mean()
        return batch_loss.expand(chosen_per_token_logps.size(0))
    if loss_type == "sigmoid_norm":  # 1505-1509
        chosen_mask, rejected_mask = completion_mask.chunk(2, dim=0)
        chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)
        rejected_avg_score = rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
        return -F.logsigmoid(beta * (chosen_avg_score - rejected_avg_score))
    raise AssertionError(loss_type)


def trl_simpo(logps, ref_logps, completion_mask, beta=BETA, gamma=GAMMA, label_smoothing=EPS):
    """``trl/experimental/cpo/cpo_trainer.py``: log-probs averaged per token (850), logits (709), simpo (715-722)."""
    avg = logps.sum(1) / completion_mask.sum(1)
    policy_chosen_logps, policy_rejected_logps = avg.chunk(2)
    logits = policy_chosen_logps - policy_rejected_logps
    logits = logits - gamma / beta
    return -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing


def trl_odds_ratio(logps, ref_logps, completion_mask, beta=BETA):
    """``trl/experimental/orpo/orpo_trainer.py``: averaged log-probs (805), log1mexp (87-91), odds ratio (693-697);
    the loss subtracts ``losses.mean()`` (848), so the per-pair term is ``-beta * ratio``."""
    def log1mexp(x):
        t = -0.6931471805599453
        return torch.where(x < t, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))

    avg = logps.sum(1) / completion_mask.sum(1)
    policy_chosen_logps, policy_rejected_logps = avg.chunk(2)
    log_odds = (policy_chosen_logps - policy_rejected_logps) - (log1mexp(policy_chosen_logps)
                                                                - log1mexp(policy_rejected_logps))
    return -(beta * F.logsigmoid(log_odds))


CASES = [
    ("sigmoid", SigmoidLoss(), lambda *a: trl_dpo("sigmoid", *a)),
    ("hinge", HingeLoss(), lambda *a: trl_dpo("hinge", *a)),
    ("ipo", LengthNormalized(IPOLoss()), lambda *a: trl_dpo("ipo", *a)),
    ("exo_pair", ExoPairLoss(EPS), lambda *a: trl_dpo("exo_pair", *a)),
    ("nca_pair", NcaPairLoss(), lambda *a: trl_dpo("nca_pair", *a)),
    ("robust", RobustLoss(EPS), lambda *a: trl_dpo("robust", *a)),
    ("bco_pair", BcoPairLoss(), lambda *a: trl_dpo("bco_pair", *a)),
    ("sppo_hard", SppoHardLoss(), lambda *a: trl_dpo("sppo_hard", *a)),
    ("apo_zero", ApoZeroLoss(), lambda *a: trl_dpo("apo_zero", *a)),
    ("apo_down", ApoDownLoss(), lambda *a: trl_dpo("apo_down", *a)),
    ("discopop", DiscoPopLoss(TAU), lambda *a: trl_dpo("discopop", *a)),
    ("sft", SftLoss(), lambda *a: trl_dpo("sft", *a)),
    ("sigmoid_norm", SigmoidNormLoss(), lambda *a: trl_dpo("sigmoid_norm", *a)),
    # loss_type=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0]: TRL's MPO example (dpo_config.py)
    ("mpo", WeightedLoss([SigmoidLoss(), BcoPairLoss(), SftLoss()], [0.8, 0.2, 1.0]),
     lambda *a: 0.8 * trl_dpo("sigmoid", *a) + 0.2 * trl_dpo("bco_pair", *a) + 1.0 * trl_dpo("sft", *a)),
    ("simpo", SimPOLoss(GAMMA, EPS), trl_simpo),
    ("orpo_odds_ratio", OddsRatioLoss(), trl_odds_ratio),
]
# TRL's names, as a TRL user gives them (--model.loss ipo, TRLLoss(loss_type=..., label_smoothing=...)): the same
# formulas through the translation (label_smoothing where TRL 1.16 uses it: robust and exo_pair; its sigmoid ignores
# it, cDPO's is tested above; the others refuse it, tests/losses/test_trl_names.py)
CASES += [(f"name:{name}", trl_loss(name, label_smoothing=EPS if name in ("robust", "exo_pair") else 0.0,
                                    discopop_tau=TAU),
           lambda *a, name=name: trl_dpo(name, *a)) for name in TRL_LOSS_TYPES if not name.startswith("aot")]
CASES += [("name:mpo", TRLLoss(["sigmoid", "bco_pair", "sft"], [0.8, 0.2, 1.0]),
           lambda *a: 0.8 * trl_dpo("sigmoid", *a) + 0.2 * trl_dpo("bco_pair", *a) + 1.0 * trl_dpo("sft", *a)),
          ("name:robust-TRLLoss", TRLLoss("robust", label_smoothing=EPS), lambda *a: trl_dpo("robust", *a))]


def token_grid(seed):
    """Per-token log-probs ``[2B, T]`` in TRL's row order with a completion mask; both the policy's and the
    reference's, spread so that margins cover the losses' interesting ranges."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (2 * B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    policy = (-torch.rand(2 * B, T, generator=g, dtype=torch.float64) * 4 - 0.05) * mask
    reference = (-torch.rand(2 * B, T, generator=g, dtype=torch.float64) * 4 - 0.05) * mask
    return policy.requires_grad_(True), reference, mask, lengths


@pytest.mark.parametrize("name, loss, trl", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_value_and_gradient_equal_trls(name, loss, trl, seed):
    policy, reference, mask, lengths = token_grid(seed)
    # TRL's per-token log-probs are 0 past a completion's end (labels -100), whatever the logits there.
    expected = trl(policy * mask, reference, mask).mean()
    (expected_grad,) = torch.autograd.grad(expected, policy)

    # Our layout: pair i, branch b is TRL's row b * B + i.
    batch = synthetic_batch(torch.stack([lengths[:B], lengths[B:]], dim=1))
    plan = plan_step(batch, FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    rows = lambda g: g.branch[g.scored_row] * B + g.pair[g.scored_row]  # noqa: E731
    est = estimate(
        plan,
        [policy[rows(g), g.scored_t] for g in plan.groups],
        [reference[rows(g), g.scored_t] for g in plan.groups],
        loss, BETA, batch.response_lengths,
    )
    (grad,) = torch.autograd.grad(est.objective, policy)
    assert math.isfinite(float(expected.detach()))
    torch.testing.assert_close(est.objective, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


MEAN_REPORTING = ("simpo", "orpo_odds_ratio", "orpo")


def trl_reported(name, logps, ref_logps, completion_mask, beta=BETA):
    """``rewards/*`` and ``logps/*`` as TRL's trainer for the loss logs them (read at TRL 1.10):

    * ``DPOTrainer`` (``dpo_trainer.py``, the metric block of ``_compute_loss``): ``beta * chosen_logratios``
      of summed log-probs, and the summed log-probs;
    * ``CPOTrainer`` with ``loss_type="simpo"`` (``cpo_loss``: ``chosen_rewards = self.beta * policy_chosen_logps``)
      and ``ORPOTrainer`` (``odds_ratio_loss``, the same), whose ``policy_*_logps`` are per-token means
      (``get_batch_logps(..., average_log_prob=True)``); ``logps/*`` log those means.
    """
    if name in MEAN_REPORTING:
        chosen, rejected = (logps.sum(1) / completion_mask.sum(1)).chunk(2)
        chosen_rewards, rejected_rewards = beta * chosen, beta * rejected
    else:
        chosen, rejected = logps.sum(1).chunk(2)
        ref_chosen, ref_rejected = ref_logps.sum(1).chunk(2)
        chosen_rewards, rejected_rewards = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
    return {
        "rewards/chosen": chosen_rewards, "rewards/rejected": rejected_rewards,
        "rewards/margins": chosen_rewards - rejected_rewards,
        "rewards/accuracies": (chosen_rewards > rejected_rewards).double(),
        "logps/chosen": chosen, "logps/rejected": rejected,
    }


REPORTED = [(name, loss) for name, loss, _ in CASES] + [("orpo", WeightedLoss([SftLoss(), OddsRatioLoss()]))]


@pytest.mark.parametrize("name, loss", REPORTED, ids=[c[0] for c in REPORTED])
def test_reported_rewards_and_logps_equal_trls(name, loss):
    policy, reference, mask, lengths = token_grid(0)
    policy = policy.detach() * mask
    expected = trl_reported(name, policy, reference, mask)
    batch = synthetic_batch(torch.stack([lengths[:B], lengths[B:]], dim=1))
    plan = plan_step(batch, FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    rows = lambda g: g.branch[g.scored_row] * B + g.pair[g.scored_row]  # noqa: E731
    est = estimate(plan, [policy[rows(g), g.scored_t] for g in plan.groups],
                   [reference[rows(g), g.scored_t] for g in plan.groups], loss, BETA, batch.response_lengths)
    got = pair_metrics(est, BETA)
    for key, value in expected.items():
        torch.testing.assert_close(got[key].double(), value, rtol=1e-12, atol=1e-12, msg=key)
    if name in MEAN_REPORTING:  # where a mean and a sum disagree on the ranking, accuracy follows the mean
        sums = policy.sum(1).chunk(2)
        assert not torch.equal((sums[0] > sums[1]).double(), expected["rewards/accuracies"])
