"""Gradient noise of the control-variate position estimators against the batch's own noise, along a vanilla run.

For each task, a vanilla DPO run (the task's model, learning rate and batch) is stopped at a few checkpoints (by
default after 0, 50 and 200 steps); at each, on one fixed held-out batch of ``--pairs`` pairs, the noise model of
:mod:`lit_prunedpo.gradient_noise` is measured through the module's own step (plan, execute, estimate, backward):

* ``between``: the variance of the exact per-pair gradients;
* ``within``: each mode's extra within-pair variance, from ``--draws`` pruned steps against the exact batch gradient;
* ``k``: the FLOP cost model's ``flops(vanilla) / flops(mode)`` (:mod:`lit_prunedpo_lab.bench.cost`, which counts the
  estimators' extra target logits, ``2d`` FLOPs per executed token) over 20 plans of the batch, with the reference
  the mode runs with (``vanilla`` with the same reference is the baseline);
* ``(1 + within / between) / k``: the mode's gradient variance times cost relative to vanilla's (below 1: pruning
  buys more variance reduction per FLOP).

Modes: ``stratified-coupled`` (the best position design so far) and the two estimators around it,
``stratified-coupled-exact-targets`` (online reference, as trained) and ``stratified-coupled-reference-lse``
(a cache of the reference, with its log-sum-exps, for the measured batch). The modes are the shipped overlays
(``lit_prunedpo.modes``). Tasks: ``quickstart`` and ``edited`` (:mod:`lit_prunedpo_lab.study.tasks`) and ``unrelated``,
the regime map's unrelated-pairs cell with 64-token responses and the LM head 25 % of a step
(:class:`lit_prunedpo_lab.study.map_tasks.CellTask`).

    python lab/scripts/control_variate_variance.py                       # about 2 minutes on 1 CPU core
    python lab/scripts/control_variate_variance.py --tasks edited --steps 0,100,400 --draws 32
    python lab/scripts/control_variate_variance.py --quick               # seconds: what the test runs

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from lit_prunedpo import PrunedDPO  # noqa: E402
from lit_prunedpo_lab.bench import cost  # noqa: E402
from lit_prunedpo.gradient_noise import (  # noqa: E402
    between_variance, pair, relative_inefficiency, squared_distance, within_variance,
)
from lit_prunedpo.layout import PairLengths  # noqa: E402
from lit_prunedpo.modes import load_mode  # noqa: E402
from lit_prunedpo.step.plan import plan_step  # noqa: E402
from lit_prunedpo.reference import CachedReference, compute_reference_logps  # noqa: E402
from lit_prunedpo.step.io import StepParts  # noqa: E402

#: (mode, reference it runs with): the baseline design, then each estimator around it
MODES = (("stratified-coupled", "online"), ("stratified-coupled-exact-targets", "online"),
         ("stratified-coupled-reference-lse", "cached"))
TASK_NAMES = ("quickstart", "edited", "unrelated")


def make_task(name: str) -> Any:
    """The study task ``name``; ``unrelated`` is the map's unrelated-pairs cell (64-token responses, head 25 %), and
    a map cell's name (``near-duplicate-L64-head0.25``, ``unrelated-L256-head0.6``: similarity, response length, LM
    head share; batch 8) builds that cell."""
    from lit_prunedpo_lab.study.map_tasks import CellTask

    if name == "unrelated":
        return CellTask(length=64, similarity="unrelated", target_head_share=0.25, batch_size=8)
    cell = re.fullmatch(r"(near-duplicate|unrelated)-L(\d+)-head([0-9.]+)", name)
    if cell is not None:
        return CellTask(length=int(cell[2]), similarity=cell[1], target_head_share=float(cell[3]), batch_size=8)
    from lit_prunedpo_lab.study.tasks import TASKS

    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASK_NAMES)}, {', '.join(TASKS)} or a map "
                         "cell such as near-duplicate-L64-head0.25")
    return TASKS[name]


def parts_for(module: PrunedDPO, mode: str, reference: Any) -> StepParts:
    """The module's step parts with ``mode``'s samplers and ``reference``."""
    prefix, position, branch = load_mode(mode).samplers
    return dataclasses.replace(module.parts_with(prefix, position, branch), reference=reference)


def gradient(module: PrunedDPO, batch: Any, parts: StepParts, generator: torch.Generator) -> torch.Tensor:
    """The flattened policy gradient of one step of ``module`` with ``parts``."""
    module.zero_grad(set_to_none=True)
    module.step(batch, parts, generator).estimate.objective.backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in module.policy.parameters() if p.requires_grad])


def cost_ratio(module: PrunedDPO, batch: Any, mode: str, reference: str, plans: int = 20, seed: int = 0) -> float:
    """``flops(vanilla) / flops(mode)`` over ``plans`` plans of ``batch``, both with ``reference``, laid out as the
    module's steps lay them out."""
    dims = cost.ModelDims.from_model(module.policy)
    executor = module.executor()
    g = torch.Generator().manual_seed(seed)
    flops = {}
    for name in ("vanilla", mode):
        samplers = load_mode(name).samplers
        flops[name] = [cost.step_flops(executor.forwards(plan_step(batch, *samplers, g).groups, PairLengths.of(batch)),
                                       dims, reference=reference) for _ in range(plans)]
    return cost.ideal_speedup(flops["vanilla"], flops[mode])


def measure(module: PrunedDPO, batch: Any, cached: CachedReference, draws: int, seed: int) -> list[dict]:
    """``between`` once, then per mode ``within``, ``k`` and the relative inefficiency, on ``batch``."""
    g = torch.Generator().manual_seed(seed)
    exact_parts = parts_for(module, "vanilla", module.reference)
    between = between_variance(torch.stack([gradient(module, pair(batch, i), exact_parts, g)
                                            for i in range(batch.num_pairs)]))
    exact = gradient(module, batch, exact_parts, g)
    rows = [dict(mode="vanilla", reference="online", between=between, within=0.0, k=1.0)]
    for mode, reference in MODES:
        parts = parts_for(module, mode, cached if reference == "cached" else module.reference)
        distances = [squared_distance(gradient(module, batch, parts, g), exact) for _ in range(draws)]
        rows.append(dict(mode=mode, reference=reference, between=between,
                         within=within_variance(distances, batch.num_pairs),
                         k=cost_ratio(module, batch, mode, reference)))
    module.zero_grad(set_to_none=True)
    for row in rows:
        row["ratio"] = row["within"] / row["between"] if row["between"] > 0 else float("inf")
        row["inefficiency"] = relative_inefficiency(row["between"], row["within"], row["k"])
    return rows


def train(module: PrunedDPO, batches: Any, steps: int, optimizer: torch.optim.Optimizer) -> None:
    """``steps`` vanilla DPO steps on the cycling ``batches``; the reference stays the initial model."""
    parts = parts_for(module, "vanilla", module.reference)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        module.step(next(batches), parts, torch.Generator()).estimate.objective.backward()
        optimizer.step()


def run_task(name: str, checkpoints: Sequence[int], draws: int, pairs: int, seed: int) -> list[dict]:
    """Every checkpoint's rows for task ``name``."""
    task = make_task(name)
    with tempfile.TemporaryDirectory(prefix="cv-variance-") as work:
        data = task.datamodule(Path(work))
    data.batch_size = pairs
    batch = next(iter(data.val_dataloader()))  # held out: never trained on
    data.batch_size = task.batch_size
    training = itertools.cycle(data.train_dataloader())
    torch.manual_seed(seed)
    module = PrunedDPO(policy=task.policy(seed=seed))
    reference_model = module.reference.models()[0]
    cached = CachedReference.from_store(compute_reference_logps(reference_model, [batch], with_lse=True))
    optimizer = torch.optim.AdamW(module.policy.parameters(), lr=task.lr)  # one for the whole run
    rows, done = [], 0
    for step in sorted(checkpoints):
        train(module, training, step - done, optimizer)
        done = step
        for row in measure(module, batch, cached, draws, seed):
            rows.append(dict(task=name, step=step, **row))
    return rows


def print_table(rows: list[dict]) -> None:
    print("| task | step | mode | reference | between | within | within / between | k | (1 + within/between) / k |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['task']} | {r['step']} | {r['mode']} | {r['reference']} | {r['between']:.3g} | {r['within']:.3g} "
              f"| {r['ratio']:.3g} | {r['k']:.3f} | {r['inefficiency']:.3g} |", flush=True)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASK_NAMES),
                        help=f"comma-separated (default {','.join(TASK_NAMES)})")
    parser.add_argument("--steps", default="0,50,200",
                        help="checkpoints of the vanilla run, in steps (default 0,50,200)")
    parser.add_argument("--draws", type=int, default=12, help="pruned steps per mode and checkpoint (default 12)")
    parser.add_argument("--pairs", type=int, default=8, help="pairs in the measured batch (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="one task, checkpoints 0 and 2, 2 draws of 3 pairs")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.steps, args.draws, args.pairs = "quickstart", "0,2", 2, 3
    checkpoints = [int(s) for s in args.steps.split(",") if s]
    if not checkpoints or min(checkpoints) < 0 or args.draws < 1 or args.pairs < 2:
        parser.error("need checkpoints >= 0, --draws >= 1 and --pairs >= 2")
    torch.set_num_threads(1)
    start = time.perf_counter()
    rows = []
    for name in [t for t in args.tasks.split(",") if t]:
        rows += run_task(name, checkpoints, args.draws, args.pairs, args.seed)
    print_table(rows)
    print(f"\n{args.pairs} held-out pairs per task, {args.draws} draws per mode; {time.perf_counter() - start:.0f} s")
    return rows


if __name__ == "__main__":
    main()
