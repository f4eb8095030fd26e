"""The benchmark: the cost model on hand-computed shapes, and the CLI end to end on the ``small`` preset."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import fields

import pytest
import torch
from helpers import REPO, TINY_LLAMA, make_batch

from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.cli import main
from lit_prunedpo_lab.bench.harness import run_benchmark
from lit_prunedpo_lab.bench.presets import MODES, get_preset
from lit_prunedpo_lab.bench.rounds import build_rounds, run_rounds, train_step
from lit_prunedpo.callbacks import PeakMemoryMeter
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.step.execute import StepExecutor
from lit_prunedpo.layout import PairLengths, SharedPromptLayout
from lit_prunedpo.models import FromConfig
from lit_prunedpo.modes import load_mode
from lit_prunedpo.module import PrunedDPO
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import (
    AllPositions,
    BothBranches,
    FullPrefix,
    RandomBranch,
)
from lit_prunedpo.step.io import StepParts

pytestmark = pytest.mark.slow  # benchmark runs: `pytest -m slow` (CI runs it)

FIELDS = (
    "mode", "reference", "scorer", "step_time_s", "step_time_p90_s", "peak_memory_mb", "tokens_executed",
    "positions_scored", "ideal_speedup", "speedup", "efficiency",
)

# Hand-computed shapes: 2 pairs, prompts of 3 tokens, all responses of 5 tokens -> width 3 + 5 - 1 = 7.
DIMS = cost.ModelDims(body_params=1000, hidden_size=8, vocab_size=100, num_layers=2, attention_dim=8)
# One forward of 4 rows (both branches of both pairs), 20 scored positions:
#   body 2*1000*4*7 = 56000, attention 4*2*8*7^2*4 = 12544, head 2*8*100*20 = 32000 -> F = 100544
F = 100_544
HEAD = 32_000


def _plan(branch):
    batch = make_batch([3, 3], [5, 5], [5, 5])
    return plan_step(batch, FullPrefix(), AllPositions(), branch, torch.Generator().manual_seed(0))


def test_forward_flops_by_part():
    f = cost.forward_flops(DIMS, rows=4, width=7, positions=20)
    assert (f.body, f.attention, f.head, f.total) == (56_000, 12_544, 32_000, F)
    assert cost.forward_flops(DIMS, 4, 7, 20, attention=False).total == 88_000
    assert f.head_share == pytest.approx(32_000 / 100_544)


def test_step_flops_vanilla_and_branch():
    vanilla, branch = _plan(BothBranches()), _plan(RandomBranch(0.5))
    # vanilla: forward F, backward 2F, online reference F
    online = cost.step_flops(vanilla, DIMS, "online")
    assert (online.policy_forward, online.policy_backward, online.head_recompute, online.reference_forward) == (
        F, 2 * F, 0, F,
    )
    assert online.total == 402_176
    assert cost.step_flops(vanilla, DIMS, "cached").total == 301_632
    # one branch per pair: grad group F/2 (+ backward F), no-grad group F/2, reference over all 4 rows F
    assert cost.step_flops(branch, DIMS, "online").total == 301_632
    assert cost.step_flops(branch, DIMS, "cached").total == 201_088
    assert cost.ideal_speedup([cost.step_flops(vanilla, DIMS, "online")],
                              [cost.step_flops(branch, DIMS, "online")]) == pytest.approx(4 / 3)
    assert cost.ideal_speedup([cost.step_flops(vanilla, DIMS, "cached")],
                              [cost.step_flops(branch, DIMS, "cached")]) == pytest.approx(3 / 2)
    # the chunked scorer recomputes the head forward of the gradient rows in backward
    assert cost.step_flops(vanilla, DIMS, "cached", recompute_head=True).total == 301_632 + HEAD
    assert cost.step_flops(branch, DIMS, "cached", recompute_head=True).total == 201_088 + HEAD // 2


def test_model_dims_from_tiny_llama():
    dims = cost.ModelDims.from_model(FromConfig("llama", TINY_LLAMA).build())
    # per layer: q 32x32, k 32x16, v 32x16, o 32x32 (4 heads / 2 kv heads of 8), MLP 3 x 32x64
    assert dims == cost.ModelDims(body_params=2 * (1024 + 512 + 512 + 1024 + 3 * 2048), hidden_size=32, vocab_size=32,
                                  num_layers=2, attention_dim=32)


def test_cost_arguments_checked():
    with pytest.raises(ValueError, match="rows"):
        cost.forward_flops(DIMS, -1, 7, 20)
    with pytest.raises(ValueError, match="reference"):
        cost.step_flops(_plan(BothBranches()), DIMS, "offline")
    with pytest.raises(ValueError, match="vocab_size"):
        cost.ModelDims(1, 1, -1, 1, 1)


def test_harness_arguments_checked():
    small = get_preset("small")
    with pytest.raises(ValueError, match="modes"):
        run_benchmark(small, modes=["nope"])
    with pytest.raises(ValueError, match="steps"):
        run_benchmark(small, steps=0)
    with pytest.raises(ValueError, match="preset"):
        get_preset("huge")


def _check_payload(payload, modes, references, scorers, prompts=("shared",)):
    assert payload["preset"] == "small" and payload["device"] == "cpu"
    rows = payload["results"]
    assert sorted((r["mode"], r["reference"], r["scorer"], r["prompt"]) for r in rows) == sorted(
        (m, r, s, p) for m in modes for r in references for s in scorers for p in prompts
    )
    for row in rows:
        for name in FIELDS:
            assert name in row, name
        assert row["step_time_s"] > 0 and row["step_time_p90_s"] >= row["step_time_s"] * 0.999
        assert row["tokens_executed"] > 0 and row["positions_scored"] > 0 and row["ideal_speedup"] > 0
        baseline = row["mode"] == "vanilla" and row["prompt"] == ("padded" if "padded" in prompts else "shared")
        if baseline:
            assert row["ideal_speedup"] == pytest.approx(1.0) and row["speedup"] == pytest.approx(1.0)
        elif row["mode"] == "vanilla":  # the shared prompt against concatenated DPO: fewer tokens, same work
            assert row["ideal_speedup"] > 1.0 and row["tokens_executed"] < min(
                r["tokens_executed"] for r in rows if r["prompt"] == "padded")
        if row["mode"] == "branch" and row["prompt"] == "padded":  # equal-width rows: the design note's ratios
            assert row["ideal_speedup"] == pytest.approx(4 / 3 if row["reference"] == "online" else 1.5, rel=0.05)
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["ideal_speedup"])
        assert row["flops"] == pytest.approx(row["flops_per_step"]) and row["flops"] > 0
        assert row["achieved_flops_per_s"] == pytest.approx(row["flops"] / row["step_time_s"])
        assert row["utilisation"] == pytest.approx(row["achieved_flops_per_s"] / payload["peak_flops_per_s"])
        assert 0 < row["utilisation"]
    assert payload["peak_measure"]["flops_per_s"] == payload["peak_flops_per_s"] > 0
    flops = {(r["mode"], r["reference"], r["scorer"], r["prompt"]): r["flops"] for r in rows}
    for (mode, *variant), value in flops.items():  # the same batches: one branch of each pair has no backward
        if mode == "branch":
            assert value < flops[("vanilla", *variant)], variant


def test_cli_small_in_process(tmp_path, capsys):
    references = ["online", "cached"]
    assert main(["--preset", "small", "--references", ",".join(references), "--out", str(tmp_path), "--quiet"]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    _check_payload(payload, list(MODES), references, ["plain", "chunked"])
    assert "| mode |" in (tmp_path / "bench.md").read_text()
    assert payload["load"]["torch_threads"] == torch.get_num_threads() and payload["load"]["wall_per_cpu"] > 0
    assert "- load: load average" in (tmp_path / "bench.md").read_text()
    assert "| vanilla |" in capsys.readouterr().out
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "bench.png").stat().st_size > 0


def test_cli_small_subprocess(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [
        sys.executable, "-m", "lit_prunedpo_lab.bench.cli", "--preset", "small", "--modes", "vanilla,branch",
        "--references", "online", "--scorers", "plain", "--prompts", "shared,padded", "--out", str(tmp_path / "out"),
        "--quiet",
    ]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    payload = json.loads((tmp_path / "out" / "bench.json").read_text())
    _check_payload(payload, ["vanilla", "branch"], ["online"], ["plain"], ("shared", "padded"))


def test_cli_rejects_unknown_mode(capsys):
    with pytest.raises(SystemExit):
        main(["--modes", "vanilla,bogus"])
    assert "bogus" in capsys.readouterr().err


def test_hh_body_preset_is_body_heavy_and_hh_shaped():
    """Lengths come from the HH-RLHF quantile table, batches are length-grouped, the LM head is <= 10% of a forward."""
    from lit_prunedpo_lab.bench.batches import make_batches
    from lit_prunedpo_lab.bench.presets import HH_RLHF_LENGTHS

    preset = get_preset("hh-body")
    batches = make_batches(preset, 8, seed=0)
    prompts = torch.cat([b.prompt_mask.sum(1) for b in batches]).float()
    responses = torch.cat([b.response_lengths.flatten() for b in batches]).float()
    table = HH_RLHF_LENGTHS
    assert table["prompt"][0] <= prompts.min() and prompts.max() <= table["prompt"][-1]
    assert responses.max() <= max(table["chosen"][-1], table["rejected"][-1])
    assert prompts.mean() > responses.mean()  # HH-RLHF: prompts are longer than responses
    model = FromConfig("llama", preset.model).build()
    dims = cost.ModelDims.from_model(model)
    b = batches[0]
    share = cost.forward_flops(dims, 2 * b.num_pairs, b.prompt_width + b.response_width - 1,
                               int(b.response_lengths.sum())).head_share
    assert share <= 0.10
    # length-grouped: within a batch the pairs' executed lengths are close
    for b in batches:
        total = b.prompt_mask.sum(1) + b.response_lengths.sum(1)
        assert int(total.max() - total.min()) <= 0.25 * int(total.max()) + 8


def test_cli_bfloat16_weights(tmp_path):
    assert main(["--preset", "small", "--modes", "vanilla", "--references", "online", "--scorers", "plain",
                 "--dtype", "bfloat16", "--steps", "1", "--warmup", "0", "--out", str(tmp_path), "--quiet"]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert payload["dtype"] == "bfloat16" and payload["results"][0]["tokens_executed"] > 0
    assert "parameters in bfloat16" in (tmp_path / "bench.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_check_refuses_without_cuda(tmp_path):
    script = REPO / "lab" / "scripts" / "gpu-check"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    done = subprocess.run([str(script), str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHON=sys.executable), check=False)
    assert done.returncode != 0 and "no CUDA device visible to torch" in done.stderr


def test_step_flops_follow_the_shared_prompt_shapes():
    """Same 2 pairs: one packed block per pair of 3 + 4 + 4 = 11 columns (prompt once, no common prefix)."""
    from lit_prunedpo.step.plan import prompt_and_common_lengths

    batch = make_batch([3, 3], [5, 5], [5, 5])
    assert prompt_and_common_lengths(batch)[1].tolist() == [0, 0]
    plan = plan_step(batch, FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    forwards = StepExecutor(SharedPromptLayout()).forwards(plan.groups, PairLengths.of(batch))
    assert forwards.policy[0].laid_out.shape == (2, 11)
    # body 2*1000*2*11 = 44000, attention 4*2*8*11^2*2 = 15488, head 2*8*100*20 = 32000
    f_shared = 44_000 + 15_488 + 32_000
    online = cost.step_flops(forwards, DIMS, "online")
    assert (online.policy_forward, online.policy_backward,
            online.reference_forward) == (f_shared, 2 * f_shared, f_shared)
    assert cost.ideal_speedup([cost.step_flops(_plan(BothBranches()), DIMS, "online")],
                              [online]) == pytest.approx(F / f_shared)


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the [peer] extra (trl)")
def test_trl_peer_on_the_same_batches(tmp_path):
    assert main(["--preset", "small", "--modes", "vanilla", "--references", "cached", "--scorers", "plain",
                 "--steps", "1", "--warmup", "0", "--peer", "trl", "--out", str(tmp_path), "--quiet"]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    peer = payload["peer"]
    assert peer["name"] == "trl" and peer["step_time_s"] > 0
    (row,) = payload["results"]
    assert row["speedup_vs_peer"] == pytest.approx(peer["step_time_s"] / row["step_time_s"])
    # TRL runs chosen and rejected rows of prompt + response, every token: more than the shared layout executes
    assert peer["tokens_executed"] > row["tokens_executed"]
    assert "Peer `trl`" in (tmp_path / "bench.md").read_text()


def test_trl_peer_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # import now raises ImportError
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[peer\]'"):
        run_benchmark(get_preset("small"), modes=["vanilla"], references=["online"], scorers=["plain"], steps=1,
                      warmup=0, peer="trl")


def _count_steps(monkeypatch) -> list:
    """Record ``(module, parts)`` of every ``PrunedDPO.step`` call (the real step still runs)."""
    calls, step = [], PrunedDPO.step

    def counted(self, batch, parts=None, generator=None, **kwargs):
        calls.append((self, parts))
        return step(self, batch, parts, generator, **kwargs)

    monkeypatch.setattr(PrunedDPO, "step", counted)
    return calls


def test_bench_step_is_the_training_step(monkeypatch):
    """A configuration's bench step (pruned samplers, chunked scorer and reference, padded prompt) gives the loss,
    the plan counts and the gradient of ``training_step`` on a module built with those parts, from the same sampler
    seed; both run ``PrunedDPO.step``. SGD with lr 1 turns the gradient into the weight update, compared."""
    calls = _count_steps(monkeypatch)
    small = get_preset("small")
    rounds = build_rounds(small, ["all"], ["online"], ["chunked"], ["padded"], num_batches=1, warmup=0,
                          dev=torch.device("cpu"))
    ((config, parts),) = rounds.parts.items()
    batch, bench = rounds.batches[0], rounds.module
    built = PrunedDPO(policy=FromConfig("llama", small.model, seed=0), beta=0.1, **load_mode("all").module_kwargs(),
                      scorer=ChunkedScorer(small.chunk_size), shared_prompt=False)
    built.train()
    for module in (built, bench):  # the policy moves away from the reference: margins and the reference matter
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in module.policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))

    with pytest.warns(UserWarning, match="self.log"):  # no trainer attached: Lightning skips the logging
        loss = built.training_step(batch, 0)
    loss.backward()
    torch.optim.SGD(built.policy.parameters(), lr=1.0).step()
    out = train_step(bench, torch.optim.SGD(bench.policy.parameters(), lr=1.0), batch, parts,
                     rounds.rngs[config].next())

    assert calls == [(built, None), (bench, parts)]
    torch.testing.assert_close(out.estimate.objective, loss.detach())
    assert out.stats == built.step_stats and out.stats.positions_scored < out.stats.unpruned_positions
    for b, p in zip(built.policy.parameters(), bench.policy.parameters(), strict=True):
        torch.testing.assert_close(p, b, atol=1e-6, rtol=1e-5)
    assert bench.prefix_sampler is not parts.prefix_sampler and bench.shared_prompt  # the module was not changed


def test_rounds_run_every_configuration_through_the_module_step(monkeypatch):
    calls = _count_steps(monkeypatch)
    rounds = build_rounds(get_preset("small"), ["vanilla", "all"], ["online"], ["plain"], ["shared", "padded"],
                          num_batches=2, warmup=1, dev=torch.device("cpu"))
    rounds.meter = PeakMemoryMeter(torch.device("cpu"))  # no garbage-collector pass per step: a faster test
    own = rounds.module.parts
    records, peers = run_rounds(rounds)
    assert calls == [(rounds.module, parts) for parts in rounds.parts.values()] * 2
    assert all(getattr(rounds.module.parts, f.name) is getattr(own, f.name) for f in fields(StepParts))
    assert all(len(r.times) == len(r.tokens) == len(r.flops) == len(r.losses) == 1 for r in records.values())
    assert peers == {} and rounds.peer is None
    # each configuration drew from its own stream, once per round
    assert all(rng.step == 2 for rng in rounds.rngs.values()) and rounds.module.sampler_rng.step == 0


def test_step_flops_follow_the_prompt_cache_shapes():
    """Same 2 pairs, one branch each with a graph: the gradient forward runs 3 + 4 = 7 columns per pair; the no-grad
    one reruns the prompt's last 1 token and 4 response inputs, attending to 2 cached prompt tokens."""
    batch = make_batch([3, 3], [5, 5], [5, 5])
    plan = plan_step(batch, FullPrefix(), AllPositions(), RandomBranch(0.5), torch.Generator().manual_seed(0))
    forwards = StepExecutor(SharedPromptLayout(), reuse_keys_values=True).forwards(plan.groups, PairLengths.of(batch))
    grad, no_grad = (f.laid_out for f in forwards.policy)
    assert grad.shape == (2, 7) and grad.cached_columns == 0
    assert no_grad.shape == (2, 5) and no_grad.cached_columns == 2
    assert no_grad.inputs(batch).attention_mask.shape == (2, 1, 5, 2 + 5)  # what the body really gets
    # grad: body 2*1000*2*7 = 28000, attention 4*2*8*7*7*2 = 6272, head 2*8*100*10 = 16000
    # no-grad: body 2*1000*2*5 = 20000, attention 4*2*8*5*(2+5)*2 = 4480, head 16000
    f_grad, f_no_grad = 28_000 + 6_272 + 16_000, 20_000 + 4_480 + 16_000
    cached = cost.step_flops(forwards, DIMS, "cached")
    assert (cached.policy_forward, cached.policy_backward) == (f_grad + f_no_grad, 2 * f_grad)
