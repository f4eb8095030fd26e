"""Runs under ``torchrun`` (2 processes): several real-CLI fits in one process group, to keep the tests short.

    torchrun --nproc_per_node 2 tests/distributed/worker.py OUT {ddp,fsdp} [--nodes N]

Writes, from rank 0, ``OUT/<run>.pt`` (full policy weights after the run), ``OUT/<run>.json`` (metrics)
and ``OUT/plans.json`` (per-rank gradient masks of the first steps).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from lit_prunedpo.cli import build_cli  # noqa: E402
from lit_prunedpo.distributed import destroy_process_groups  # noqa: E402
from lit_prunedpo.samplers import BranchSampler  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class RankSkewedBranch(BranchSampler):
    """Rank 0 back-propagates both branches (one row group), other ranks one branch per pair (two groups):
    a custom sampler that breaks "every rank runs the same forwards"."""

    def probabilities(self, num_pairs: int) -> torch.Tensor:
        p = 1.0 if int(os.environ.get("RANK", 0)) == 0 else 0.5
        return torch.full((num_pairs, 2), p, dtype=torch.float64)

    def draw(self, num_pairs: int, generator: torch.Generator) -> torch.Tensor:
        if int(os.environ.get("RANK", 0)) == 0:
            return torch.ones(num_pairs, 2, dtype=torch.bool)
        chosen = torch.rand(num_pairs, generator=generator) < 0.5
        return torch.stack([chosen, ~chosen], dim=1)


def full_policy_state(cli) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    policy = cli.model.policy
    if any(hasattr(p, "full_tensor") for p in policy.parameters()):
        return get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}


def check_tied_embeddings(out: Path, rank: int) -> None:
    """Tied input/output embeddings under ``shard_causal_lm``: gradients equal an unsharded model's."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoConfig, AutoModelForCausalLM

    from lit_prunedpo.distributed import shard_causal_lm

    config = AutoConfig.for_model("llama", vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    plain = copy.deepcopy(model)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    shard_causal_lm(model, init_device_mesh("cpu", (dist.get_world_size(),)))
    ids = torch.randint(1, 32, (2, 2, 6), generator=torch.Generator().manual_seed(1))

    def loss(m, rows):  # body and head called separately, as TokenScorer does
        hidden = m.base_model(input_ids=rows, use_cache=False).last_hidden_state
        return m.get_output_embeddings()(hidden).log_softmax(-1)[..., 0].mean()

    loss(model, ids[rank]).backward()
    (sum(loss(plain, ids[r]) for r in range(2)) / 2).backward()
    diff = max(float((p.grad.full_tensor() - q.grad).abs().max()) for p, q in zip(model.parameters(),
                                                                                  plain.parameters()))
    if rank == 0:
        (out / "fsdp_tied.json").write_text(json.dumps({"max_grad_diff": diff}))


def check_corrupt_distributed_checkpoint(out: Path, cli) -> None:
    """A distributed checkpoint folder with a garbage ``.metadata`` is refused on every rank, naming the folder,
    before any training step."""
    bad = out / "fsdp_corrupt.ckpt"
    if int(os.environ["RANK"]) == 0:
        bad.mkdir(exist_ok=True)
        (bad / ".metadata").write_bytes(b"not a checkpoint" * 10)
    dist.barrier()
    step, mesh = cli.trainer.global_step, cli.model.device_mesh
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(bad))
        message = "no error"
    except Exception as err:  # the test asserts on the message
        message = f"{type(err).__name__}: {err}"
    result = {"message": message, "stepped": cli.trainer.global_step != step,
              "mesh_kept": cli.model.device_mesh is mesh}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if int(os.environ["RANK"]) == 0:
        (out / "fsdp_corrupt.json").write_text(json.dumps(gathered))


def check_atomic_sharded_save(out: Path, cli) -> None:
    """A sharded save that dies mid-write (every rank: a full disk) leaves the previous ``last.ckpt`` folder
    whole and a temporary folder that resume names and ignores; the next save replaces both."""
    import warnings
    from unittest import mock

    import lightning.pytorch.strategies.model_parallel as model_parallel

    from lit_prunedpo.checkpoint import checkpoint_problem, resolve_resume

    rank, trainer = int(os.environ["RANK"]), cli.trainer
    last = Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"
    trainer.save_checkpoint(last)  # replaces the existing folder of shards
    before = {p.name: p.read_bytes() for p in last.iterdir()}

    def disk_full(state, path, **kwargs):
        (Path(path) / f"__{rank}_0.distcp").write_bytes(b"half a shard")
        raise OSError(28, "No space left on device")

    with mock.patch.object(model_parallel, "_distributed_checkpoint_save", disk_full):
        try:
            trainer.save_checkpoint(last)
            message = "no error"
        except OSError as err:
            message = str(err)
    dist.barrier()
    result = {"message": message, "unchanged": {p.name: p.read_bytes() for p in last.iterdir()} == before,
              "after_crash": sorted(p.name for p in last.parent.iterdir() if p.name.startswith(".last"))}
    if rank == 0:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result["resolved"] = resolve_resume(trainer, "last")
        result["warnings"] = [str(w.message) for w in caught]
        result["problem"] = checkpoint_problem(last)
        result["last"] = str(last)
    dist.barrier()
    trainer.save_checkpoint(last)
    result["after_next_save"] = sorted(p.name for p in last.parent.iterdir() if p.name.startswith(".last"))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if rank == 0:
        (out / "fsdp_atomic.json").write_text(json.dumps(gathered))


def main() -> None:
    out, strategy = Path(sys.argv[1]), sys.argv[2]
    nodes = int(sys.argv[sys.argv.index("--nodes") + 1]) if "--nodes" in sys.argv else 1
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    strat = ("--trainer.strategy=ddp" if strategy == "ddp"
             else '--trainer.strategy={"class_path": "lit_prunedpo.distributed.FSDP2Strategy"}')
    common = [
        "--trainer.accelerator=cpu", f"--trainer.devices={world // nodes}", f"--trainer.num_nodes={nodes}", strat,
        "--trainer.precision=32-true", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--trainer.log_every_n_steps=1", "--trainer.check_val_every_n_epoch=null",
        # the quickstart (under every mode overlay) already carries PeakMemoryMonitor and StepTimeMonitor
        "--data.init_args.max_rows=192", "--data.init_args.val_fraction=0.25",
    ]
    plans: dict[str, list] = {}
    finished_runs: list = []

    def run(name: str, mode: str, steps: int, *extra: str, ckpt: str | None = None, record_plans: bool = False):
        root = out / strategy / name
        # a pruning mode is an overlay composed after the quickstart; other configs stand alone
        overlay = REPO / f"configs/modes/{mode}.yaml"
        configs = (["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(overlay)] if overlay.exists()
                   else ["--config", str(REPO / f"configs/{mode}.yaml")])
        cli = build_cli([*configs, *common, f"--trainer.max_steps={steps}",
                         f"--trainer.val_check_interval={steps}", f"--trainer.default_root_dir={root}", *extra],
                        run=False)
        if record_plans:
            original = cli.model.plan

            def plan(batch, *args):
                p = original(batch, *args)
                plans.setdefault(name, []).append(p.grad_mask.tolist())
                return p

            cli.model.plan = plan
        # Keep every run's objects (and so its device mesh's process groups) alive until the final
        # destroy_process_group: a gloo group garbage-collected between two fits in one process can abort it
        # ("terminate called without an active exception"). One fit per process, as the CLI runs, never does.
        finished_runs.append(cli)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
        metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
        state = full_policy_state(cli)
        if rank == 0:
            torch.save(state, out / f"{strategy}_{name}.pt")
            (out / f"{strategy}_{name}.json").write_text(json.dumps(metrics))
        return cli

    run("vanilla", "vanilla", 2, *(["--model.gradient_checkpointing=true"] if strategy == "fsdp" else []))
    run("all_full", "all", 4, record_plans=True)
    half = run("all_half", "all", 2)
    ckpt = next(p for p in (out / strategy / "all_half").rglob("*.ckpt"))
    run("all_resumed", "all", 4, ckpt=str(ckpt))
    # LoRA with the adapters-off reference; the fsdp run also exports at the end of fit (rank 0 reads the shards)
    run("lora_full", "lora", 4, *([f"--final.export_dir={out / 'fsdp_lora_hf'}"] if strategy == "fsdp" else []))
    if strategy == "fsdp":  # a sharded LoRA checkpoint resumes too (single-file ones: tests/test_lora.py)
        run("lora_half", "lora", 2)
        run("lora_resumed", "lora", 4,
            ckpt=str(out / strategy / "lora_half/lightning_logs/version_0/checkpoints/last.ckpt"))
    if strategy == "fsdp":
        run("skewed", "all", 2, "--model.branch_sampler=worker.RankSkewedBranch", record_plans=True)
    if strategy == "fsdp":  # the default position mode on a head FSDP2 shards: the fallback it warns about
        position = run("position", "position", 2)
        if rank == 0:
            (out / "fsdp_position_sampler.json").write_text(json.dumps(type(position.model.position_sampler).__name__))
    if strategy == "fsdp":
        check_tied_embeddings(out, rank)
        check_corrupt_distributed_checkpoint(out, half)
        check_atomic_sharded_save(out, half)
    gathered = [None] * world
    dist.all_gather_object(gathered, plans)
    if rank == 0:
        (out / f"{strategy}_plans.json").write_text(json.dumps(gathered))
    del half
    dist.barrier()  # every rank is done with every collective before any of them destroys the groups


if __name__ == "__main__":
    try:
        main()
    finally:
        # after a failed run too: a process group left for interpreter shutdown aborts the process now and then
        # ("terminate called without an active exception"), and the log then ends with that, not with the error
        destroy_process_groups()
