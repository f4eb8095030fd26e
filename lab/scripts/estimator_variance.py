"""Measure what pruning costs in gradient quality: the residual bias and the noise of each mode's gradient.

On the quickstart's model (perturbed away from its reference, so margins are not zero) and one batch of the
quickstart's data, the exact DPO gradient ``g`` is computed once; then each mode draws ``--draws`` pruned
gradients ``g_i`` through the real step (plan, execute, estimate, backward). Reported per mode:

* **bias**: ``|mean_i g_i - g| / |g|``, with the Monte Carlo standard error of that mean beside it. Branch
  pruning alone is exactly unbiased (bias within noise); with position/prefix pruning the coefficient
  ``f'(Delta_hat)`` of a noisy margin leaves a residual bias (the estimator is unbiased conditionally on it);
* **noise**: ``sqrt(mean_i |g_i - g|^2) / |g|``, the per-step relative error a single pruned step makes;
* **cosine**: mean cosine similarity of ``g_i`` with ``g``;
* the fraction of tokens executed and positions scored.

``--task edited`` (or ``edited-start``) measures the same on the study's one-edit pairs and model
(:mod:`lit_prunedpo_lab.study.tasks`), where the two responses of a pair are near-duplicates: there the coupled
position samplers (one draw per pair shared by both branches) should cut the noise of their uncoupled twins.
``--skip-common-prefix`` does what a training step with the shared prompt does for a margin loss: positions of
the two responses' common prefix are not scored (their log-ratios cancel exactly in the margin).

    python lab/scripts/estimator_variance.py [--draws 200] [--pairs 16] [--task quickstart|edited|edited-start]
        [--skip-common-prefix] [--shared-prompt] [--modes sequence,branch]

The modes are the shipped overlays ``configs/modes/<mode>.yaml`` (:mod:`lit_prunedpo.modes`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
import yaml  # noqa: E402

from lit_prunedpo import PrunedDPO  # noqa: E402
from lit_prunedpo.data import PreferenceDataModule  # noqa: E402
from lit_prunedpo.models import FromConfig  # noqa: E402
from lit_prunedpo.step.execute import layout_for  # noqa: E402
from lit_prunedpo.modes import load_mode  # noqa: E402
from lit_prunedpo.step.plan import exact_samplers, plan_step  # noqa: E402

# the quickstart's model, read from its config so that the two cannot drift apart
QUICKSTART_POLICY = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/quickstart.yaml").read_text())[
    "model"]["policy"]["init_args"]
# shipped modes (configs/modes/<name>.yaml), each against the exact gradient
MODES = ("branch", "antithetic", "sequence", "position", "stratified", "all", "position-coupled",
         "stratified-coupled", "all-coupled")


def gradient(module: PrunedDPO, batch, samplers, generator, skip_common: bool = False,
             shared_prompt: bool = False) -> tuple[torch.Tensor, object, float]:
    """One pruned gradient through the module's own plan -> execute -> estimate, and the share of an unpruned
    step's tokens its forwards ran."""
    module.policy.zero_grad()
    plan = plan_step(batch, *samplers, generator=generator, score_common_prefix=not skip_common)
    logps = module.execute(batch, plan, dataclasses.replace(module.parts, layout=layout_for(shared_prompt)))
    module.estimate(batch, plan, logps).objective.backward()
    grad = torch.cat([p.grad.flatten() for p in module.policy.parameters()])
    return grad, plan, logps.forwards.tokens_executed / plan.unpruned_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--perturbation", type=float, default=0.05, help="std of the noise added to the policy")
    parser.add_argument("--task", choices=("quickstart", "edited", "edited-start"), default="quickstart")
    parser.add_argument("--skip-common-prefix", action="store_true",
                        help="do not score the responses' common prefix, as a shared-prompt training step does")
    parser.add_argument("--shared-prompt", action="store_true",
                        help="run the shared-prompt layout (the default of training), so 'tokens executed' counts "
                             "packed blocks; the gradients are the same in both layouts")
    parser.add_argument("--modes", default="", help="run only the modes whose name contains one of these "
                                                     "comma-separated words (default: all)")
    args = parser.parse_args()
    torch.manual_seed(0)

    if args.task == "quickstart":
        data = PreferenceDataModule(tokenizer="byt5", max_length=64, max_prompt_length=24, batch_size=args.pairs)
        data.setup("fit")
        policy = FromConfig(**QUICKSTART_POLICY)
    else:
        from lit_prunedpo_lab.study.tasks import TASKS

        with tempfile.TemporaryDirectory() as work_dir:
            data = TASKS[args.task].datamodule(Path(work_dir))
        data.batch_size = args.pairs
        policy = TASKS[args.task].policy(seed=0)
    batch = next(iter(data.train_dataloader()))
    module = PrunedDPO(policy=policy)
    with torch.no_grad():
        for p in module.policy.parameters():
            p.add_(args.perturbation * torch.randn_like(p))

    exact = gradient(module, batch, exact_samplers(), torch.Generator())[0]
    norm = float(exact.norm())
    print(f"{args.pairs} pairs of the {args.task} data, its model perturbed by N(0, {args.perturbation}^2); "
          f"{args.draws} draws per mode; common prefix {'not ' if args.skip_common_prefix else ''}scored; "
          f"|g| = {norm:.4g}\n")
    print("| mode | bias (± s.e.) | noise | cosine | tokens executed | positions scored |")
    print("| --- | --- | --- | --- | --- | --- |")
    g = torch.Generator().manual_seed(1)
    wanted = [w for w in args.modes.split(",") if w]
    for name in MODES:
        if wanted and not any(w in name for w in wanted):
            continue
        samplers = load_mode(name).samplers
        draws, tokens, positions = [], 0.0, 0.0
        for _ in range(args.draws):
            grad, plan, token_share = gradient(module, batch, samplers, g, args.skip_common_prefix,
                                               args.shared_prompt)
            draws.append(grad)
            tokens += token_share
            positions += plan.positions_scored / plan.unpruned_positions
        stacked = torch.stack(draws)
        mean = stacked.mean(0)
        bias = float((mean - exact).norm()) / norm
        # standard error of the mean's distance: sqrt(trace of the covariance / n) / |g|
        se = math.sqrt(float(stacked.var(0).sum()) / args.draws) / norm
        noise = math.sqrt(float(((stacked - exact) ** 2).sum(1).mean())) / norm
        cosine = float(torch.nn.functional.cosine_similarity(stacked, exact[None], dim=1).mean())
        n = args.draws
        print(f"| {name} | {bias:.3f} (± {se:.3f}) | {noise:.2f} | {cosine:.3f} | {tokens / n:.2f} | "
              f"{positions / n:.2f} |")


if __name__ == "__main__":
    main()
