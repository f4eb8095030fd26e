"""Issue 17 item 5's designs under the noise model: ``between``, each design's ``within`` and its cost ratio ``k``.

For two generated map cells (near-duplicate and unrelated pairs; 64-token responses, LM head 25 % of a step,
8 pairs), at the cell's initial weights as :func:`lit_prunedpo.study.noise.measure` does: ``between`` from the
exact per-pair gradients, ``within`` from ``--draws`` real pruned steps of each design, ``k`` the FLOP cost
model's ``flops(vanilla) / flops(design)`` over 20 plans of the same batch, and the model's prediction
(pruning has the lower variance at equal cost per step iff ``within < (k - 1) between``)::

    python examples/design_noise.py --draws 30

Prints a Markdown table (the one in docs/samplers.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import torch

from lit_prunedpo.bench import cost
from lit_prunedpo.plan import plan_step
from lit_prunedpo.samplers import (
    AllPositions, AntitheticBranch, BothBranches, CoupledStratifiedPositions, DivergentBranch, FullPrefix,
    RandomBranch,
)
from lit_prunedpo.study.arms import Arm
from lit_prunedpo.study.map_tasks import CellTask
from lit_prunedpo.study.noise import between_variance, pair, predict, squared_distance, within_variance
from lit_prunedpo.study.runner import make_run

# name -> (samplers, shipped mode it is closest to); DivergentBranch is bound to the batch below
DESIGNS = {
    "vanilla": lambda: (FullPrefix(), AllPositions(), BothBranches()),
    "stratified-coupled (shipped)": lambda: (FullPrefix(), CoupledStratifiedPositions(0.25), BothBranches()),
    "stratified-coupled min_count=8 (new)": lambda: (FullPrefix(), CoupledStratifiedPositions(0.125, min_count=8), BothBranches()),
    "branch (shipped)": lambda: (FullPrefix(), AllPositions(), RandomBranch(0.5)),
    "antithetic (shipped)": lambda: (FullPrefix(), AllPositions(), AntitheticBranch()),
    "divergent 0.5 (new)": lambda: (FullPrefix(), AllPositions(), DivergentBranch(0.5)),
}


def bound(samplers, batch):
    prefix, position, branch = samplers
    return prefix, position, branch.for_batch(batch.response_ids.cpu(), batch.response_mask.cpu())


def gradient(module, batch, samplers, generator) -> torch.Tensor:
    module.zero_grad(set_to_none=True)
    prefix, position, branch = bound(samplers, batch)
    parts = dataclasses.replace(module.parts, prefix_sampler=prefix, position_sampler=position, branch_sampler=branch)
    module.step(batch, parts, generator).estimate.objective.backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in module.policy.parameters() if p.requires_grad])


def cost_ratio(batch, samplers, dims, generator, plans: int = 20) -> float:
    vanilla = [cost.step_flops(plan_step(batch, *DESIGNS["vanilla"](), generator), dims) for _ in range(plans)]
    pruned = [cost.step_flops(plan_step(batch, *bound(samplers, batch), generator), dims) for _ in range(plans)]
    return cost.ideal_speedup(vanilla, pruned)


def measure_cell(similarity: str, draws: int, seed: int) -> list[dict]:
    task = CellTask(length=64, similarity=similarity, target_head_share=0.25, batch_size=8)
    with tempfile.TemporaryDirectory(prefix="design-noise-") as tmp:
        dm = task.datamodule(Path(tmp))
    run = make_run(task, Arm("vanilla", task.batch_size), seed, dm)
    module, batch = run.module, next(iter(run.loader))
    dims = cost.ModelDims.from_model(module.policy)
    g = torch.Generator().manual_seed(seed)
    exact_samplers = DESIGNS["vanilla"]()
    per_pair = torch.stack([gradient(module, pair(batch, i), exact_samplers, g) for i in range(batch.num_pairs)])
    between = between_variance(per_pair)
    exact = gradient(module, batch, exact_samplers, g)
    rows = []
    for name, make in DESIGNS.items():
        if name == "vanilla":
            continue
        within = within_variance([squared_distance(gradient(module, batch, make(), g), exact) for _ in range(draws)],
                                 batch.num_pairs)
        k = cost_ratio(batch, make(), dims, g)
        rows.append(dict(cell=similarity, design=name, between=between, within=within, k=k,
                         ratio=within / between, prediction=predict(between, within, k)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=30, help="pruned steps per design (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| cell | design | between | within | within / between | k | (k - 1) | prediction |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for similarity in ("near-duplicate", "unrelated"):
        for r in measure_cell(similarity, args.draws, args.seed):
            print(f"| {r['cell']} | {r['design']} | {r['between']:.3g} | {r['within']:.3g} | {r['ratio']:.3g} | "
                  f"{r['k']:.2f} | {r['k'] - 1:.2f} | {r['prediction']} |", flush=True)


if __name__ == "__main__":
    main()
