"""``lit-prunedpo-bench``: time the pruning modes side by side and write bench.json / bench.md / bench.png.

Examples::

    lit-prunedpo-bench --preset small --out bench_results/small
    lit-prunedpo-bench --preset hh-body --modes vanilla,branch,all --prompts shared,padded --scorers plain
    lit-prunedpo-bench --preset medium --modes vanilla,branch --references online,cached --scorers plain,chunked \\
        --out bench_results/medium
    python -m lit_prunedpo.bench.cli --preset head-heavy --modes vanilla,position --scorers plain,chunked
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from lit_prunedpo.bench.presets import MODES, PRESETS, PROMPTS, REFERENCES, SCORERS, get_preset


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lit-prunedpo-bench",
        description="Benchmark PrunedDPO training steps: every mode, alternating, on the same weights and batches.",
    )
    parser.add_argument(
        "--preset", default="small", choices=sorted(PRESETS),
        help="model and batch sizes (default: small, a smoke test that every configuration runs: it states no "
             "measured speedups; measure with quickstart or larger)",
    )
    parser.add_argument("--modes", type=_csv, default=list(MODES), help=f"comma-separated, from {','.join(MODES)} (default: all)")
    parser.add_argument(
        "--references", type=_csv, default=list(REFERENCES), help="comma-separated: online,cached (default: both)"
    )
    parser.add_argument("--scorers", type=_csv, default=list(SCORERS), help="comma-separated: plain,chunked (default: both)")
    parser.add_argument(
        "--prompts", type=_csv, default=["shared"],
        help="comma-separated: shared,padded (model.shared_prompt on / off; default: shared)",
    )
    parser.add_argument("--steps", type=int, default=None, help="measured steps per configuration (default: the preset's)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default: the preset's)")
    parser.add_argument("--chunk-size", type=int, default=None, help="the chunked scorer's chunk_size (default: the preset's)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="parameter dtype of policy and reference (default: float32)")
    parser.add_argument("--peer", default=None, choices=["trl"],
                        help="also time TRL's DPO step (precomputed reference) on the same weights and batches "
                             "(pip install -e '.[peer]')")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the preset's, else torch's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, data and samplers")
    parser.add_argument("--out", default=None, help="directory for bench.json, bench.md, bench.png (default: print only)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import dataclasses

    import torch

    from lit_prunedpo.bench.harness import run_benchmark
    from lit_prunedpo.bench.report import to_markdown, write_report

    for name, values, allowed in (("--modes", args.modes, MODES), ("--references", args.references, REFERENCES), ("--scorers", args.scorers, SCORERS), ("--prompts", args.prompts, PROMPTS)):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            build_parser().error(f"{name}: unknown or empty {bad or values}; choose from {','.join(allowed)}")
    preset = get_preset(args.preset)
    threads = args.threads if args.threads is not None else preset.threads
    if threads is not None and threads < 1:
        build_parser().error("--threads must be >= 1")
    if args.chunk_size is not None:
        if args.chunk_size < 1:
            build_parser().error("--chunk-size must be >= 1")
        preset = dataclasses.replace(preset, chunk_size=args.chunk_size)

    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        payload = run_benchmark(
            preset, modes=args.modes, references=args.references, scorers=args.scorers, prompts=args.prompts, steps=args.steps,
            warmup=args.warmup, device=args.device, seed=args.seed, log=log, dtype=args.dtype, peer=args.peer,
        )
    finally:
        torch.set_num_threads(previous_threads)  # main() may run inside another program (tests)
    payload["command"] = " ".join(["lit-prunedpo-bench", *(argv if argv is not None else sys.argv[1:])])
    print(to_markdown(payload))
    if args.out:
        paths = write_report(payload, args.out)
        if "png" not in paths:
            print("bench.png skipped: matplotlib is not installed (pip install 'lit-prunedpo[bench]')", file=sys.stderr)
        print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
