"""The reference's log-sum-exps in the cache (the baseline of ``ReferenceLogSumExp``): built beside the log-probs,
equal to ``logsumexp`` of the plain forward's logits, round-tripped, covered by the checksum, checked for shape and
finiteness when read; a file written before them still serves every other estimator and is refused by this one,
naming the file and the fix.

Tolerance: the log-sum-exp is stored as ``z_t - logp_t`` (the target logit one row of the head), float32 round-off of
differently shaped matmuls on values of magnitude ~4: ``atol=1e-5``.
"""

from __future__ import annotations

import hashlib
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from helpers import REPO, TINY_LLAMA
from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import collate_pairs
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.guards import check_log_softmax_split
from lit_prunedpo.models import FromConfig
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.reference import CachedReference, ReferenceLogpStore, ReferenceRuntime, compute_reference_logps
from lit_prunedpo.reference.store import TENSORS, tensors_checksum
from lit_prunedpo.samplers import BothBranches, ExactTargetLogits, FullPrefix, ReferenceLogSumExp, StratifiedPositions
from lit_prunedpo.scoring import TokenScorer

ATOL = 1e-5


def synthetic():
    dm = SyntheticPreferenceData(vocab_size=32, num_train=24, num_val=8, batch_size=8, seed=3)
    dm.setup("fit")
    return dm


@pytest.fixture
def built(tmp_path, tiny_source):
    """A cache built by ``CachedReference`` (with log-sum-exps), and a function that prepares a fresh source on it."""
    path = tmp_path / "ref.safetensors"
    policy = tiny_source.build()

    def prepare():
        ref = CachedReference(str(path))
        ref.prepare(policy, synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))
        return ref

    prepare()
    return path, prepare, policy


def rewrite(path, drop=(), keep_checksum=False, checksum=tensors_checksum, **changes):
    """Rewrite a cache file with tensors dropped or replaced, keeping its metadata; the checksum recomputed by
    ``checksum`` unless ``keep_checksum``."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys() if k not in drop}
    tensors.update(changes)
    if not keep_checksum:
        meta = {**meta, "checksum": checksum(tensors)}
    save_file(tensors, str(path), metadata=meta)


def version_two_checksum(tensors):
    """The checksum as files written before the log-sum-exps were cached computed it (written out again here, so
    that a change to ``tensors_checksum`` that breaks those files fails this test)."""
    h = hashlib.blake2b(digest_size=16)
    for name in ("values", "keys", "offsets", "lengths"):
        t = tensors[name].contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


class HeadCounting(TokenScorer):
    """The plain scorer, recording the rows of every whole-head call (log-probs and log-sum-exps)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.lse_calls = 0

    def log_probs(self, head, hidden, targets, stats=None):
        self.rows.append(hidden.shape[0])
        return super().log_probs(head, hidden, targets, stats)

    def log_sum_exp(self, head, hidden, targets, stats=None):
        self.lse_calls += 1
        return super().log_sum_exp(head, hidden, targets, stats)


@torch.no_grad()
def test_the_build_stores_the_plain_forwards_log_sum_exp_beside_each_log_prob(tiny_source):
    """Every token of every pair, with 7 positions per head chunk: the head runs once per chunk (the log-sum-exp is
    the target logit, one row, less the log-prob), never on a whole batch's logits."""
    dm = synthetic()
    model = tiny_source.build().eval()
    scorer = HeadCounting()
    store = compute_reference_logps(model, dm.reference_batches(16), scorer, logits_per_chunk=7 * 32 + 5,
                                    with_lse=True)
    assert store.lse is not None and store.lse.shape == store.values.shape
    assert max(scorer.rows) == 7 and sum(scorer.rows) == store.num_tokens and scorer.lse_calls == 0
    for pair in dm.train_pairs + dm.val_pairs:
        for branch, key in enumerate(("chosen_ids", "rejected_ids")):
            prompt, response = pair["prompt_ids"], pair[key]
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
            predicting = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
            t = torch.arange(len(response))
            got = store.gather_lse(torch.tensor(pair["index"]), torch.tensor(branch), t)
            torch.testing.assert_close(got, logits[predicting].logsumexp(-1), atol=ATOL, rtol=0)
    # without with_lse (the default of compute_reference_logps), none: the store is what it always was
    assert compute_reference_logps(model, dm.reference_batches(16)).lse is None


def test_round_trip_size_and_merge_keep_the_log_sum_exps(built, tmp_path):
    path, _, _ = built
    store = ReferenceLogpStore.load(path)
    assert store.lse is not None and store.size_bytes == 8 * store.num_tokens + 5 * 8 * store.num_rows
    store.save(tmp_path / "again.safetensors")
    again = ReferenceLogpStore.load(tmp_path / "again.safetensors")
    assert torch.equal(again.lse, store.lse) and torch.equal(again.values, store.values)
    half = store.num_rows // 2
    split = int(store.offsets[half, 0])
    parts = [ReferenceLogpStore(store.values[a:b], store.keys[r0:r1], store.offsets[r0:r1] - a, store.lengths[r0:r1],
                                lse=store.lse[a:b])
             for (a, b, r0, r1) in ((0, split, 0, half), (split, store.num_tokens, half, store.num_rows))]
    assert torch.equal(ReferenceLogpStore.merge(parts).lse, store.lse)


def test_the_checksum_covers_the_log_sum_exps(built):
    path, prepare, _ = built
    lse = ReferenceLogpStore.load(path).lse.clone()
    lse[3] += 0.5
    rewrite(path, keep_checksum=True, lse=lse)
    with pytest.raises(ValueError,
                       match=rf"reference cache {re.escape(str(path))}: its tensors do not match the checksum"):
        prepare()


@pytest.mark.parametrize("broken, message", [
    (lambda lse: lse[:-1], r"wrong shapes: lse \(\d+,\), values \(\d+,\); expected one log-sum-exp per log-prob"),
    (lambda lse: lse.index_fill(0, torch.tensor([5]), float("nan")), r"1 of \d+ log-sum-exps are NaN or infinite"),
], ids=["shape", "nan"])
def test_misshapen_or_nonfinite_log_sum_exps_are_refused_when_read(built, broken, message):
    path, prepare, _ = built
    rewrite(path, lse=broken(ReferenceLogpStore.load(path).lse))
    ref = prepare()  # every other estimator still reads the file
    with pytest.raises(ValueError, match=rf"reference cache {re.escape(str(path))}: {message}"):
        ref.check_token_lse()


def test_a_cache_written_before_the_log_sum_exps_serves_every_other_estimator_and_refuses_reference_lse(built):
    path, prepare, policy = built
    rewrite(path, drop=("lse",), checksum=version_two_checksum)  # what a file written before looks like
    assert set(safe_open(str(path), framework="pt").keys()) == set(TENSORS)
    ref = prepare()
    assert ref.store.lse is None and ref.builds == 0  # loaded, not rebuilt: the fingerprint is unchanged
    batch = collate_pairs(synthetic().train_pairs[:2], pad_id=0)
    for estimator in (StratifiedPositions(0.5), ExactTargetLogits(StratifiedPositions(0.5))):
        plan = plan_step(batch, FullPrefix(), estimator, BothBranches(), torch.Generator())
        assert [t.numel() for t in ref.token_logps(batch, plan)] == [g.num_scored for g in plan.groups]
    message = re.escape(
        f"reference cache {path} holds no log-sum-exps (it was written before they were cached), which "
        "ReferenceLogSumExp needs: rebuild it (model.reference.init_args.recompute=true, or delete the file)"
    )
    plan = plan_step(batch, FullPrefix(), ReferenceLogSumExp(), BothBranches(), torch.Generator())
    with pytest.raises(ValueError, match=message):
        ref.token_lse(batch, plan)
    with pytest.raises(ValueError, match=message):  # at set-up, before any step
        check_log_softmax_split(ReferenceLogSumExp(), policy, ref)


def test_the_cache_command_says_when_a_reused_file_has_no_log_sum_exps(tmp_path, capsys):
    from lit_prunedpo.cli.cache import main

    path = tmp_path / "ref.safetensors"
    args = ["--config", str(REPO / "configs/cached.yaml"), f"--model.reference.init_args.path={path}",
            f"--trainer.default_root_dir={tmp_path}", "--data.init_args.max_rows=32", "--trainer.accelerator=cpu"]
    main(args)
    assert "built: 32 pairs" in capsys.readouterr().out and ReferenceLogpStore.load(path).lse is not None
    rewrite(path, drop=("lse",), checksum=version_two_checksum)
    main(args)
    out = capsys.readouterr().out
    assert "up to date, reused" in out and out.rstrip().endswith(
        "; it holds no log-sum-exps (written before they were cached): ReferenceLogSumExp needs it rebuilt, "
        "--model.reference.init_args.recompute=true")


def test_reference_lse_reads_the_cache_at_every_executed_position(built):
    path, prepare, _ = built
    ref = prepare()
    module = PrunedDPO(policy=FromConfig(model_type="llama", config=TINY_LLAMA, seed=0), reference=ref)
    batch = collate_pairs(synthetic().train_pairs[:3], pad_id=0)
    plan = plan_step(batch, FullPrefix(), ReferenceLogSumExp(StratifiedPositions(0.3)), BothBranches(),
                     torch.Generator())
    logps = module.execute(batch, plan)
    (group,) = plan.groups
    assert logps.reference_lse[0].shape == (group.num_scored,) == logps.reference[0].shape
    index = batch.index[group.pair[group.scored_row]]
    expected = ref.store.gather_lse(index, group.branch[group.scored_row], group.scored_t)
    assert torch.equal(logps.reference_lse[0], expected)
