"""``lit-prunedpo-bench-scaling``: each mode's step time and memory against model size and response length, measured
beside the cost model's and the memory model's predictions, and the predictions for real model shapes.

Writes ``scaling.json``, ``scaling.md`` and ``scaling.png`` (:mod:`lit_prunedpo_lab.bench.scaling_report`). Examples::

    lit-prunedpo-bench-scaling --out scaling_results/cpu                 # the default CPU grid, ~15 min on 1 core
    lit-prunedpo-bench-scaling --quick --out /tmp/scaling                # smoke test: seconds, no speedups stated
    lit-prunedpo-bench-scaling --real-shapes-only --out /tmp/real        # predictions only (seconds)
    lit-prunedpo-bench-scaling --dry-run --sizes d512l8,d2048l16 --vocab 32000 --dtype bfloat16 --device cuda
    python -m lit_prunedpo_lab.bench.scaling_cli --sizes xs,m --lengths 256,512
    lit-prunedpo-bench-scaling --model ../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --lengths 64,128,256 --modes vanilla,all --out /tmp/smollm2

``--model`` (a hub name, a ``save_pretrained`` folder or a ``.gguf`` file) runs the length sweep on that model, its
weights and shape, and no size sweep (a given model has one size); its shape joins the real shapes' predictions.

``--dry-run`` prints the grid (parameters, tokens, FLOPs and predicted vanilla step memory of every point, and a
rough duration at ``--flops-per-second``) and runs nothing; ``lab/scripts/gpu-scaling`` runs the GPU grid.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from lit_prunedpo_lab.bench.presets import MODES, REFERENCES, SCORERS

DEFAULT_SIZES = "xs,s,m,l,xl"
DEFAULT_LENGTHS = "256,512,1024,2048"
QUICK = dict(sizes="2xs,xs", lengths="16,32", length_size="2xs", size_length=16, prompt=8, size_batch=2,
             length_batch=1, vocab=256, steps=2, warmup=1)
#: Rough rate of this project's CPU steps on one core (float32), for --dry-run's duration estimate only.
CPU_FLOPS_PER_S = 6e10
#: The grid options of the random Llamas, refused with --model.
MODEL_EXCLUDES = ("sizes", "vocab", "length_size", "size_length", "size_batch")
STEP_OVERHEAD_S = 0.05  # per step: the memory meter's garbage-collector pass, and on the CPU its memory round


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"lengths must all be >= 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lit-prunedpo-bench-scaling",
        description="Per-step time and peak-memory ratios of each mode to vanilla against model size and response "
                    "length, measured (the benchmark's alternating rounds) beside the cost model's and the memory "
                    "model's predictions, with the prediction errors; then predictions for real model shapes. "
                    f"Default CPU grid: sizes {DEFAULT_SIZES} (1.2M-42M parameters, 35x, V=8192) at 256-token "
                    f"responses, 2 pairs; size m at {DEFAULT_LENGTHS}-token responses, 2 pairs; 64-token prompts; "
                    "1 warm-up round, 5 measured steps: about 15 minutes on one core of the 2-vCPU EPYC development "
                    "machine (estimated from its measured FLOP rate; --dry-run prints the estimate per point).",
    )
    g = p.add_argument_group("grid")
    g.add_argument("--sizes", type=_csv, default=None, help=f"size sweep, comma-separated names (2xs, xs, s, m, l, xl) "
                   f"or d<width>l<layers> (default {DEFAULT_SIZES}; empty '' skips the sweep)")
    g.add_argument("--lengths", type=_lengths, default=None, help=f"length sweep, response tokens (default "
                   f"{DEFAULT_LENGTHS}; empty '' skips the sweep)")
    g.add_argument("--size-length", type=int, default=None, help="response tokens of the size sweep (default 256)")
    g.add_argument("--length-size", default=None, help="model of the length sweep (default m)")
    g.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 64)")
    g.add_argument("--size-batch", type=int, default=None, help="pairs per step in the size sweep (default 2)")
    g.add_argument("--length-batch", type=int, default=None, help="pairs per step in the length sweep (default 2)")
    g.add_argument("--vocab", type=int, default=None, help="vocabulary of every model (default 8192)")
    g.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="measure the length sweep on this causal LM (hub name, save_pretrained folder or .gguf file; "
                        "parameters in --dtype, default float32) instead of random Llamas: no size sweep, and "
                        "--sizes, --vocab, --length-size, --size-length, --size-batch do not apply; its shape is "
                        "added to the real shapes' predictions")
    r = p.add_argument_group("run")
    r.add_argument("--modes", type=_csv, default=list(MODES), help=f"comma-separated, from {','.join(MODES)}, "
                   "vanilla included (default: all)")
    r.add_argument("--references", type=_csv, default=["online"], help="online,cached (default online)")
    r.add_argument("--scorers", type=_csv, default=["plain"], help="plain,chunked (default plain)")
    r.add_argument("--steps", type=int, default=None, help="measured steps per configuration (default 5)")
    r.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default 1)")
    r.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    r.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default float32")
    r.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on the CPU)")
    r.add_argument("--chunk-size", type=int, default=1024, help="the chunked scorer's chunk_size (default 1024)")
    r.add_argument("--seed", type=int, default=0)
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help="directory for scaling.json, scaling.md, scaling.png")
    o.add_argument("--quick", action="store_true", help="smoke test: sizes 2xs,xs, lengths 16,32, V=256, 2 steps "
                   "(seconds); states no speedups")
    o.add_argument("--real-shapes-only", action="store_true", help="only the real shapes' predictions")
    o.add_argument("--no-real-shapes", action="store_true", help="leave the real shapes' predictions out")
    o.add_argument("--real-shapes", type=_csv, default=None, help="comma-separated (default: all of them)")
    o.add_argument("--real-batch", type=int, default=8, help="pairs per step of the real shapes' batches (default 8)")
    o.add_argument("--dry-run", action="store_true", help="print the grid and its estimated duration, run nothing")
    o.add_argument("--flops-per-second", type=float, default=None, help="rate for --dry-run's estimate (default: "
                   f"{CPU_FLOPS_PER_S:.1e} on the CPU, 2e14 on CUDA)")
    o.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def settings_from(args: argparse.Namespace) -> Any:
    """The :class:`~lit_prunedpo_lab.bench.scaling.Settings` of parsed arguments (``--quick``'s grid, then each option
    given); ``ValueError`` on a bad one."""
    from lit_prunedpo_lab.bench.scaling import Settings, parse_size

    base = dict(sizes=DEFAULT_SIZES, lengths=DEFAULT_LENGTHS, length_size="m", size_length=256, prompt=64,
                size_batch=2, length_batch=2, vocab=8192, steps=5, warmup=1)
    if args.quick:
        base.update(QUICK)
    sizes = args.sizes if args.sizes is not None else _csv(base["sizes"])
    lengths = args.lengths if args.lengths is not None else _lengths(base["lengths"])
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else base[name]  # noqa: E731
    if args.model is not None:
        stray = [f"--{n.replace('_', '-')}" for n in MODEL_EXCLUDES if getattr(args, n) is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)} describe the random Llamas: with --model the sweep is over response "
                             "lengths on that model (a given model has one size)")
        sizes = []
    for name, values, allowed in (("modes", args.modes, MODES), ("references", args.references, REFERENCES),
                                  ("scorers", args.scorers, SCORERS)):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ValueError(f"--{name}: unknown or empty {bad or values}; choose from {','.join(allowed)}")
    return Settings(
        sizes=tuple(parse_size(s) for s in sizes), lengths=tuple(lengths), length_size=parse_size(pick("length_size")),
        size_length=pick("size_length"), prompt=pick("prompt"), size_batch=pick("size_batch"),
        length_batch=pick("length_batch"), vocab=pick("vocab"), modes=tuple(dict.fromkeys(args.modes)),
        references=tuple(dict.fromkeys(args.references)), scorers=tuple(dict.fromkeys(args.scorers)),
        steps=pick("steps"), warmup=pick("warmup"), device=args.device, dtype=args.dtype, chunk_size=args.chunk_size,
        seed=args.seed, smoke_test=args.quick, model=args.model,
    )


def plan_grid(settings: Any, rate: float, model_sizes: tuple[Any, Any] | None = None) -> list[str]:
    """What ``--dry-run`` prints: every point's size, tokens, FLOPs per round, predicted vanilla step memory and an
    estimated duration (FLOPs at ``rate``, plus the meter's overhead per step); ``model_sizes``: ``--model``'s
    ``(ModelDims, LayerDims)`` (:func:`model_sizes`)."""
    from dataclasses import replace

    from lit_prunedpo_lab.bench import cost
    from lit_prunedpo_lab.bench.batches import make_batches
    from lit_prunedpo_lab.bench.memory_model import predict_step, shapes_of
    from lit_prunedpo_lab.bench.real_shapes import dims_of, planned_forwards
    from lit_prunedpo_lab.bench.scaling import point_preset

    rounds = settings.warmup + settings.steps
    device = "cuda" if settings.device.startswith("cuda") else "cpu"
    lines, total = [], 0.0
    for point in settings.points():
        preset = point_preset(point, settings)
        dims, layer = dims_of("llama", preset.model) if point.size is not None else model_sizes
        batches = make_batches(replace(preset, model={"vocab_size": dims.vocab_size}), rounds, settings.seed)
        configs = len(settings.references) * len(settings.scorers)
        forwards = {m: planned_forwards(batches, m, settings.seed) for m in settings.modes}
        flops = configs * sum(cost.step_flops(f, dims, "online").total for fs in forwards.values() for f in fs)
        memory = max(predict_step(layer, *shapes_of(f), dtype=settings.dtype or "float32", device=device).peak
                     for f in forwards["vanilla"])
        seconds = flops / rate + STEP_OVERHEAD_S * rounds * configs * len(settings.modes)
        total += seconds
        tokens = forwards["vanilla"][0].tokens_executed
        lines.append(f"{point.sweep:6s} {point.name:9s} {layer.params / 1e6:8.1f}M params  "
                     f"{point.response:5d}-token responses x {point.batch}  vanilla {tokens:6d} tokens, step "
                     f"memory {memory / 2**20:8.0f} MiB (predicted)  {flops / 1e12:8.2f} TFLOP  ~{seconds:6.0f} s")
    lines.append(f"total ~{total / 60:.1f} min at {rate:.2g} FLOP/s ({rounds} rounds of {len(settings.modes)} modes "
                 "per point; real shapes add ~10 s)")
    return lines


def model_sizes(settings: Any) -> tuple[Any, Any]:
    """``--model``'s ``(ModelDims, LayerDims)``, read from the model loaded once (for ``--dry-run`` and
    ``--real-shapes-only``, which measure nothing).

    Raises:
        ValueError: its config lacks the Llama-style sizes the memory model reads.
    """
    from lit_prunedpo_lab.bench import cost
    from lit_prunedpo_lab.bench.memory_model import LayerDims
    from lit_prunedpo_lab.bench.own_model import pretrained_source

    model = pretrained_source(settings.model, settings.dtype).build()
    try:
        return cost.ModelDims.from_model(model), LayerDims.from_model(model)
    except (AttributeError, TypeError) as err:
        raise ValueError(f"--model {settings.model}: the memory model reads Llama-style config sizes: {err}") from err


def git_commit() -> str:
    """``git rev-parse --short HEAD`` of this checkout (``+ uncommitted changes`` when the tree is dirty), or
    ``unknown`` outside a git checkout."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True,
                               timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" + uncommitted changes" if dirty else "")


def context(argv: Sequence[str], settings: Any, device_name: str | None, measure: str | None) -> dict[str, Any]:
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
        "machine": f"{platform.platform()} ({platform.processor() or platform.machine()})", "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "python": platform.python_version(), "device": settings.device,
        "device_name": device_name or "n/a", "dtype": settings.dtype or "float32", "threads": torch.get_num_threads(),
        "memory_measure": measure or "n/a", "command": " ".join(["lit-prunedpo-bench-scaling", *argv]),
    }


def run(args: argparse.Namespace, settings: Any, argv: Sequence[str]) -> dict[str, Any]:
    """The sweeps (unless ``--real-shapes-only``) and the real shapes (unless ``--no-real-shapes``), as a payload."""
    from dataclasses import asdict

    from lit_prunedpo_lab.bench.real_shapes import REAL_SHAPES, real_shapes_payload
    from lit_prunedpo_lab.bench.scaling import run_scaling

    from lit_prunedpo_lab.bench import cost
    from lit_prunedpo_lab.bench.memory_model import LayerDims

    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    start = time.perf_counter()
    sweeps = {} if args.real_shapes_only else run_scaling(settings, log)
    real, extra = None, {}
    if settings.model is not None and not args.no_real_shapes:
        name = settings.points()[-1].name
        extra[name] = ((cost.ModelDims(**sweeps["model_dims"]), LayerDims(**sweeps["layer_dims"]))
                       if sweeps.get("layer_dims") else model_sizes(settings))
    if not args.no_real_shapes:
        names = args.real_shapes or list(REAL_SHAPES)
        real = real_shapes_payload(names, batch_size=args.real_batch, num_batches=2 if args.quick else 8,
                                   seed=args.seed, extra=extra)
    config = asdict(settings)
    config.update(sizes=[s.name for s in settings.sizes], length_size=settings.length_size.name)
    if settings.model is not None:  # the sweep's model is --model's: the random Llamas' settings do not apply
        config.update(length_size=settings.points()[-1].name, vocab=None, size_length=None, size_batch=None)
    return {
        "kind": "lit-prunedpo scaling", "smoke_test": settings.smoke_test and not args.real_shapes_only,
        "context": context(argv, settings, sweeps.get("device_name"), sweeps.get("memory_measure")),
        "settings": config, "sizes": sweeps.get("sizes", []), "rows": sweeps.get("rows", []),
        "summary": sweeps.get("summary", []), "skipped": sweeps.get("skipped", []), "real_shapes": real,
        "model": sweeps.get("model"),
        "elapsed_s": time.perf_counter() - start,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    argv = list(argv if argv is not None else sys.argv[1:])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.real_shapes_only and args.no_real_shapes:
        parser.error("--real-shapes-only and --no-real-shapes exclude each other")
    for name in ("threads", "real_batch"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        settings = settings_from(args)
        if args.model is not None:
            from lit_prunedpo_lab.bench.own_model import pretrained_source

            pretrained_source(args.model)  # a path that does not exist: refused before anything runs
        if args.real_shapes:
            from lit_prunedpo_lab.bench.real_shapes import REAL_SHAPES

            bad = [n for n in args.real_shapes if n not in REAL_SHAPES]
            if bad:
                raise ValueError(f"--real-shapes: unknown {bad}; choose from {','.join(REAL_SHAPES)}")
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    if args.dry_run:
        rate = args.flops_per_second or (2e14 if args.device.startswith("cuda") else CPU_FLOPS_PER_S)
        try:
            sizes = model_sizes(settings) if settings.model is not None else None
        except (ValueError, OSError) as error:
            parser.error(str(error))
        print("\n".join(plan_grid(settings, rate, sizes)))
        return 0
    import torch

    threads = args.threads if args.threads is not None else (1 if args.device == "cpu" else None)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        payload = run(args, settings, argv)
    finally:
        torch.set_num_threads(previous)  # main() may run inside another program (tests)
    from lit_prunedpo_lab.bench.scaling_report import to_markdown, write_report

    print(to_markdown(payload))
    if args.out:
        paths = write_report(payload, args.out)
        if "png" not in paths and payload["rows"]:
            print("scaling.png skipped: matplotlib is not installed (pip install 'matplotlib>=3.7')",
                  file=sys.stderr)
        print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
