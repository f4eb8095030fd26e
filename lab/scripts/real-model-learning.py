"""Does exact DPO align a real model? Vanilla DPO from SmolLM2-135M-Instruct on HH-RLHF, through the user's own
command (``lit-prunedpo fit --config configs/smollm2_hh.yaml`` and its ``# offline:`` overrides), once per seed;
the held-out exact loss and preference accuracy of each run's last validation, with their mean and a 95 % t-interval
over the seeds, against ln 2 and 0.5 (the values every pair has before the first step: policy = reference).

    python lab/scripts/real-model-learning.py --out docs/records/real-model/learning [--seeds 0,1,2] [--steps 60] \
        [--resume]
    python lab/scripts/real-model-learning.py --out learning-gpu --accelerator gpu \
        --model HuggingFaceTB/SmolLM2-135M-Instruct

Each seed is the data module's seed: it draws both the held-out pairs and the training order (exact DPO has no other
randomness), so the interval covers the choice of held-out pairs too. Settings are cut to a 2-core CPU (written into
``learning.json`` and the table): 192 tokens per sequence, batch 8, one pass over 480 pairs, bf16-mixed. Seed 0's run
exports its model (``--export``), for ``lab/scripts/real-model-samples.py``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Student t 0.975 quantiles by degrees of freedom (no scipy needed)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
GGUF = SHARED / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
DATA = SHARED / "data/hh-rlhf/harmless-base-test.jsonl.gz"


def offline_overrides() -> list[str]:
    """The recipe's ``# offline:`` line, as its header gives it (the checks hold the header to what runs)."""
    for line in (REPO / "configs/smollm2_hh.yaml").read_text().splitlines():
        if line.startswith("# offline:"):
            words = line.removeprefix("# offline:").split()
            return [word.replace("../shared", str(SHARED)) for word in words[4:]]  # after `lit-prunedpo fit --config X`
    raise SystemExit("configs/smollm2_hh.yaml has no '# offline:' line")


def command(args: argparse.Namespace, seed: int, root: Path, export: Path | None) -> list[str]:
    cmd = ["lit-prunedpo", "fit", "--config", str(REPO / "configs/smollm2_hh.yaml"), *offline_overrides(),
           "--seed_everything", str(seed), "--data.init_args.seed", str(seed),
           "--data.init_args.val_fraction", str(args.val_fraction),
           "--data.init_args.max_length", str(args.max_length),
           "--data.init_args.max_prompt_length", str(args.max_prompt_length),
           "--data.init_args.batch_size", str(args.batch_size), "--trainer.max_steps", str(args.steps),
           "--trainer.val_check_interval", str(args.steps // 2), "--trainer.precision", args.precision,
           "--trainer.limit_val_batches", "1.0",
           "--model.optimizer.init_args.lr", str(args.lr),
           "--model.scheduler.init_args.warmup_steps", str(max(1, args.steps // 10)),
           "--trainer.default_root_dir", str(root)]
    # given last, so they replace the offline line's CPU and local copies (a GPU, a hub name)
    for value, keys in ((args.accelerator, ["--trainer.accelerator"]), (args.data, ["--data.init_args.path"]),
                        (args.model, ["--model.policy.init_args.name_or_path", "--data.init_args.tokenizer"])):
        if value is not None:
            cmd += [word for key in keys for word in (key, str(value))]
    # the export is written from the final checkpoint; other seeds write none (1.6 GB each with Adam's moments)
    return cmd + (["--final.export_dir", str(export)] if export is not None
                  else ["--trainer.enable_checkpointing", "false"])


def last_validation(root: Path) -> dict:
    """The last row of the run's metrics.csv that has a validation loss."""
    rows = [row for path in sorted(root.rglob("metrics.csv")) for row in csv.DictReader(path.open())]
    val = [row for row in rows if row.get("val/loss")]
    if not val:
        raise SystemExit(f"{root}: no validation row in metrics.csv")
    return {"step": int(float(val[-1]["step"])), "val_loss": float(val[-1]["val/loss"]),
            "val_accuracy": float(val[-1]["val/rewards/accuracies"]),
            "curve": [(int(float(r["step"])), float(r["val/loss"]), float(r["val/rewards/accuracies"])) for r in val]}


def interval(values: list[float]) -> tuple[float, float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = T975[len(values) - 1] * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


def table(records: list[dict], settings: dict) -> str:
    loss = interval([r["val_loss"] for r in records])
    acc = interval([r["val_accuracy"] for r in records])
    lines = [
        f"Vanilla DPO from SmolLM2-135M-Instruct, HH-RLHF harmless-base, {len(records)} seeds "
        f"({', '.join(str(r['seed']) for r in records)}); {settings['steps']} steps of {settings['batch_size']} pairs, "
        f"lr {settings['lr']:g}, {settings['precision']}, {settings['max_length']} tokens; held-out: "
        f"{settings['val_fraction']:.0%} of the pairs, exact objective.",
        "",
        "| seed | held-out loss | held-out accuracy | run s (load, train, 2 evals) |",
        "|---|---|---|---|",
        *[f"| {r['seed']} | {r['val_loss']:.4f} | {r['val_accuracy']:.3f} | {r['wall_s']:.0f} |" for r in records],
        f"| **mean [95 % interval]** | **{loss[0]:.4f} [{loss[1]:.4f}, {loss[2]:.4f}]** | "
        f"**{acc[0]:.3f} [{acc[1]:.3f}, {acc[2]:.3f}]** | |",
        "",
        f"Before the first step: loss ln 2 = {math.log(2):.4f}, accuracy 0 (every margin is 0). "
        f"Interval below ln 2: {'yes' if loss[2] < math.log(2) else 'NO'}; above 0.5: "
        f"{'yes' if acc[1] > 0.5 else 'NO'}.",
    ]
    return "\n".join(lines) + "\n"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--max-length", type=int, default=192)
    parser.add_argument("--max-prompt-length", type=int, default=128)
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--export", type=Path, default=None, help="export seed 0's model here")
    parser.add_argument("--resume", action="store_true", help="keep the records of seeds already run")
    parser.add_argument("--accelerator", default=None, help="Lightning's accelerator (default: the offline line's cpu)")
    parser.add_argument("--model", default=None, help="model and tokenizer: a hub name, folder or .gguf file "
                                                      "(default: the offline line's GGUF under ../shared)")
    parser.add_argument("--data", default=None, help="the pairs file (default: the offline line's, under ../shared)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    # options left at None are not settings: records written before they existed still resume
    settings = {k: v for k, v in vars(args).items()
                if k not in ("out", "seeds", "export", "resume") and v is not None}
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "records.jsonl"
    records = [json.loads(line) for line in store.open()] if args.resume and store.exists() else []
    if records and records[0]["settings"] != settings:
        raise SystemExit(f"{store} ran with {records[0]['settings']}, not {settings}: drop --resume or match them")
    if not args.resume:
        store.write_text("")
    done = {r["seed"] for r in records}
    for seed in [int(s) for s in args.seeds.split(",")]:
        if seed in done:
            continue
        root = Path(os.environ.get("TMPDIR", "/tmp")) / f"real-model-learning-{seed}"
        shutil.rmtree(root, ignore_errors=True)
        cmd = command(args, seed, root, args.export if seed == 0 else None)
        print(f"seed {seed}: {' '.join(cmd)}", flush=True)
        start = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=REPO)
        record = {"seed": seed, **last_validation(root), "wall_s": time.perf_counter() - start,
                  "settings": settings, "command": " ".join(cmd)}
        print(f"seed {seed}: step {record['step']} held-out loss {record['val_loss']:.4f} "
              f"accuracy {record['val_accuracy']:.3f}", flush=True)
        records.append(record)
        with store.open("a") as f:
            f.write(json.dumps(record) + "\n")
    records.sort(key=lambda r: r["seed"])
    (args.out / "table.md").write_text(table(records, settings))
    print((args.out / "table.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
