"""Peak memory and step time of LoRA against full fine-tuning, online reference, on a benchmark preset.

Each configuration (``full`` or ``lora`` x a pruning mode) runs in its **own process**, so that its peak is
the whole process's lifetime peak resident set (``VmHWM``, never reset: what ``/usr/bin/time -v`` reports),
with no other configuration's memory in it. Full fine-tuning keeps a frozen copy of the policy as the online
reference and AdamW state for every weight; LoRA (``r=16`` on every linear layer but the LM head) scores
the reference with the adapters off and keeps AdamW state for the adapters only. Same synthetic batches,
samplers and seeds as ``lit-prunedpo-bench`` (``lit_prunedpo.bench.harness.make_batches``). Run from the
repository root::

    python examples/lora_memory.py --preset medium --modes vanilla,all --steps 6
    python examples/lora_memory.py --preset weight-heavy --modes vanilla,all --steps 3

Prints a markdown table: whole-process peak, the peak above the process's memory before the model was built
(imports excluded), parameters, trainable parameters, optimizer-state tensors' size, median step time. Step
times on a shared machine are noisy; memory is not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _presets() -> dict:
    """The benchmark's presets, plus ``weight-heavy``: a model whose weights, not its activations, dominate memory
    (Llama d=1024, 8 layers, V=32768, 170M parameters; 2 pairs of 32-64 response tokens), as with real LLMs."""
    import dataclasses

    from lit_prunedpo.bench.presets import PRESETS, Preset, _llama

    heavy = Preset(name="weight-heavy", description="Llama d=1024, 8 layers, V=32768; 2 pairs of 32-64 tokens",
                   model=_llama(32768, 1024, 8, 16, 2816, 512), batch_size=2, response_length=(32, 64), steps=3)
    return {**PRESETS, heavy.name: dataclasses.replace(heavy)}


def run_one(preset_name: str, policy_kind: str, mode: str, steps: int, warmup: int, rank: int) -> dict:
    import torch
    from functools import partial

    from lit_prunedpo import PrunedDPO
    from lit_prunedpo.bench.harness import make_batches
    from lit_prunedpo.bench.presets import MODES
    from lit_prunedpo.callbacks import _memory
    from lit_prunedpo.lora import LoRA
    from lit_prunedpo.models import FromConfig
    from lit_prunedpo.plan import plan_step

    import peft  # noqa: F401  (imported by both kinds before the start reading, so neither counts its import)

    preset = _presets()[preset_name]
    if preset.threads is not None:
        torch.set_num_threads(preset.threads)
    batches = make_batches(preset, warmup + steps, seed=0)
    before = _memory.read_rss_bytes()
    base = FromConfig("llama", preset.model, seed=0)
    source = base if policy_kind == "full" else LoRA(base, r=rank, alpha=2 * rank, target_modules="all-linear")
    module = PrunedDPO(policy=source, optimizer=partial(torch.optim.AdamW, lr=preset.lr)).train()
    optimizer = module.configure_optimizers()
    samplers = MODES[mode]()
    generator = torch.Generator().manual_seed(0)
    times = []
    for i, batch in enumerate(batches):
        start = time.perf_counter()
        plan = plan_step(batch, *samplers, generator=generator)
        est = module.execute_and_estimate(batch, plan)
        est.objective.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    state_bytes = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                      if torch.is_tensor(t))
    peak = _memory.read_peak_rss_bytes()
    mib = 1024 * 1024
    return {
        "policy": policy_kind, "mode": mode, "peak_mib": peak / mib, "peak_above_start_mib": (peak - before) / mib,
        "params": sum(p.numel() for p in module.parameters()),
        "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
        "optimizer_state_mib": state_bytes / mib, "median_step_s": statistics.median(times),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--modes", default="vanilla,all")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--one", nargs=2, metavar=("POLICY", "MODE"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.preset, args.one[0], args.one[1], args.steps, args.warmup, args.rank)))
        return 0
    rows = []
    for mode in args.modes.split(","):
        for kind in ("full", "lora"):
            cmd = [sys.executable, os.path.abspath(__file__), "--preset", args.preset, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--rank", str(args.rank), "--one", kind, mode]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"preset {args.preset}, {args.steps} measured steps after {args.warmup} warm-up, LoRA r={args.rank}, online reference")
    print("| policy | mode | peak RSS (MiB) | peak above start (MiB) | parameters | trainable | optimizer state (MiB) | median step (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['policy']} | {r['mode']} | {r['peak_mib']:.0f} | {r['peak_above_start_mib']:.0f} | {r['params']:,} | "
              f"{r['trainable']:,} | {r['optimizer_state_mib']:.1f} | {r['median_step_s']:.3f} |")
    for mode in args.modes.split(","):
        full, lora = (next(r for r in rows if r["mode"] == mode and r["policy"] == k) for k in ("full", "lora"))
        print(f"{mode}: full / LoRA peak RSS {full['peak_mib'] / lora['peak_mib']:.2f}x, "
              f"above start {full['peak_above_start_mib'] / lora['peak_above_start_mib']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
