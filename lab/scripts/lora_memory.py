"""Peak memory and step time of LoRA against full fine-tuning, online reference, on a benchmark preset.

Each configuration (``full`` or ``lora`` x a pruning mode) runs in its **own process**, ``--repeats`` times
(the median is printed), so that its peak is the whole process's lifetime peak resident set (``VmHWM``, never
reset: what ``/usr/bin/time -v`` reports), with no other configuration's memory in it.

The children run with glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_``, 128 KiB by default): glibc
otherwise raises the threshold each time a large block is freed (up to 32 MiB), after which activation-sized
blocks come from the heap, where freed ones stay resident. The peak RSS then measures how the allocator's heap
fragmented more than what the step needed; it made vanilla LoRA on ``medium`` peak ~300 MiB *above* full
fine-tuning although LoRA's peak of live tensors is ~120 MiB *below* it (torch profiler memory events). A
fixed threshold returns every large block to the system when freed, for both configurations alike:
``--mmap-threshold 0`` keeps glibc's default to see the effect. Full fine-tuning keeps a frozen copy of the policy as
the online reference and AdamW state for every weight; LoRA (``r=16`` on every linear layer but the LM head) scores
the reference with the adapters off and keeps AdamW state for the adapters only. Same synthetic batches,
samplers and seeds as ``lit-prunedpo-bench`` (``lit_prunedpo_lab.bench.batches.make_batches``). Run from the
repository root::

    python lab/scripts/lora_memory.py --preset medium --modes vanilla,all --steps 3 --repeats 3
    python lab/scripts/lora_memory.py --preset weight-heavy --modes vanilla,all --steps 1 --repeats 3

Prints a markdown table: whole-process peak, the peak above the process's memory before the model was built
(imports excluded), parameters, trainable parameters, optimizer-state tensors' size, the model state (weights
of policy and reference, gradients of the trainable ones, optimizer state) and its share of the peak above
start, median step time; then, per mode, the full / LoRA ratios and the most LoRA could save on that preset (all
of full fine-tuning's reference copy, gradients and optimizer state, none of its activations). Step times on a
shared machine are noisy; memory is not.
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

    from lit_prunedpo_lab.bench.presets import PRESETS, Preset, llama_config

    heavy = Preset(name="weight-heavy", description="Llama d=1024, 8 layers, V=32768; 2 pairs of 32-64 tokens",
                   model=llama_config(32768, 1024, 8, 16, 2816, 512), batch_size=2, response_length=(32, 64), steps=3)
    return {**PRESETS, heavy.name: dataclasses.replace(heavy)}


def run_one(preset_name: str, policy_kind: str, mode: str, steps: int, warmup: int, rank: int) -> dict:
    import torch
    from functools import partial

    from lit_prunedpo import PrunedDPO
    from lit_prunedpo_lab.bench.batches import make_batches
    from lit_prunedpo_lab.bench.presets import MODES
    from lit_prunedpo.callbacks import PeakMemoryMeter
    from lit_prunedpo.lora import LoRA
    from lit_prunedpo.models import FromConfig
    from lit_prunedpo.step.plan import plan_step

    import peft  # noqa: F401  (imported by both kinds before the start reading, so neither counts its import)

    preset = _presets()[preset_name]
    if preset.threads is not None:
        torch.set_num_threads(preset.threads)
    batches = make_batches(preset, warmup + steps, seed=0)
    # the lifetime peak (never reset: module docstring), and the resident set before the model is built
    meter = PeakMemoryMeter(torch.device("cpu"), mode="cpu_lifetime")
    meter.start()
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
    weight_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    reading = meter.stop()
    if reading is None:
        raise RuntimeError(f"this machine cannot read peak memory: {meter.measure}")
    mib = 1024 * 1024
    return {
        "model_state_mib": (weight_bytes + grad_bytes + state_bytes) / mib,
        "policy": policy_kind, "mode": mode, "peak_mib": reading.peak / mib,
        "peak_above_start_mib": reading.above_start / mib,
        "params": sum(p.numel() for p in module.parameters()),
        "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
        "optimizer_state_mib": state_bytes / mib, "median_step_s": statistics.median(times),
    }


def _median_row(runs: list[dict]) -> dict:
    """One configuration's row: the median of each figure over its processes."""
    return {k: statistics.median(r[k] for r in runs) if isinstance(v, float) else v for k, v in runs[0].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--modes", default="vanilla,all")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--repeats", type=int, default=3, help="processes per configuration; the median is printed")
    parser.add_argument("--mmap-threshold", type=int, default=128 * 1024,
                        help="MALLOC_MMAP_THRESHOLD_ of the children in bytes; 0: glibc's default (dynamic)")
    parser.add_argument("--one", nargs=2, metavar=("POLICY", "MODE"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.preset, args.one[0], args.one[1], args.steps, args.warmup, args.rank)))
        return 0
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    env = dict(os.environ)
    if args.mmap_threshold > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    rows = []
    for mode in args.modes.split(","):
        for kind in ("full", "lora"):
            cmd = [sys.executable, os.path.abspath(__file__), "--preset", args.preset, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--rank", str(args.rank), "--one", kind, mode]
            runs = [json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
                               .stdout.strip().splitlines()[-1]) for _ in range(args.repeats)]
            rows.append(_median_row(runs))
    allocator = (f"MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}" if args.mmap_threshold > 0
                 else "glibc's default (dynamic) mmap threshold")
    print(f"preset {args.preset}, {args.steps} measured steps after {args.warmup} warm-up, LoRA r={args.rank}, "
          f"online reference, {allocator}, median of {args.repeats} processes")
    print("| policy | mode | peak RSS (MiB) | peak above start (MiB) | parameters | trainable | optimizer state (MiB) "
          "| weights + grads + optimizer (MiB) | share of peak above start | median step (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['policy']} | {r['mode']} | {r['peak_mib']:.0f} | {r['peak_above_start_mib']:.0f} | "
              f"{r['params']:,} | {r['trainable']:,} | {r['optimizer_state_mib']:.1f} | {r['model_state_mib']:.0f} | "
              f"{r['model_state_mib'] / r['peak_above_start_mib']:.0%} | {r['median_step_s']:.3f} |")
    for mode in args.modes.split(","):
        full, lora = (next(r for r in rows if r["mode"] == mode and r["policy"] == k) for k in ("full", "lora"))
        # LoRA keeps the activations of full fine-tuning (the gradient still flows through every frozen layer), so
        # it can save at most the difference of the model states: the reference copy, gradients, optimizer state.
        saved = full["model_state_mib"] - lora["model_state_mib"]
        bound = full["peak_above_start_mib"] / (full["peak_above_start_mib"] - saved)
        print(f"{mode}: full / LoRA peak RSS {full['peak_mib'] / lora['peak_mib']:.2f}x, "
              f"above start {full['peak_above_start_mib'] / lora['peak_above_start_mib']:.2f}x "
              f"(at most {bound:.2f}x with the same activations: the model states differ by {saved:.0f} MiB of "
              f"full fine-tuning's {full['peak_above_start_mib']:.0f} MiB above start)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
