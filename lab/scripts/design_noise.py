"""Branch designs for near-duplicate pairs under the noise model: ``between``, each design's ``within``, its cost ratio
``k``.

Two generated map cells (near-duplicate and unrelated pairs; 64-token responses, LM head 25 % of a step,
8 pairs) and a batch mixing them (4 pairs of each; both cells have the same model, so one module serves all
three), at the initial weights as :func:`lit_prunedpo_lab.study.noise.measure` measures them (or warmed first, the
warmed model then its own reference): ``between`` from the exact per-pair gradients, ``within`` from ``--draws``
real pruned steps of each design, ``k`` the FLOP cost model's ``flops(vanilla) / flops(design)`` over 20 plans
of the same batch, and the model's prediction (pruning has the lower variance at equal cost per step iff
``within < (k - 1) between``). The target-logit control variate needs a scorer the package does not have yet,
so its rows are hand-rolled on the same draws, beside a hand-rolled copy of the shipped estimator::

    python lab/scripts/design_noise.py --draws 24                          # about 2 minutes on 2 shared CPU cores
    python lab/scripts/design_noise.py --draws 24 --warm-start-steps 200   # the same after 200 NLL steps
    python lab/scripts/design_noise.py --coefficient-bias                  # item 4, exact enumeration, seconds

Prints Markdown tables (the ones in docs/samplers.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import tempfile
from pathlib import Path

import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench import cost
from lit_prunedpo.losses.margin import SigmoidLoss
from lit_prunedpo.step.plan import exact_plan, plan_step
from lit_prunedpo.samplers import (
    AllPositions, AntitheticBranch, BernoulliPositions, BothBranches, CoupledStratifiedPositions, DivergentBranch,
    FullPrefix,
    RandomBranch, StratifiedPositions,
)
from lit_prunedpo.scoring import TokenScorer, group_inputs, split_causal_lm
from lit_prunedpo_lab.study.arms import Arm
from lit_prunedpo_lab.study.map_tasks import CellTask
from lit_prunedpo_lab.study.noise import between_variance, pair, predict, squared_distance, within_variance
from lit_prunedpo_lab.study.runner import make_run
from lit_prunedpo_lab.study.warm_start import warm_start
from lit_prunedpo.modes import samplers_of
from lit_prunedpo.testing import coefficient_bias

# design -> its samplers: the shipped modes from configs/modes (lit_prunedpo.modes), the new designs spelled out;
# DivergentBranch is bound to each batch as the planner binds it (see docs/samplers.md)
DESIGNS = {
    **{f"{name} (shipped)": functools.partial(samplers_of, name)
       for name in ("vanilla", "stratified-coupled", "branch", "antithetic")},
    "coupled stratified 0.125, min_count=8 (new)": lambda: (
        FullPrefix(), CoupledStratifiedPositions(0.125, min_count=8), BothBranches()),
    "divergent branch 0.5 (new)": lambda: (FullPrefix(), AllPositions(), DivergentBranch(0.5)),
}


def bound(samplers, batch):
    prefix, position, branch = samplers
    return prefix, position, branch.for_batch(batch.response_ids.cpu(), batch.response_mask.cpu())


def gradient(module, batch, samplers, generator) -> torch.Tensor:
    module.zero_grad(set_to_none=True)
    prefix, position, branch = bound(samplers, batch)
    parts = module.parts_with(prefix, position, branch)
    module.step(batch, parts, generator).estimate.objective.backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in module.policy.parameters() if p.requires_grad])


def cost_ratio(batch, samplers, dims, generator, plans: int = 20) -> float:
    vanilla = [cost.step_flops(plan_step(batch, *DESIGNS["vanilla (shipped)"](), generator),
                               dims) for _ in range(plans)]
    pruned = [cost.step_flops(plan_step(batch, *bound(samplers, batch), generator), dims) for _ in range(plans)]
    return cost.ideal_speedup(vanilla, pruned)


def cell_batch(similarity: str, seed: int, warm_steps: int = 0, work_dir: Path | None = None):
    """The cell's vanilla run (its module at the initial weights, or warmed by ``warm_steps`` of NLL on the
    chosen responses and then its own reference) and its first training batch."""
    task = CellTask(length=64, similarity=similarity, target_head_share=0.25, batch_size=8)
    with tempfile.TemporaryDirectory(prefix="design-noise-") as tmp:
        dm = task.datamodule(Path(tmp))
    policy = warm_start(task, seed, dm, work_dir, warm_steps)[0] if warm_steps > 0 else None
    run = make_run(task, Arm("vanilla", task.batch_size), seed, dm, policy=policy)
    return task, run.module, next(iter(run.loader))


def mixed_batch(near, unrelated) -> PreferenceBatch:
    """The first half of a near-duplicate batch and the second half of an unrelated one (same widths)."""
    half = near.num_pairs // 2
    return PreferenceBatch(**{f.name: torch.cat([getattr(near, f.name)[:half], getattr(unrelated, f.name)[half:]])
                              for f in dataclasses.fields(near)})


def measure_cell(name: str, module, batch, draws: int, seed: int) -> list[dict]:
    dims = cost.ModelDims.from_model(module.policy)
    g = torch.Generator().manual_seed(seed)
    exact_samplers = DESIGNS["vanilla (shipped)"]()
    per_pair = torch.stack([gradient(module, pair(batch, i), exact_samplers, g) for i in range(batch.num_pairs)])
    between = between_variance(per_pair)
    exact = gradient(module, batch, exact_samplers, g)
    rows = []
    for design, make in DESIGNS.items():
        if design == "vanilla":
            continue
        within = within_variance([squared_distance(gradient(module, batch, make(), g), exact) for _ in range(draws)],
                                 batch.num_pairs)
        k = cost_ratio(batch, make(), dims, g)
        rows.append(dict(cell=name, design=design, between=between, within=within, k=k,
                         ratio=within / between, prediction=predict(between, within, k)))
    return rows


def token_terms(module, batch):
    """Per response token of every row, in the exact plan's order: ``(row, t, z, lse)``, ``z`` the target's logit
    ``h_t . W_y`` (2d FLOPs) and ``lse`` the log-partition ``logsumexp(W h_t)`` (the 2dV head), both with a graph."""
    group = exact_plan(batch).groups[0]
    inputs = group_inputs(batch, group)
    body, head = split_causal_lm(module.policy)
    hidden = TokenScorer().hidden_states(body, inputs)[inputs.gather_row, inputs.gather_col]
    logits = head(hidden).float()
    z = logits.gather(-1, inputs.targets[:, None]).squeeze(-1)
    return group.pair[group.scored_row] * 2 + group.branch[group.scored_row], group.scored_t, z, logits.logsumexp(-1)


def control_variate_rows(name: str, module, batch, draws: int, seed: int, dims) -> list[dict]:
    """The target-logit control variate, hand-rolled at margin 0 (policy = reference, so the coefficient is the
    constant ``f'(0) = -beta / 2``): ``R_hat_b = sum_t z_t + sum_{t in S} (-lse_t) / p_t``, the exact target logits
    of every token plus the IPW sum of the log-partition at the scored ones, against the shipped
    ``sum_{t in S} (z_t - lse_t) / p_t``, both with the same ``CoupledStratifiedPositions`` draws. Its ``k`` is the
    position sampler's: the extra ``h_t . W_y`` of the unscored tokens costs ``1 / V`` of the head they skip."""
    params = [p for p in module.policy.parameters() if p.requires_grad]
    slot, t, z, lse = token_terms(module, batch)
    B, T = batch.num_pairs, batch.response_width
    sign = torch.tensor([1.0, -1.0]).repeat(B)[slot]
    coefficient = -module.beta / 2

    def grad(weights_z, weights_lse, pair_index=None):
        per_token = coefficient * sign * (weights_z * z - weights_lse * lse)
        total = per_token[slot // 2 == pair_index].sum() if pair_index is not None else per_token.sum() / B
        return torch.cat([g.flatten() for g in torch.autograd.grad(total, params, retain_graph=True)])

    ones = torch.ones_like(z)
    between = between_variance(torch.stack([grad(ones, ones, i) for i in range(B)]))
    exact = grad(ones, ones)
    lengths = batch.response_lengths.reshape(-1)
    rows = []
    for rate in (0.25, 0.1):
        sampler, g = CoupledStratifiedPositions(rate), torch.Generator().manual_seed(seed)
        k = cost_ratio(batch, (FullPrefix(), sampler, BothBranches()), dims, g)
        inclusion = sampler.inclusion(lengths, T)[slot, t].float()
        shipped, cv = [], []
        for _ in range(draws):
            w = sampler.draw(lengths, T, g)[slot, t].float() / inclusion
            shipped.append(squared_distance(grad(w, w), exact))
            cv.append(squared_distance(grad(ones, w), exact))
        for design, d in ((f"stratified-coupled {rate}, hand-rolled", shipped),
                          (f"stratified-coupled {rate} + target-logit CV (new)", cv)):
            within = within_variance(d, B)
            rows.append(dict(cell=name, design=design, between=between, within=within, k=k, ratio=within / between,
                             prediction=predict(between, within, k)))
    return rows


def coefficient_table(seed: int) -> None:
    """Item 4, exactly by enumeration (:func:`lit_prunedpo.testing.coefficient_bias`): one pair of 8-token
    responses, per-token log-ratios ``N(+-margin / 16, 0.5^2)`` and random 16-dimensional token gradients, the
    sigmoid loss at beta 0.1; the bias of the coefficient at the pruned margin, and the variance a coefficient
    at the exact margin would leave."""
    g = torch.Generator().manual_seed(seed)
    print("| margin (mean) | sampler | bias / exact gradient | variance | variance, exact coefficient |")
    print("| --- | --- | --- | --- | --- |")
    for margin in (0.0, 10.0, 30.0):
        for sampler in (BernoulliPositions(0.25, min_expected=2), StratifiedPositions(0.25)):
            rho = torch.randn(2, 8, generator=g, dtype=torch.float64) * 0.5
            rho[0] += margin / 16
            rho[1] -= margin / 16
            r = coefficient_bias(sampler, rho, torch.randn(2, 8, 16, generator=g, dtype=torch.float64), SigmoidLoss(),
                                 0.1)
            print(f"| {margin:g} | {type(sampler).__name__}(0.25) | {r.bias_norm / r.exact_norm:.3f} | "
                  f"{r.variance / r.exact_norm ** 2:.2f} | {r.variance_exact_coefficient / r.exact_norm ** 2:.2f} |")
    print("(variances relative to |exact gradient|^2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=30, help="pruned steps per design (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-start-steps", type=int, default=0,
                        help="first fit the model to the near-duplicate cell's chosen responses (NLL) for this many "
                             "steps; it is then its own reference (default 0: the initial weights)")
    parser.add_argument("--coefficient-bias", action="store_true",
                        help="print item 4's table instead: the coefficient's bias by exact enumeration (seconds)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.coefficient_bias:
        coefficient_table(args.seed)
        return
    print("| cell | design | between | within | within / between | k | (k - 1) | prediction |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    work_dir = Path(tempfile.mkdtemp(prefix="design-noise-warm-"))
    # one module serves all three batches: the near-duplicate cell's (warmed on its chosen responses)
    near_task, module, near = cell_batch("near-duplicate", args.seed, args.warm_start_steps, work_dir)
    unrelated_task, _, unrelated = cell_batch("unrelated", args.seed)
    if near_task.model != unrelated_task.model or near.response_width != unrelated.response_width:
        raise RuntimeError("the two cells differ in model or widths: their batches cannot be mixed")
    cells = {"near-duplicate": near, "unrelated": unrelated, "mixed (4 + 4)": mixed_batch(near, unrelated)}
    for name, batch in cells.items():
        dims = cost.ModelDims.from_model(module.policy)
        for r in measure_cell(name, module, batch, args.draws,
                              args.seed) + control_variate_rows(name, module, batch, args.draws, args.seed, dims):
            print(f"| {r['cell']} | {r['design']} | {r['between']:.3g} | {r['within']:.3g} | {r['ratio']:.3g} | "
                  f"{r['k']:.2f} | {r['k'] - 1:.2f} | {r['prediction']} |", flush=True)


if __name__ == "__main__":
    main()
