"""``lit-prunedpo-bench``: time the pruning modes side by side and write bench.json / bench.md / bench.png.

Examples::

    lit-prunedpo-bench --preset small --out bench_results/small
    lit-prunedpo-bench --preset hh-body --modes vanilla,branch,all --prompts shared,padded --scorers plain
    lit-prunedpo-bench --preset quickstart --precision bf16-mixed --peer trl
    lit-prunedpo-bench --preset medium --modes vanilla,branch --references online,cached --scorers plain,chunked \\
        --out bench_results/medium
    lit-prunedpo-bench --preset hh-body --modes vanilla,all --compile --steps 20 --warmup 2
    python -m lit_prunedpo_lab.bench.cli --preset head-heavy --modes vanilla,position --scorers plain,chunked
    lit-prunedpo-bench --model ../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --data ../shared/data/hh-rlhf/harmless-base-test.jsonl.gz --modes vanilla,all --references cached

``--model`` measures a causal LM of your own instead of a preset's random one, ``--data`` pairs of your own through
the data module training runs (:mod:`lit_prunedpo_lab.bench.own_model`, :mod:`lit_prunedpo_lab.bench.own_data`).
``--compile`` times the exact steps eager against compiled instead (:mod:`lit_prunedpo_lab.bench.compiled`),
``--compare-precisions`` in several precisions, alternated (:mod:`lit_prunedpo_lab.bench.precisions`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from lit_prunedpo_lab.bench.peer_trl import PEERS
from lit_prunedpo_lab.bench.precision import PRECISIONS, TRUE_PRECISION, resolve_precision
from lit_prunedpo_lab.bench.presets import MODES, OWN_MODEL, PRESETS, PROMPTS, REFERENCES, SCORERS, Preset, get_preset

#: The options that describe ``--data`` (refused without it).
DATA_OPTIONS = ("tokenizer", "max_length", "max_prompt_length", "data_option")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lit-prunedpo-bench",
        description="Benchmark PrunedDPO training steps: every mode, alternating, on the same weights and batches.",
    )
    parser.add_argument(
        "--preset", default=None, choices=sorted(PRESETS),
        help="model and batch sizes (default: small, a smoke test that every configuration runs: it states no "
             "measured speedups; measure with quickstart or larger); excludes --model",
    )
    parser.add_argument("--modes", type=_csv, default=list(MODES),
                        help=f"comma-separated, from {','.join(MODES)} (default: all)")
    parser.add_argument(
        "--references", type=_csv, default=list(REFERENCES), help="comma-separated: online,cached (default: both)"
    )
    parser.add_argument("--scorers", type=_csv, default=list(SCORERS),
                        help="comma-separated: plain,chunked (default: both)")
    parser.add_argument(
        "--prompts", type=_csv, default=["shared"],
        help="comma-separated: shared,padded (model.shared_prompt on / off; default: shared)",
    )
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per configuration (default: the preset's)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default: the preset's)")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="the chunked scorer's chunk_size (default: the preset's)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    parser.add_argument("--precision", default=None, choices=list(PRECISIONS),
                        help="as Lightning's Trainer(precision=...), for every configuration and TRL peer: 32-true "
                             "(default), bf16-mixed / 16-mixed (float32 parameters, each step's forward under "
                             "torch.autocast to bfloat16 / float16, backward and optimizer outside it; 16-mixed with "
                             "a loss scaler), bf16-true / 16-true (16-bit parameters)")
    parser.add_argument("--dtype", default=None, choices=list(TRUE_PRECISION),
                        help="the older spelling of the parameters' dtype (policy, reference, TRL peer; --model's "
                             "checkpoint dtype is not kept unless named): alone, --dtype bfloat16 is --precision "
                             "bf16-true; with --precision it must be that precision's parameter dtype")
    parser.add_argument("--peer", type=_csv, default=[],
                        help="comma-separated: trl (precomputed reference), trl-online (TRL's reference model forward "
                             "in every step), trl-online-checkpointing (trl-online with DPOConfig's default activation "
                             "checkpointing): also time TRL's DPO step on the same weights and batches "
                             "(pip install -e '.[peer]')")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: the preset's, else torch's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, data and samplers")
    parser.add_argument("--out", default=None,
                        help="directory for bench.json, bench.md, bench.png (default: print only)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--compile", action="store_true",
                        help="time each of --modes' exact steps eager and with the model bodies compiled "
                             "(lit_prunedpo.callbacks.CompileModel's compilation), alternated; reports the speedup, "
                             "the graphs compiled after the warm-up rounds and the numbers' differences")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (default inductor)")
    parser.add_argument("--compile-mode", default=None, help="torch.compile's mode (default: torch's)")
    parser.add_argument("--compare-precisions", type=_csv, default=None, metavar="P1,P2,...",
                        help="time each of --modes' exact steps in each of these precisions (--precision's names, "
                             "e.g. 32-true,bf16-mixed,bf16-true), alternated in one run, with each one's utilisation "
                             "and its objective and gradient differences from the first")
    add_own_options(parser)
    return parser


def add_own_options(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--data`` and the data's options (shared by ``lit-prunedpo-bench-scaling``)."""
    own = parser.add_argument_group(
        "your own model and data", "--model and --preset exclude each other: with --model the settings are "
        "--steps (default 5), --warmup (1), --chunk-size (1024), --batch-size (4) and the batches --data's, else "
        "random tokens with HH-RLHF's lengths. bench.json records the model (path or hub name, file and weights "
        "SHA-256, shape, dtype) and the data (path, SHA-256, tokenizer, lengths, options).")
    own.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                     help="a causal LM to measure: hub name, save_pretrained folder or .gguf file "
                          "(lit_prunedpo.models.Pretrained), parameters in --dtype (default float32)")
    own.add_argument("--data", default=None, metavar="FILE",
                     help="preference pairs (.jsonl, .jsonl.gz, .json, .parquet, .csv or a save_to_disk folder) read "
                          "by PreferenceDataModule as training reads them; its first training batches are timed; "
                          "needs --model")
    own.add_argument("--tokenizer", default=None, help="the data's tokenizer (default: --model's own)")
    own.add_argument("--max-length", type=int, default=None, help="most tokens of prompt + response (default 512)")
    own.add_argument("--max-prompt-length", type=int, default=None, help="most prompt tokens (default 256)")
    own.add_argument("--batch-size", type=int, default=None,
                     help="pairs per step (default: the preset's; with --model 4)")
    own.add_argument("--data-option", action="append", default=[], metavar="KEY=VALUE",
                     help="another PreferenceDataModule argument, value as YAML (e.g. max_rows=500, val_fraction=0, "
                          "chat_template=FILE); repeatable")


def own_run(args: argparse.Namespace) -> tuple[Preset, Any, Any]:
    """The preset (or :data:`OWN_MODEL`'s settings), the ``--model`` source and the ``--data`` spec of parsed
    arguments (``None`` each when not given).

    Raises:
        ValueError: ``--model`` with ``--preset``, ``--data`` without ``--model``, a data option without ``--data``,
            a bad ``--data-option`` or ``--batch-size``.
        FileNotFoundError: ``--model`` or ``--data`` written as a path that does not exist.
    """
    from lit_prunedpo_lab.bench.own_data import DataSpec, parse_data_options
    from lit_prunedpo_lab.bench.own_model import pretrained_source

    if args.model is not None and args.preset is not None:
        raise ValueError("--model and --preset exclude each other: a preset is a random model of its own (with "
                         "--model give --steps, --warmup, --batch-size, --chunk-size)")
    if args.data is not None and args.model is None:
        raise ValueError("--data needs --model: a preset's random model has a vocabulary of its own")
    given = [name for name in DATA_OPTIONS if getattr(args, name) not in (None, [])]
    stray = [f"--{name.replace('_', '-')}" for name in given if args.data is None]
    if stray:
        raise ValueError(f"{', '.join(stray)} describe --data's pairs: give --data FILE")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    preset = OWN_MODEL if args.model is not None else get_preset(args.preset or "small")
    if args.batch_size is not None:
        preset = dataclasses.replace(preset, batch_size=args.batch_size)
    source = pretrained_source(args.model, args.dtype) if args.model is not None else None
    data = None if args.data is None else DataSpec(
        args.data, tokenizer=args.tokenizer or args.model, batch_size=preset.batch_size,
        max_length=args.max_length if args.max_length is not None else 512,
        max_prompt_length=args.max_prompt_length if args.max_prompt_length is not None else 256, seed=args.seed,
        options=parse_data_options(args.data_option))
    return preset, source, data



def _check_precision_here(precision: Any, device: str) -> None:
    """Refuse now an autocast torch does not run on ``device``; on a CPU, say when the precision's 16-bit matmuls run
    far slower there than float32's (:mod:`lit_prunedpo.cpu_16bit`: every timing would be of that fallback)."""
    import torch

    from lit_prunedpo.cpu_16bit import slow_16bit_here

    precision.stepper(torch.device(device))
    if torch.device(device).type == "cpu" and (slow := slow_16bit_here(precision.name)):
        print(f"lit-prunedpo-bench: warning: {slow}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark described by ``argv`` (``sys.argv[1:]`` if ``None``); returns the exit status."""
    parser = build_parser()
    argv = list(argv if argv is not None else sys.argv[1:])
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from lit_prunedpo_lab.bench.harness import run_benchmark
    from lit_prunedpo_lab.bench.report import to_markdown, write_report

    for name, values, allowed in (("--modes", args.modes, MODES), ("--references", args.references, REFERENCES),
                                  ("--scorers", args.scorers, SCORERS), ("--prompts", args.prompts, PROMPTS)):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            parser.error(f"{name}: unknown or empty {bad or values}; choose from {','.join(allowed)}")
    if bad_peers := [v for v in args.peer if v not in PEERS]:
        parser.error(f"--peer: unknown {bad_peers}; choose from {','.join(PEERS)}")
    try:
        precision = resolve_precision(args.precision, args.dtype)
        _check_precision_here(precision, args.device)
        args.dtype = precision.weights  # --model's parameters
        preset, source, data = own_run(args)
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    threads = args.threads if args.threads is not None else preset.threads
    if threads is not None and threads < 1:
        parser.error("--threads must be >= 1")
    if args.chunk_size is not None:
        if args.chunk_size < 1:
            parser.error("--chunk-size must be >= 1")
        preset = dataclasses.replace(preset, chunk_size=args.chunk_size)

    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    if args.compile or args.compare_precisions is not None:
        return variants_command(parser, args, argv, preset, source, data, precision, threads, log)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        payload = run_benchmark(
            preset, modes=args.modes, references=args.references, scorers=args.scorers, prompts=args.prompts,
            steps=args.steps, warmup=args.warmup, device=args.device, seed=args.seed, log=log,
            precision=precision.name, peer=args.peer or None, source=source, data=data,
        )
    except (ValueError, OSError) as err:
        if source is None or os.environ.get("LIT_PRUNEDPO_TRACEBACK") == "1":
            raise
        print(f"lit-prunedpo-bench: error: {err}", file=sys.stderr)  # --model's or --data's: one line
        return 2
    finally:
        torch.set_num_threads(previous_threads)  # main() may run inside another program (tests)
    payload["command"] = " ".join(["lit-prunedpo-bench", *argv])
    print(to_markdown(payload))
    if args.out:
        paths = write_report(payload, args.out)
        if "png" not in paths:
            print("bench.png skipped: matplotlib is not installed (pip install 'matplotlib>=3.7')", file=sys.stderr)
        print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0


def variants_command(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str], preset: Preset,
                     source: Any, data: Any, precision: Any, threads: int | None, log: Any) -> int:
    """``--compile`` (:mod:`lit_prunedpo_lab.bench.compiled`) or ``--compare-precisions``
    (:mod:`lit_prunedpo_lab.bench.precisions`) on the parsed arguments."""
    import torch

    from lit_prunedpo_lab.bench import compiled, precisions, variants
    from lit_prunedpo.compiling import CompileOptions

    compare = args.compare_precisions
    for given, name in ((args.peer, "--peer"), (args.compile and compare is not None, "--compile"),
                        (compare is not None and (args.precision or any(a.startswith("--dtype") for a in argv)),
                         "--precision/--dtype")):
        if given:
            parser.error(f"{name} does not go with {'--compile' if compare is None else '--compare-precisions'}")
    try:
        options = CompileOptions(backend=args.compile_backend, mode=args.compile_mode)
        chosen = [resolve_precision(name, None) for name in compare or []]
    except ValueError as err:
        parser.error(str(err))
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        steps, warmup = (args.steps or preset.steps), (args.warmup if args.warmup is not None else preset.warmup)
        module = data.data_module() if data is not None else None
        if compare is None:
            payload = compiled.compare_compiled(preset, args.modes, steps, warmup, options, precision, args.device,
                                                args.seed, source, module, log)
            markdown = compiled.to_markdown(payload)
        else:
            payload = precisions.compare_precisions(preset, args.modes, steps, warmup, chosen, args.device,
                                                    args.seed, args.model, module, log)
            markdown = variants.to_markdown(payload, f"Precisions compared, exact steps ({payload['preset']})")
    except ValueError as err:
        parser.error(str(err))
    finally:
        torch.set_num_threads(previous_threads)
    payload["command"] = " ".join(["lit-prunedpo-bench", *argv])
    print(markdown)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(payload, indent=1, default=str))
        (out / "bench.md").write_text(f"{markdown}\n\nCommand: `{payload['command']}`\n")
        print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
