"""The cached per-token reference: same loss and gradients as the online reference in every pruning mode,
fingerprint reuse and refusal, corrupt caches refused, resume reads the same cache bitwise, and HH-RLHF
(real GPT-2 tokenizer, tiny random GPT-2) end to end.

Tolerance: cached and online log-probs come from differently padded batches, so they agree to float32
round-off, not bitwise: per-token reference log-probs, losses and gradients are compared with
``atol=1e-6`` (``rtol=0``); per-response reference sums (about -50, where a float32 ulp is 4e-6) with
``rtol=1e-6``.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import MODES as SHIPPED_MODES
from helpers import REPO, TINY_LLAMA
from safetensors import safe_open
from safetensors.torch import save_file

import lit_prunedpo.reference.cached as rc
from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import collate_pairs
from lit_prunedpo.cli import build_cli
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.models import FromConfig
from lit_prunedpo.modes import load_mode
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.reference import CachedReference, ReferenceLogpStore, ReferenceRuntime, compute_reference_logps
from lit_prunedpo.reference.store import read_fingerprint, tensors_checksum

ATOL = 1e-6
MODES = {name: load_mode(name).samplers for name in SHIPPED_MODES}
FAST = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1"]
HH_DATA = str(REPO.parent / "shared/data/hh-rlhf/harmless-base-test.jsonl.gz")
GPT2_TOKENIZER = str(REPO.parent / "shared/tokenizers/gpt2")
TINY_GPT2 = dict(vocab_size=50257, n_embd=32, n_layer=1, n_head=2, n_positions=1024)


@pytest.fixture
def builds(monkeypatch):
    """Counts calls of compute_reference_logps (each is one build of a cache or shard)."""
    calls = []
    real = rc.compute_reference_logps

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rc, "compute_reference_logps", counting)
    return calls


def synthetic(**kwargs):
    args = dict(vocab_size=32, num_train=40, num_val=8, batch_size=8, seed=3)
    dm = SyntheticPreferenceData(**{**args, **kwargs})
    dm.setup("fit")
    return dm


# ------------------------------------------------------------------------- same objective as online
# The position mode samples only the log-sum-exp: an online reference's sum is estimated like the policy's, a cached
# one's is exact over the executed positions, so the two objectives differ by design (both unbiased: the split
# estimators' enumeration tests, tests/samplers/test_control_variates.py, cover both references).
@pytest.mark.parametrize("mode", [m for m in MODES if m != "position"])
def test_cached_equals_online_loss_and_gradients(mode, tiny_source):
    prefix, position, branch = MODES[mode]
    dm = synthetic()
    online = PrunedDPO(policy=tiny_source, prefix_sampler=prefix, position_sampler=position, branch_sampler=branch)
    # The cache is built from the *initial* policy in batches of another size and order than the step's.
    store = compute_reference_logps(tiny_source.build(), dm.reference_batches(5))
    cached = PrunedDPO(policy=tiny_source, reference=CachedReference.from_store(store), prefix_sampler=prefix,
                       position_sampler=position, branch_sampler=branch)
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in online.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    cached.policy.load_state_dict(online.policy.state_dict())
    pairs = dm.train_pairs + dm.val_pairs
    for seed, rows in enumerate(([31, 2, 17, 8, 44, 5], [40, 41, 0, 39])):  # train and val pairs mixed
        batch = collate_pairs([pairs[r] for r in rows], pad_id=0)
        results = []
        for module in (online, cached):
            module.policy.zero_grad()
            plan = plan_step(batch, prefix, position, branch, torch.Generator().manual_seed(seed))
            est = module.execute_and_estimate(batch, plan)
            est.objective.backward()
            grads = torch.cat([p.grad.flatten() for p in module.policy.parameters()])
            results.append((est.objective.detach(), est.reference_logps, grads))
        (lo, ro, go), (lc, rc_, gc) = results
        torch.testing.assert_close(lc, lo, atol=ATOL, rtol=0)
        torch.testing.assert_close(gc, go, atol=ATOL, rtol=0)
        # Per response, the sums (~ -50) agree to float32's resolution there (1 ulp = 4e-6): relative 1e-6.
        torch.testing.assert_close(rc_, ro, atol=0, rtol=ATOL)
        for token_online, token_cached in zip(online.reference.token_logps(batch, plan),
                                              cached.reference.token_logps(batch, plan), strict=True):
            torch.testing.assert_close(token_cached, token_online, atol=ATOL, rtol=0)
    assert cached.reference.tokens_executed(plan) == 0 and not list(cached.reference.parameters())


# ---------------------------------------------------------------------------------- the store
def test_store_gathers_and_round_trips(tmp_path, tiny_source):
    dm = synthetic()
    store = compute_reference_logps(tiny_source.build(), dm.reference_batches())
    assert store.num_rows == 48 and store.keys.tolist() == list(range(48))
    pair = dm.val_pairs[3]
    lengths = store.lengths_of(torch.tensor([pair["index"]]))
    assert lengths.tolist() == [[len(pair["chosen_ids"]), len(pair["rejected_ids"])]]
    store.save(tmp_path / "c.safetensors")
    loaded = ReferenceLogpStore.load(tmp_path / "c.safetensors")
    assert torch.equal(loaded.values, store.values) and torch.equal(loaded.offsets, store.offsets)
    assert loaded.size_bytes == store.size_bytes == 4 * store.num_tokens + 5 * 8 * 48
    t = torch.tensor([0, 1, int(lengths[0, 1]) - 1])
    got = loaded.gather(torch.tensor(pair["index"]), torch.tensor(1), t)
    start = int(store.offsets[pair["index"], 1])
    assert torch.equal(got, store.values[start + t])
    with pytest.raises(KeyError, match="no pair with dataset index \\[999\\]"):
        loaded.gather(torch.tensor([999]), torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(IndexError, match="beyond its cached length"):
        loaded.gather(torch.tensor([pair["index"]]), torch.tensor([0]), lengths[:, 0])


def test_colliding_indices_are_refused(tiny_source):
    batch = collate_pairs(synthetic().train_pairs[:2], pad_id=0)
    with pytest.raises(ValueError, match="yields dataset index 0 more than once"):
        compute_reference_logps(tiny_source.build(), [batch, batch])


def test_build_progress_reports_every_tenth_at_most_every_interval_and_the_end():
    times = iter([0.0, 1.0, 20.0, 21.0, 40.0, 100.0])
    progress = rc.BuildProgress(total_pairs=100, world_size=1, what="c.safetensors", min_interval_s=10.0,
                                clock=lambda: next(times))
    for done in (5, 15, 30, 35, 100):  # at t = 1, 20, 21, 40, 100
        progress(done)
    # 5% is below the first tenth; 35% comes 1 s after the last line; the end always reports
    assert progress.lines == [
        "reference cache c.safetensors: 15 of 100 pairs (15%) in 20 s, 0.8 pairs/s, about 113 s left",
        "reference cache c.safetensors: 35 of 100 pairs (35%) in 40 s, 0.9 pairs/s, about 74 s left",
        "reference cache c.safetensors: 100 of 100 pairs (100%) in 100 s, 1.0 pairs/s",
    ]
    assert rc.BuildProgress(total_pairs=101, world_size=2, what="x").total == 51  # a rank's share, rounded up


def test_a_build_reports_its_progress_after_every_batch(tiny_source):
    seen = []
    store = compute_reference_logps(tiny_source.build(), synthetic().reference_batches(8), progress=seen.append)
    assert seen == list(range(8, 49, 8)) and store.num_rows == 48


# ------------------------------------------------------------------------ fingerprint: reuse and refusal
def test_prepare_reuses_refuses_stale_and_recomputes(tmp_path, tiny_source, builds):
    path = str(tmp_path / "ref.safetensors")
    policy = tiny_source.build()
    CachedReference(path).prepare(policy, synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))
    again = CachedReference(path)
    again.prepare(policy, synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))
    assert len(builds) == 1 and again.store.num_rows == 48 and again.builds == 0

    with pytest.raises(ValueError, match=r"stale.*data\.max_response_length \(cache: 32, now: 20\)") as err:
        CachedReference(path).prepare(policy, synthetic(max_response_length=20),
                                      ReferenceRuntime(root_dir=str(tmp_path)))
    assert "reference.weights" not in str(err.value)  # only what differs is listed
    other_seed = FromConfig(model_type="llama", config=TINY_LLAMA, seed=1).build()
    with pytest.raises(ValueError, match=r"stale.*reference\.weights") as err:
        CachedReference(path).prepare(other_seed, synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))
    assert "data." not in str(err.value)
    source = FromConfig(model_type="llama", config=TINY_LLAMA, seed=1)
    with pytest.raises(ValueError, match=r"reference\.source \(cache: \"policy initial weights\", now: \"lit_prunedpo"):
        CachedReference(path, model=source).prepare(policy, synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))

    rebuilt = CachedReference(path, model=source, recompute=True)
    rebuilt.prepare(policy, synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))
    assert len(builds) == 2 and rebuilt.builds == 1
    assert read_fingerprint(path)["reference"]["args"]["seed"] == 1
    CachedReference(path, model=source).prepare(policy, synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))
    assert len(builds) == 2


def test_default_path_is_under_the_root_dir(tmp_path, tiny_source):
    ref = CachedReference()
    ref.prepare(tiny_source.build(), synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))
    assert (tmp_path / rc.DEFAULT_FILENAME).is_file() and ref.store is not None


# ------------------------------------------------------------------------------ corrupt caches
def rewrite(path, keep_checksum=False, **changes):
    """Rewrite a cache file with some tensors replaced, keeping its metadata (bypasses the store's checks). The
    checksum is recomputed, so that the checks behind it are reached, unless ``keep_checksum``."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors.update(changes)
    if not keep_checksum:
        meta = {**meta, "checksum": tensors_checksum(tensors)}
    save_file(tensors, str(path), metadata=meta)
    return tensors


def test_values_altered_after_the_build_are_refused_by_checksum(built):
    path, prepare = built
    values = ReferenceLogpStore.load(path).values.clone()
    values[5] = values[5] * 1.5 - 0.25  # another plausible negative log-prob: every other check passes
    assert bool((values < 0).all())
    rewrite(path, keep_checksum=True, values=values)
    with pytest.raises(ValueError, match=rf"reference cache {path}: its tensors do not match the checksum"):
        prepare()


@pytest.fixture
def built(tmp_path, tiny_source):
    path = tmp_path / "ref.safetensors"
    policy = tiny_source.build()
    CachedReference(str(path)).prepare(policy, synthetic(), ReferenceRuntime(root_dir=str(tmp_path)))
    return path, lambda: CachedReference(str(path)).prepare(policy, synthetic(),
                                                            ReferenceRuntime(root_dir=str(tmp_path)))


def test_nonfinite_cache_is_refused(built):
    path, prepare = built
    values = ReferenceLogpStore.load(path).values.clone()
    values[17] = float("nan")
    rewrite(path, values=values)
    with pytest.raises(ValueError, match="1 of .* log-probs are NaN or infinite"):
        prepare()
    values[17] = -float("inf")
    rewrite(path, values=values)
    with pytest.raises(ValueError, match="NaN or infinite"):
        prepare()


def test_misshapen_caches_are_refused(built, tiny_source):
    path, prepare = built
    store = ReferenceLogpStore.load(path)
    lengths = store.lengths.clone()
    lengths[3, 0] += 1
    rewrite(path, lengths=lengths)
    with pytest.raises(ValueError, match="offsets/lengths do not tile values"):
        prepare()
    rewrite(path, lengths=store.lengths, offsets=store.offsets[:-1])
    with pytest.raises(ValueError, match="wrong shapes"):
        prepare()
    # Internally consistent, but missing the last pair of the data: the row count does not match.
    keep = store.num_rows - 1
    end = int(store.offsets[keep, 0])
    rewrite(path, keys=store.keys[:keep], offsets=store.offsets[:keep], lengths=store.lengths[:keep],
            values=store.values[:end])
    with pytest.raises(ValueError, match="holds 47 pairs but the data module's pairs .* has 48"):
        prepare()
    # A batch whose lengths differ from the cached ones (data changed behind the fingerprint's back).
    ref = CachedReference.from_store(store)
    pair = dict(synthetic().train_pairs[0])
    pair["chosen_ids"] = pair["chosen_ids"][:-1]
    batch = collate_pairs([pair], pad_id=0)
    plan = plan_step(batch, *MODES["vanilla"], torch.Generator())
    with pytest.raises(ValueError, match=r"pair 0 has response lengths \[\d+, \d+\] in the cache but"):
        ref.token_logps(batch, plan)


# ----------------------------------------------------------------------------------- through the CLI
def test_resumed_run_reads_the_same_cache_and_matches_uninterrupted_run(tmp_path, builds):
    cache = tmp_path / "cache" / "ref.safetensors"
    common = ["--config", str(REPO / "configs/cached.yaml"), f"--model.reference.init_args.path={cache}",
              "--trainer.val_check_interval=3", "--trainer.limit_val_batches=1", "--data.init_args.max_rows=128",
              "--data.init_args.val_fraction=0.25", *FAST]
    full = build_cli(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'full'}", "--trainer.max_steps=6"])
    assert len(builds) == 1 and full.model.reference.builds == 1
    stamp = os.stat(cache).st_mtime_ns
    build_cli(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'half'}", "--trainer.max_steps=3"])
    ckpt = next((tmp_path / "half").rglob("*.ckpt"))
    assert not any("reference" in k for k in torch.load(ckpt, weights_only=False)["state_dict"])
    resumed = build_cli(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'resumed'}",
                         "--trainer.max_steps=6", f"--ckpt_path={ckpt}"])
    assert len(builds) == 1 and os.stat(cache).st_mtime_ns == stamp, "the cache was rebuilt"
    assert resumed.model.sampler_rng.step == full.model.sampler_rng.step == 6
    for a, b in zip(full.model.policy.state_dict().values(), resumed.model.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # bitwise, single process


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A tiny random GPT-2 with the real 50,257-token vocabulary, saved like a pretrained one."""
    path = tmp_path_factory.mktemp("tiny-gpt2")
    FromConfig(model_type="gpt2", config=TINY_GPT2, seed=0).build().save_pretrained(path)
    return path


def hh_overrides(tiny_gpt2):
    """What configs/hh_rlhf.yaml needs to instantiate offline: local model, data and tokenizer."""
    return [f"--model.policy.init_args.name_or_path={tiny_gpt2}", f"--data.init_args.path={HH_DATA}",
            f"--data.init_args.tokenizer={GPT2_TOKENIZER}"]


def hh_args(tiny_gpt2, tmp_path, cache):
    return ["--config", str(REPO / "configs/hh_rlhf.yaml"), *hh_overrides(tiny_gpt2),
            "--data.init_args.val_split=null", "--data.init_args.max_rows=64", "--data.init_args.max_length=256",
            "--data.init_args.max_prompt_length=128", "--data.init_args.batch_size=4",
            "--model.reference.init_args.batch_size=8", f"--model.reference.init_args.path={cache}",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.accelerator=cpu", *FAST]


def test_hh_rlhf_yaml_instantiates_offline(tiny_gpt2, tmp_path):
    cli = build_cli(["--config", str(REPO / "configs/hh_rlhf.yaml"), *hh_overrides(tiny_gpt2),
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert isinstance(cli.model.reference, CachedReference)


def test_hh_rlhf_builds_the_cache_and_trains(tiny_gpt2, tmp_path, builds):
    cache = tmp_path / "hh.safetensors"
    run = ["fit", *hh_args(tiny_gpt2, tmp_path, cache), "--trainer.max_steps=2", "--trainer.val_check_interval=2",
           "--trainer.limit_val_batches=1"]
    cli = build_cli(run)
    store = cli.model.reference.store
    assert len(builds) == 1 and cli.trainer.global_step == 2 and store.num_rows == 64
    # The fingerprint names the data's settings: another max_length is refused, naming it.
    with pytest.raises(ValueError, match=r"stale.*data\.max_length \(cache: 256, now: 200\)"):
        build_cli([*run, "--data.init_args.max_length=200"])


def test_cache_command_builds_ahead_and_fit_reuses_it(tiny_gpt2, tmp_path, builds):
    import subprocess
    import sys

    cache = tmp_path / "hh.safetensors"
    args = hh_args(tiny_gpt2, tmp_path, cache)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "lit_prunedpo.cli.cache", *args], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "built: 64 pairs" in out.stdout and cache.is_file()
    stamp = os.stat(cache).st_mtime_ns
    # A fresh process: the fingerprint (tokenizer hash, datasets fingerprints, weights) is stable across processes.
    cli = build_cli(["fit", *args, "--trainer.max_steps=1", "--trainer.limit_val_batches=0"])
    assert len(builds) == 0 and os.stat(cache).st_mtime_ns == stamp and cli.trainer.global_step == 1
    assert json.loads(json.dumps(read_fingerprint(cache)))["data"]["max_length"] == 256


def test_cache_command_refuses_a_config_without_a_cached_reference(tmp_path):
    from lit_prunedpo.cli.cache import main

    with pytest.raises(SystemExit, match="not lit_prunedpo.reference.CachedReference"):
        main(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}"])


def test_rank_sharded_build_merges_into_the_single_process_cache(tmp_path, tiny_source):
    """The DDP path, ranks run one after the other in one process (barriers are no-ops): rank 1 writes its
    shard, rank 0 writes its own and merges; the result equals a one-process build bitwise."""
    policy, dm = tiny_source.build(), synthetic()
    single = CachedReference(str(tmp_path / "single.safetensors"))
    single.prepare(policy, dm, ReferenceRuntime(root_dir=str(tmp_path)))
    path = tmp_path / "sharded.safetensors"
    for rank in (1, 0):
        runtime = ReferenceRuntime(root_dir=str(tmp_path), world_size=2, rank=rank)
        ref = CachedReference(str(path), recompute=True)
        fingerprint = read_fingerprint(tmp_path / "single.safetensors")
        ref._build(policy, dm, fingerprint, path, runtime)
    assert not list(tmp_path.glob("*.rank*")), "shards left behind"
    merged = ReferenceLogpStore.load(path)
    for name in ("keys", "offsets", "lengths", "values"):
        assert torch.equal(getattr(merged, name), getattr(single.store, name)), name
    assert merged.fingerprint == single.store.fingerprint
