"""Multi-process training on the CPU (gloo, 2 processes): DDP and FSDP2 fits through the real CLI, ranks
drawing different plans, resume equivalence, ranks with different row groups, SIGTERM checkpoints, refused
checkpoints. Lightning's ``ddp`` launcher re-executes the running command, so multi-process runs happen in
subprocesses: ``torchrun`` on ``worker.py`` (several fits per launch, to stay fast; DDP is launched as two
one-process "nodes") and ``python -m lit_prunedpo`` for the signal test.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lit_prunedpo.cli import build_cli
from lit_prunedpo.distributed import group_signature
from lit_prunedpo.step.estimate import estimate
from lit_prunedpo.losses import SigmoidLoss
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo.samplers import (
    AllPositions, AntitheticBranch, BothBranches, FullPrefix, RandomBranch, SharedFractionPrefix,
    StratifiedPositions,
)

from helpers import REPO, make_batch

pytestmark = pytest.mark.slow  # multi-process DDP/FSDP2 runs in subprocesses: `pytest -m slow` (CI runs it)

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(REPO),
                                                                           os.environ.get("PYTHONPATH", "")])}
TOL = 1e-5


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nnodes: int, node_rank: int, port: int, out: Path, strategy: str, cwd: Path) -> subprocess.Popen:
    nproc = 2 // nnodes
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
           f"--node_rank={node_rank}", "--master_addr=127.0.0.1", f"--master_port={port}",
           str(HERE / "worker.py"), str(out), strategy, "--nodes", str(nnodes)]
    log = open(cwd / f"{strategy}_node{node_rank}.log", "w")
    return subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=log, stderr=subprocess.STDOUT)


def _wait(procs: list[subprocess.Popen], cwd: Path, name: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    if any(p.returncode for p in procs):
        logs = "\n".join(f.read_text()[-4000:] for f in sorted(cwd.glob(f"{name}_node*.log")))
        raise AssertionError(f"{name} worker failed:\n{logs}")


@pytest.fixture(scope="module")
def launch_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def fsdp_runs(launch_root) -> Path:
    """FSDP2 on one node with 2 processes. A launch of its own, so that its failure fails only its tests."""
    out = launch_root / "out"
    _wait([_torchrun(1, 0, _port(), out, "fsdp", launch_root)], launch_root, "fsdp")
    return out


@pytest.fixture(scope="module")
def ddp_runs(launch_root) -> Path:
    """DDP as two 1-process "nodes" (torchrun --nnodes 2)."""
    out, port = launch_root / "out", _port()
    _wait([_torchrun(2, r, port, out, "ddp", launch_root) for r in (1, 0)], launch_root, "ddp")
    return out


@pytest.fixture
def runs(request, strategy) -> Path:
    """The launch of the test's ``strategy`` parameter."""
    return request.getfixturevalue(f"{strategy}_runs")


def _weights(out: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(out / f"{name}.pt", weights_only=True)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# ----------------------------------------------------------------------------- in-process checks
def test_two_ranks_draw_different_plans_in_the_same_step():
    batch = make_batch([3] * 8, [5] * 8, [6] * 8)
    samplers = (SharedFractionPrefix(0.5), StratifiedPositions(0.5), AntitheticBranch())
    plans = [plan_step(batch, *samplers, SamplerRNG(seed=1234, rank=r).next()) for r in (0, 1)]
    assert not torch.equal(plans[0].grad_mask, plans[1].grad_mask)


@pytest.mark.parametrize("branch", [BothBranches(), RandomBranch(0.3), AntitheticBranch()],
                         ids=lambda b: type(b).__name__)
def test_shipped_branch_samplers_give_every_rank_the_same_forwards(branch):
    """FSDP needs the same forwards on every rank; each shipped sampler's group structure never varies."""
    signatures = set()
    for rank in range(4):
        rng = SamplerRNG(seed=7, rank=rank)
        for num_pairs in (1, 2, 3, 8):
            batch = make_batch([2] * num_pairs, [4] * num_pairs, [3] * num_pairs)
            for _ in range(10):
                signatures.add(group_signature(plan_step(batch, FullPrefix(), AllPositions(), branch, rng.next())))
    assert signatures == ({(True, False)} if isinstance(branch, BothBranches) else {(True, True)})


@pytest.mark.parametrize("shared_prompt", [True, False], ids=["shared", "padded"])
def test_placeholder_forwards_change_nothing_but_still_carry_a_graph(tiny_source, shared_prompt):
    """Told by the ranks' agreement that every rank runs a gradient and a no-grad forward, the executor runs a
    one-row placeholder where the plan has no group: the log-probs and the estimate are unchanged, and a gradient
    placeholder is part of the graph backward runs through (its reduce-scatters must run on every rank)."""
    from dataclasses import replace

    from lit_prunedpo import PrunedDPO
    from lit_prunedpo.step.execute import StepExecutor, layout_for

    module = PrunedDPO(policy=tiny_source, shared_prompt=shared_prompt)
    batch = make_batch([3, 2], [4, 5], [5, 3])
    both = lambda local: (True, True)  # noqa: E731  (another rank runs both forwards)
    run = lambda plan, agree: StepExecutor(layout_for(shared_prompt), agree=agree)(  # noqa: E731
        module.policy, module.scorer, module.reference, batch, plan)
    plan = plan_step(batch, FullPrefix(), AllPositions(), BothBranches(), torch.Generator())
    alone, padded = run(plan, None), run(plan, both)
    assert [f.plan_group for f in padded.forwards.policy] == [0, None]
    assert not padded.forwards.policy[1].requires_grad and padded.forwards.policy[1].laid_out.group.num_scored == 0
    for a, b in zip(alone.policy + alone.reference, padded.policy + padded.reference, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    a = estimate(plan, alone.policy, alone.reference, SigmoidLoss(), 0.1)
    b = estimate(plan, padded.policy, padded.reference, SigmoidLoss(), 0.1)
    assert torch.equal(a.objective, b.objective) and torch.equal(a.policy_logps, b.policy_logps)
    # a rank whose plan has no gradient group runs a gradient placeholder first, and backward reaches it
    no_grad_only = replace(plan, groups=(replace(plan.groups[0], requires_grad=False),))
    out = run(no_grad_only, both)
    assert [(f.plan_group, f.requires_grad) for f in out.forwards.policy] == [(None, True), (0, False)]
    assert out.policy[0].requires_grad and out.policy[0].numel() == plan.positions_scored
    module.zero_grad()
    estimate(no_grad_only, out.policy, out.reference, SigmoidLoss(), 0.1).objective.backward()
    grads = [p.grad for p in module.policy.parameters()]
    assert all(g is not None and not bool(g.any()) for g in grads)  # reached, and zero


def test_corrupt_or_missing_checkpoint_is_refused_with_its_path(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint" * 10)
    args = ["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_steps=1", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            "--data.init_args.max_rows=48", "--data.init_args.val_fraction=0.25",
            "--trainer.plugins+=lit_prunedpo.checkpoint.VerifiedCheckpointIO"]
    # the CLI itself reads a given checkpoint file for its hyper-parameters, and fails there, naming it
    with pytest.raises(RuntimeError, match=f"could not read checkpoint {bad}"):
        build_cli([*args, f"--ckpt_path={bad}"])
    # the trainer's load (what `ckpt_path: last` and a requeue reach) names the file
    cli = build_cli(args[1:], run=False)
    with pytest.raises(RuntimeError, match="bad.ckpt"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(bad))
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(tmp_path / "missing.ckpt"))
    assert cli.trainer.global_step == 0  # never a silent fresh start


# -------------------------------------------------------------------------- multi-process runs
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("mode", ["vanilla", "all_full"])
def test_fit_trains_checkpoints_and_logs_the_callbacks(runs, strategy, mode):
    metrics = json.loads((runs / f"{strategy}_{mode}.json").read_text())
    for key in ("train/loss", "val/loss", "val/rewards/accuracies", "memory/peak_rss_mb"):
        assert key in metrics, key
    if mode == "all_full":  # StepTimeMonitor skips 2 warm-up steps
        assert "time/step_s" in metrics and "throughput/tokens_executed_per_s" in metrics
        assert metrics["train/pruning/branches_backpropagated_frac"] == 0.5
    assert list((runs / strategy / mode).rglob("*.ckpt")), "no checkpoint written"
    if strategy == "fsdp":
        assert (next((runs / strategy / mode).rglob("*.ckpt")) / ".metadata").exists(), "not a distributed checkpoint"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ranks_backpropagate_different_branches_in_the_same_step(runs, strategy):
    per_rank = json.loads((runs / f"{strategy}_plans.json").read_text())
    assert len(per_rank) == 2 and len(per_rank[0]["all_full"]) == 4
    assert per_rank[0]["all_full"][0] != per_rank[1]["all_full"][0]


def test_ranks_with_different_row_groups_do_not_desync_fsdp(fsdp_runs):
    runs = fsdp_runs
    """A custom sampler gives rank 0 one row group and rank 1 two; the step pads rank 0 with a placeholder."""
    per_rank = json.loads((runs / "fsdp_plans.json").read_text())
    assert all(all(row == [True, True] for row in mask) for mask in per_rank[0]["skewed"])
    assert all(all(sum(row) == 1 for row in mask) for mask in per_rank[1]["skewed"])
    assert (runs / "fsdp_skewed.pt").exists()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_resume_matches_the_uninterrupted_run(runs, strategy):
    """4 steps straight vs 2 steps + resume to 4 (policy, optimizer, scheduler, data position, sampler streams)."""
    assert _max_diff(_weights(runs, f"{strategy}_all_full"), _weights(runs, f"{strategy}_all_resumed")) <= TOL
    assert _max_diff(_weights(runs, f"{strategy}_all_full"), _weights(runs, f"{strategy}_all_half")) > 0


@pytest.mark.parametrize("mode", ["vanilla", "all_full"])
def test_ddp_and_fsdp2_train_the_same_weights(ddp_runs, fsdp_runs, mode):
    """Same data, seeds and draws: sharding changes nothing but float summation order (FSDP's vanilla run
    also has activation checkpointing on)."""
    assert _max_diff(_weights(ddp_runs, f"ddp_{mode}"), _weights(fsdp_runs, f"fsdp_{mode}")) <= TOL


def test_corrupt_distributed_checkpoint_is_refused_on_every_rank(fsdp_runs):
    for rank in json.loads((fsdp_runs / "fsdp_corrupt.json").read_text()):
        assert rank["message"].startswith("RuntimeError: cannot load "
                                          "checkpoint") and "fsdp_corrupt.ckpt" in rank["message"]
        assert not rank["stepped"]
        # the second fit of that trainer kept the first fit's device mesh: dropping it (and its gloo groups)
        # mid-process is what aborted this worker now and then
        assert rank["mesh_kept"]


def test_a_sharded_save_that_dies_leaves_the_previous_folder_whole(fsdp_runs):
    """FSDP2Strategy writes shards into ``.last.ckpt.tmp`` and renames it into place once every rank is done."""
    ranks = json.loads((fsdp_runs / "fsdp_atomic.json").read_text())
    for rank in ranks:
        assert rank["message"] == "[Errno 28] No space left on device"
        assert rank["unchanged"]  # meta.pt, .metadata and every shard of the previous save, byte for byte
        assert rank["after_crash"] == [".last.ckpt.tmp"]
        assert rank["after_next_save"] == []  # the leftover was cleared, the old folder deleted after the swap
    first = ranks[0]
    assert first["resolved"] == first["last"] and first["problem"] is None
    leftover = first["last"].replace("last.ckpt", ".last.ckpt.tmp")
    assert any(w.startswith(f"resume: ignored {leftover}: the temporary output of a checkpoint save that was "
                            "interrupted") for w in first["warnings"]), first["warnings"]


def test_the_position_mode_trains_on_a_sharded_head_with_its_fallback(fsdp_runs):
    # the head's weight is a DTensor once sharded: no row of it outside its forward, so ExactTargetLogits (fallback:
    # true in configs/modes/position.yaml) hands over to the sampler it wraps when configure_model has sharded it
    assert json.loads((fsdp_runs / "fsdp_position_sampler.json").read_text()) == "CoupledStratifiedPositions"
    metrics = json.loads((fsdp_runs / "fsdp_position.json").read_text())
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["val/loss"])


def test_tied_embeddings_shard_in_one_unit(fsdp_runs):
    assert json.loads((fsdp_runs / "fsdp_tied.json").read_text())["max_grad_diff"] <= TOL


def test_val_loss_reduced_over_ranks_equals_one_process(ddp_runs, tmp_path):
    runs = ddp_runs
    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
                     "--data.init_args.max_rows=192", "--data.init_args.val_fraction=0.25",
                     "--trainer.enable_progress_bar=false",
                     "--trainer.enable_model_summary=false"], run=False)
    cli.model.policy.load_state_dict(_weights(runs, "ddp_vanilla"))
    (result,) = cli.trainer.validate(cli.model, datamodule=cli.datamodule)
    ddp = json.loads((runs / "ddp_vanilla.json").read_text())
    for key in ("val/loss", "val/rewards/margins", "val/rewards/accuracies"):
        assert abs(result[key] - ddp[key]) <= TOL, key


# ----------------------------------------------------------------------------------- preemption
def test_sigterm_saves_a_checkpoint_and_the_relaunch_resumes(tmp_path):
    """``python -m lit_prunedpo fit --config configs/ddp.yaml`` (2 processes): SIGTERM to the launching
    process -> every rank stops after its step, ``last.ckpt`` is saved, exit status 0; the same command
    again resumes from it."""
    cmd = [sys.executable, "-m", "lit_prunedpo", "fit", "--config", str(REPO / "configs/ddp.yaml"),
           "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
           "--trainer.val_check_interval=1000", "--data.init_args.num_val=32"]
    proc = subprocess.Popen([*cmd, "--trainer.max_steps=100000"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "Starting with 2 processes" in line:
                started.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert started.wait(600), "".join(lines[-50:])
        time.sleep(4)  # a few steps
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(300) == 0, "".join(lines[-50:])
    finally:
        proc.kill()
    ckpt = tmp_path / "runs/ddp/checkpoints/last.ckpt"
    assert ckpt.is_file(), "".join(lines[-50:])
    step = torch.load(ckpt, weights_only=False, map_location="cpu")["global_step"]
    assert 0 < step < 100000
    out = subprocess.run([*cmd, f"--trainer.max_steps={step + 2}"], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=150)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert "Restoring states from the checkpoint path at" in log and "checkpoints/last.ckpt" in log, log[-3000:]
    # it continued from the saved step to the new limit (which checkpoint files ModelCheckpoint writes on the
    # way depends on whether its every_n_train_steps falls in between, so the log is the robust witness)
    assert f"`Trainer.fit` stopped: `max_steps={step + 2}` reached." in log, log[-3000:]
    assert f"Restored all states from the checkpoint at {ckpt}" in log, log[-3000:]


# ------------------------------------------------------------------------------------ LoRA and export
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_lora_trains_adapters_only(runs, strategy):
    full = _weights(runs, f"{strategy}_lora_full")
    from lit_prunedpo.lora import LoRA
    from lit_prunedpo.models import FromConfig
    import yaml

    from transformers import ByT5Tokenizer

    config = yaml.safe_load((REPO / "configs/lora.yaml").read_text())
    assert config["data"]["init_args"]["tokenizer"] == "byt5"
    base = config["model"]["policy"]["init_args"]["base"]["init_args"]
    base["config"].setdefault("vocab_size", len(ByT5Tokenizer()))  # what the CLI fills in from the data
    initial = LoRA(FromConfig(**base), target_modules="all-linear").build().state_dict()
    for name, tensor in full.items():
        assert (not torch.equal(tensor, initial[name])) == ("lora_" in name), name  # base frozen, adapters trained


def test_lora_ddp_and_fsdp2_train_the_same_adapters(ddp_runs, fsdp_runs):
    assert _max_diff(_weights(ddp_runs, "ddp_lora_full"), _weights(fsdp_runs, "fsdp_lora_full")) <= TOL


def test_lora_resumes_exactly_from_a_sharded_checkpoint(fsdp_runs):
    runs = fsdp_runs
    assert _max_diff(_weights(runs, "fsdp_lora_full"), _weights(runs, "fsdp_lora_resumed")) <= TOL


@pytest.mark.parametrize("mode", ["all_full", "lora_full"])
def test_export_from_an_fsdp2_sharded_checkpoint(fsdp_runs, mode, tmp_path):
    """The FSDP2 run's final checkpoint (a folder of shards) exports to a folder that loads with
    from_pretrained and gives the logits of the trained policy (its full weights, gathered by the worker)."""
    runs = fsdp_runs
    from transformers import AutoModelForCausalLM

    from lit_prunedpo.export import export, load_policy

    ckpt = runs / "fsdp" / mode / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert ckpt.is_dir() and (ckpt / ".metadata").exists()
    export(str(ckpt), str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    trained, _ = load_policy(ckpt)
    trained.load_state_dict(_weights(runs, f"fsdp_{mode}"))  # what the live module held at the end
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, trained(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    out = exported.generate(input_ids=ids[:1], max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 12)


def test_fit_exports_at_the_end_under_fsdp2(fsdp_runs):
    """``--final.export_dir`` on a 2-process FSDP2 LoRA run: merged weights equal the trained adapters + base."""
    runs = fsdp_runs
    from transformers import AutoModelForCausalLM

    from lit_prunedpo.export import load_policy

    exported = AutoModelForCausalLM.from_pretrained(runs / "fsdp_lora_hf").eval()
    trained, _ = load_policy(runs / "fsdp/lora_full/lightning_logs/version_0/checkpoints/last.ckpt")
    trained.load_state_dict(_weights(runs, "fsdp_lora_full"))
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, trained(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
