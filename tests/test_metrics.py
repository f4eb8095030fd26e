"""TRL's metric names, each against a direct computation: the token metrics (``logits/*``, ``entropy``,
``mean_token_accuracy``) against a stock forward of a tiny model, exact and position-pruned (IPW-weighted means
of the scored positions); ``num_tokens`` by counting; ``grad_norm`` against ``torch.nn.utils.clip_grad_norm_``
and ``learning_rate`` against the scheduler in a real fit through the CLI, with every name in ``metrics.csv``.
"""

from __future__ import annotations

import csv

import pytest
import torch
from lightning.pytorch import Callback
from torch import nn

from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import collate_pairs
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.cli import build_cli
from lit_prunedpo.metrics import TOKEN_METRICS, input_tokens, token_metrics, weighted_mean
from lit_prunedpo.step.plan import exact_plan, plan_step
from lit_prunedpo.samplers import BernoulliPositions, BothBranches, FullPrefix
from lit_prunedpo.scoring import TokenScorer, split_causal_lm, token_stats

from helpers import config_args, make_batch

TOL = dict(atol=1e-5, rtol=1e-4)


def perturbed(tiny_source, **kwargs):
    module = PrunedDPO(policy=tiny_source, **kwargs)
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in module.policy.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return module


def stock_logits(model, batch):
    """``{(pair, branch): [L, V] logits predicting each response token}`` and the targets, through the stock
    forward of one unpadded sequence at a time (what TRL's ``shift_logits`` hold at completion positions)."""
    out = {}
    with torch.no_grad():
        for i in range(batch.num_pairs):
            prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
            for b in range(2):
                resp = batch.response_ids[i, b][batch.response_mask[i, b]]
                ids = torch.cat([prompt, resp])[None]
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
                out[i, b] = (logits, resp)
    return out


def trl_token_metrics(logits):
    """TRL 1.10 ``dpo_trainer.py`` ``_compute_loss``, metric block: token-weighted means over completion tokens."""
    chosen = torch.cat([logits[k][0] for k in logits if k[1] == 0])
    rejected = torch.cat([logits[k][0] for k in logits if k[1] == 1])
    labels = torch.cat([logits[k][1] for k in logits if k[1] == 0])
    both = torch.cat([chosen, rejected])
    logp = both.log_softmax(-1)
    return {
        "logits/chosen": chosen.mean(-1).mean(),
        "logits/rejected": rejected.mean(-1).mean(),
        "entropy": -(logp.exp() * logp).sum(-1).mean(),
        "mean_token_accuracy": (chosen.argmax(-1) == labels).float().mean(),
    }


def with_greedy_chosen(model, batch, pair=0, length=4):
    """``batch`` with pair ``pair``'s chosen response replaced by the model's greedy continuation, so that the
    token accuracy is neither 0 nor 1."""
    examples = []
    for i in range(batch.num_pairs):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]].tolist()
        responses = [batch.response_ids[i, b][batch.response_mask[i, b]].tolist() for b in range(2)]
        if i == pair:
            ids = list(prompt)
            with torch.no_grad():
                for _ in range(length):
                    ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            responses[0] = ids[len(prompt):]
        examples.append({"prompt_ids": prompt, "chosen_ids": responses[0], "rejected_ids": responses[1], "index": i})
    return collate_pairs(examples, pad_id=0)


@pytest.mark.parametrize("shared_prompt", [True, False])
@pytest.mark.parametrize("scorer", [TokenScorer(), ChunkedScorer(chunk_size=3)], ids=["token", "chunked"])
def test_unpruned_token_metrics_equal_trls_on_a_stock_forward(tiny_source, small_batch, shared_prompt, scorer):
    module = perturbed(tiny_source, shared_prompt=shared_prompt, scorer=scorer)
    batch = with_greedy_chosen(module.policy, small_batch)
    plan = exact_plan(batch)
    logps = module.execute(batch, plan, token_stats=True)
    got = {k: weighted_mean(v, w) for k, (v, w) in token_metrics(plan, logps.policy_token_stats, 3).items()}
    want = trl_token_metrics(stock_logits(module.policy, batch))
    assert set(got) == set(TOKEN_METRICS)
    for name in TOKEN_METRICS:
        torch.testing.assert_close(got[name], want[name], **TOL, msg=name)
    assert 0 < float(got["mean_token_accuracy"]) < 1  # a case where the metric can be wrong


def test_position_pruned_token_metrics_are_ipw_weighted_means_of_the_scored_positions(tiny_source):
    batch = make_batch([3, 2], [9, 6], [7, 8])
    module = perturbed(tiny_source, shared_prompt=False)
    plan = plan_step(batch, FullPrefix(), BernoulliPositions(rate=0.3, min_expected=3), BothBranches(),
                     torch.Generator().manual_seed(1))
    logps = module.execute(batch, plan, token_stats=True)
    got = {k: weighted_mean(v, w) for k, (v, w) in token_metrics(plan, logps.policy_token_stats, 2).items()}
    stock = stock_logits(module.policy, batch)
    num = {name: 0.0 for name in TOKEN_METRICS}
    den = {name: 0.0 for name in TOKEN_METRICS}
    plain = {name: [] for name in TOKEN_METRICS}
    group = plan.groups[0]
    for k, (row, t) in enumerate(zip(group.scored_row.tolist(), group.scored_t.tolist())):
        pair, branch, w = int(group.pair[row]), int(group.branch[row]), float(group.weight[k])
        logits, targets = stock[pair, branch]
        logp = logits[t].log_softmax(-1)
        values = {f"logits/{'chosen' if branch == 0 else 'rejected'}": float(logits[t].mean()),
                  "entropy": float(-(logp.exp() * logp).sum())}
        if branch == 0:
            values["mean_token_accuracy"] = float(logits[t].argmax() == targets[t])
        for name, value in values.items():
            num[name] += w * value
            den[name] += w
            plain[name].append(value)
    assert plan.positions_scored < plan.unpruned_positions  # pruned, and weights that differ from 1
    assert len(set(group.weight.tolist())) > 1
    for name in TOKEN_METRICS:
        torch.testing.assert_close(float(got[name]), num[name] / den[name], **TOL, msg=name)
    # the unweighted mean of the same positions differs: the weights matter here
    unweighted = sum(plain["entropy"]) / len(plain["entropy"])
    assert abs(float(got["entropy"]) - unweighted) > 1e-4


def test_token_stats_of_a_large_vocabulary_go_by_blocks_and_equal_the_direct_computation():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 1 << 20, generator=g)  # 4 rows per block: 3 blocks
    logits[2, 7] = 50.0  # a sure arg-max
    targets = torch.randint(0, 1 << 20, (9,), generator=g)
    targets[2] = 7
    logp = logits.log_softmax(-1)
    want = torch.stack([logits.mean(-1), -(logp.exp() * logp).sum(-1), (logits.argmax(-1) == targets).float()], -1)
    for given in (None, logp):
        torch.testing.assert_close(token_stats(logits, targets, given), want, **TOL)
    assert want[:, 2].sum() == 1


class NotLinear(nn.Module):
    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.head = head

    def forward(self, x):
        return self.head(x)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("wrap", [False, True], ids=["linear", "other-head"])
def test_chunked_scorer_reports_the_plain_scorers_token_stats_once(tiny_source, grad, wrap):
    _, head = split_causal_lm(tiny_source.build())
    head = NotLinear(head) if wrap else head
    hidden = torch.randn(10, head.in_features if not wrap else head.head.in_features, requires_grad=grad)
    targets = torch.randint(0, 32, (10,))
    want: list = []
    TokenScorer().log_probs(head, hidden, targets, want)
    got: list = []
    with torch.set_grad_enabled(grad):
        logps = ChunkedScorer(chunk_size=4).log_probs(head, hidden, targets, got)
        if grad:
            logps.sum().backward()  # the recomputation must not append a second time
    assert len(got) == 3
    torch.testing.assert_close(torch.cat(got), want[0], **TOL)


def test_token_stats_are_computed_only_when_asked(tiny_source, small_batch):
    module = perturbed(tiny_source)
    assert module.step(small_batch).logps.policy_token_stats is None
    calls = []

    class Counting(TokenScorer):
        def log_probs(self, head, hidden, targets):  # written before the stats argument existed
            calls.append(len(hidden))
            return super().log_probs(head, hidden, targets)

    module.scorer = Counting()
    module.step(small_batch)
    assert calls


def test_input_tokens_count_each_prompt_twice_and_no_padding():
    batch = make_batch([3, 1], [4, 2], [5, 1])
    assert batch.prompt_ids.numel() + batch.response_ids.numel() > 2 * 4 + 12  # there is padding to leave out
    assert input_tokens(batch) == 2 * (3 + 1) + (4 + 2) + (5 + 1)


class Recorder(Callback):
    """What the module's logged values must equal, computed on the side: TRL's input-token count, the norm that
    ``clip_grad_norm_`` returns and the scheduler's rate, at each optimizer step."""

    def __init__(self) -> None:
        self.tokens, self.norms, self.rates, self.count = [], [], [], 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        prompt = int(batch.prompt_mask.sum())
        self.count += 2 * prompt + int(batch.response_mask.sum())
        self.tokens.append(self.count)

    def on_before_optimizer_step(self, trainer, module, optimizer):  # runs before the module's hook
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm=float("inf"))))
        self.rates.append(trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0])


def test_a_pruned_fit_through_the_cli_logs_trls_names_with_their_values(tmp_path):
    cli = build_cli([
        *config_args("all"), f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=4",
        "--trainer.val_check_interval=4",
        "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.gradient_clip_val=1e-3",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
        "--data.init_args.max_rows=96",
        "--data.init_args.batch_size=8",
    ], run=False)
    recorder = Recorder()
    cli.trainer.callbacks.append(recorder)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), {}).update({k: float(v) for k, v in row.items() if v and k != "step"})
    train = [by_step[s] for s in sorted(by_step) if "train/loss" in by_step[s]]
    assert len(train) == 4
    for name in ("grad_norm", "learning_rate", "num_tokens", *TOKEN_METRICS):
        assert all(f"train/{name}" in row for row in train), name
    for name in ("loss", "rewards/chosen", *TOKEN_METRICS):
        assert any(f"val/{name}" in row for row in by_step.values()), name
    torch.testing.assert_close([row["train/grad_norm"] for row in train], recorder.norms, **TOL)
    assert min(recorder.norms) > 1e-3  # clipped at 1e-3: the logged norm is the one before clipping
    torch.testing.assert_close([row["train/learning_rate"] for row in train], recorder.rates, **TOL)
    assert len(set(recorder.rates)) > 1  # the warm-up moves the rate
    assert [row["train/num_tokens"] for row in train] == recorder.tokens


def test_token_metrics_are_computed_only_on_the_steps_whose_logs_are_written(tmp_path):
    cli = build_cli([
        *config_args("all"), f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=4",
        "--trainer.val_check_interval=4",
        "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=2", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}", "--data.init_args.max_rows=96", "--data.init_args.batch_size=8",
    ], run=False)
    asked, step = [], cli.model.step

    def recording_step(batch, *args, token_stats=False, **kwargs):
        asked.append(token_stats)
        return step(batch, *args, token_stats=token_stats, **kwargs)

    cli.model.step = recording_step
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert asked == [False, True, False, True]  # one more pass over the scored logits, every log_every_n_steps only
    rows = [r for r in csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()) if r.get("train/loss")]
    assert len(rows) == 2 and all(r[f"train/{name}"] for r in rows for name in TOKEN_METRICS)


def test_logged_training_metrics_are_means_over_the_logging_window_as_trls(tmp_path):
    """TRL averages its training metrics over the steps since the last log (``_metrics`` lists, cleared at each
    log): the same run logged every step and every 3 steps gives, at steps 2 and 5, the mean of steps 0-2 and 3-5."""
    def fit(every: int, root):
        build_cli(["fit", *config_args("all"), f"--trainer.default_root_dir={root}", "--trainer.max_steps=6",
                   "--trainer.limit_val_batches=0", f"--trainer.log_every_n_steps={every}",
                   "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                   "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={root}",
                   "--data.init_args.max_rows=96", "--data.init_args.batch_size=8"])
        rows = csv.DictReader(next(root.rglob("metrics.csv")).open())
        return {int(r["step"]): {k: float(v) for k,
                                 v in r.items() if v and k != "step"} for r in rows if r.get("train/loss")}

    each, windowed = fit(1, tmp_path / "each"), fit(3, tmp_path / "windowed")
    assert sorted(each) == list(range(6)) and sorted(windowed) == [2, 5]
    for name in ("train/loss", "train/rewards/margins", "train/logps/chosen", "train/pruning/positions_scored_frac",
                 "train/work/tokens_executed"):
        for end in (2, 5):
            mean = sum(each[s][name] for s in range(end - 2, end + 1)) / 3
            assert windowed[end][name] == pytest.approx(mean, rel=1e-5, abs=1e-7), (name, end)
    assert windowed[5]["train/num_tokens"] == each[5]["train/num_tokens"]  # a running count: the step's own
    assert windowed[5]["train/learning_rate"] == each[5]["train/learning_rate"]
