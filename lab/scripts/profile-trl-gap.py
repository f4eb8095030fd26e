"""Where a training step spends its time: this project's exact vanilla step against TRL's ``DPOTrainer`` step, both
with an online reference, profiled with ``torch.profiler`` on the same weights and the same batches.

    OMP_NUM_THREADS=1 python lab/scripts/profile-trl-gap.py --threads 1 --out docs/records/real-model/profile

Everything is built by the bench's own code (:func:`lit_prunedpo_lab.bench.rounds.build_rounds` with the ``--model`` /
``--data`` objects ``lit-prunedpo-bench`` builds): SmolLM2-135M-Instruct (the shared GGUF, float32) on HH-RLHF
harmless-base test pairs (``dialogues=messages``, ``on_bad_row=skip``, max length 192, max prompt length 128, 4
pairs per batch), the settings of ``docs/records/real-model/bench-fp32/bench.json``. Batch 0 warms up one step of each;
batches 1 and 2 are profiled, alternating (ours, TRL, ours, TRL), each step in a profiler session of its own
(CPU activity, ``record_shapes=True``). Ours is :func:`~lit_prunedpo_lab.bench.rounds.train_step` (the module's own
step, backward, AdamW); TRL's is :meth:`~lit_prunedpo_lab.bench.peer_trl.TRLPeer.step` (``compute_loss``, backward,
AdamW) on its collated inputs, built before the profiled step as the bench builds them before its timed one.

Labels (``record_function`` ranges, added without changing what runs): ``prof::step`` around each step;
``prof::body`` around the policy's body module (embeddings, attention, MLP, norms: ``model.model``, by forward
hooks); ``prof::reference`` around the whole reference scoring (ours: the online reference's ``online_model()``
context, in which the executor runs the frozen model's body, head and log-softmax; TRL: its ``ref_model``'s forward,
which runs its body, fused head and log-softmax). Every profiled op's **self** CPU time goes to exactly one category,
the first rule that matches (an op's ancestors are the ranges and ops that enclose it):

1. optimizer: under ``Optimizer.step`` or ``Optimizer.zero_grad`` (torch's own ranges);
2. backward: under ``autograd::engine`` (the autograd engine's ranges), or started after the step's first one;
   **head and log-softmax** where the op or one enclosing it has an input with a vocabulary-sized dimension
   (recorded shapes: ours' ``[positions, V]`` logits' gradients, the head's weight) or runs under the backward of
   TRL's fused head (``ChunkedLogProbFunctionBackward``, which tiles the vocabulary), else **body and rest**;
3. reference forward: under ``prof::reference``;
4. policy body: under ``prof::body``;
5. LM head: a matmul op (``linear``, ``matmul``, ``mm``, ``addmm``, ``bmm``) or under one (outside the body and
   the reference these are the head's projection: ours in the scorer, TRL's in its fused head);
6. padding/copies: a copy or layout op (``cat``, ``pad``, ``index``, ``copy_``, ``to``, ...; :data:`COPIES`) or
   under one;
7. log-softmax/gather/loss: any other ``aten::`` op (log-softmax, logsumexp, gather, the DPO loss's arithmetic);
8. other: everything else, and ``prof::step``'s own self time (Python between ops: planning, hooks, bookkeeping).

Self times of the events under ``prof::step`` add up to its duration, so the categories sum to the profiled step
time; the difference is stated (``unattributed_s``). Profiling slows the steps; the table compares the two
profiled steps, not the bench's timings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from lit_prunedpo_lab.bench.own_data import DataSpec
from lit_prunedpo_lab.bench.own_model import pretrained_source
from lit_prunedpo_lab.bench.presets import OWN_MODEL
from lit_prunedpo_lab.bench.rounds import build_rounds, train_step
from lit_prunedpo.head import body_name

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
GGUF = SHARED / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
DATA = SHARED / "data/hh-rlhf/harmless-base-test.jsonl.gz"

CATEGORIES = ("policy body", "reference forward", "LM head", "log-softmax/gather/loss", "padding/copies",
              "backward: head and log-softmax", "backward: body and rest", "optimizer", "other")
#: ops whose time (their own and their children's) is the LM head's outside the body and the reference
MATMULS = {"aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm"}
#: copy and layout ops (their own time and their children's)
COPIES = {"aten::cat", "aten::pad", "aten::constant_pad_nd", "aten::index", "aten::index_select", "aten::copy_",
          "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::stack", "aten::masked_select",
          "aten::index_put_", "aten::_index_put_impl_", "aten::nonzero", "aten::masked_fill", "aten::masked_fill_",
          "aten::full", "aten::zeros", "aten::new_zeros", "aten::fill_", "aten::zero_", "aten::empty_like",
          "aten::split", "aten::narrow", "aten::flip", "aten::repeat", "aten::expand_as", "aten::roll"}
#: which token count each category's work scales with (``None``: not with tokens), for the account
SCALES_WITH = {"policy body": "tokens", "reference forward": "reference_tokens", "LM head": "head_positions",
               "log-softmax/gather/loss": "head_positions", "padding/copies": "tokens",
               "backward: head and log-softmax": "head_positions", "backward: body and rest": "tokens",
               "optimizer": None, "other": None}


class Labels:
    """``record_function`` ranges around module forwards (forward pre- and post-hooks)."""

    def __init__(self) -> None:
        self.open: list[Any] = []

    def watch(self, module: torch.nn.Module, label: str) -> None:
        def enter(*_: Any) -> None:
            self.open.append(record_function(label).__enter__())

        def leave(*_: Any) -> None:
            self.open.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)


def label_context(source: Any, label: str) -> None:
    """``source.online_model()``'s context inside a ``record_function(label)`` range (the instance's method wrapped,
    what it runs unchanged)."""
    inner = source.online_model

    class Wrapped:
        def __enter__(self) -> Any:
            self.range = record_function(label).__enter__()
            self.ctx = inner()
            return self.ctx.__enter__()

        def __exit__(self, *exc: Any) -> Any:
            try:
                return self.ctx.__exit__(*exc)
            finally:
                self.range.__exit__(None, None, None)

    source.online_model = Wrapped


def category(event: Any, backward_start: float, vocab: int) -> str:
    """The category of one profiled event's self time (the module docstring's rules, in order)."""
    chain, shapes, e = [], [], event
    while e is not None and e.name != "prof::step":
        chain.append(e.name)
        shapes.extend(s for s in (e.input_shapes or []) if isinstance(s, (list, tuple)))
        e = e.cpu_parent
    if any(n.startswith("Optimizer.") for n in chain):
        return "optimizer"
    if any(n.startswith("autograd::engine") for n in chain) or event.time_range.start >= backward_start:
        vocab_sized = any(vocab in s for s in shapes) or any("ChunkedLogProbFunction" in n for n in chain)
        return "backward: head and log-softmax" if vocab_sized else "backward: body and rest"
    if "prof::reference" in chain:
        return "reference forward"
    if "prof::body" in chain:
        return "policy body"
    if any(n in MATMULS for n in chain):
        return "LM head"
    if any(n in COPIES for n in chain):
        return "padding/copies"
    if chain[0].startswith("aten::"):
        return "log-softmax/gather/loss"
    return "other"


def breakdown(prof: Any, vocab: int) -> dict[str, Any]:
    """Seconds per category of one profiled step, its profiled time, the remainder, the top ops."""
    events = list(prof.events())
    (step,) = [e for e in events if e.name == "prof::step"]
    inside = [e for e in events if e is not step and e.time_range.start >= step.time_range.start
              and e.time_range.end <= step.time_range.end]
    starts = [e.time_range.start for e in inside if e.name.startswith("autograd::engine")]
    backward_start = min(starts) if starts else float("inf")
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    ops: dict[str, float] = {}
    for e in inside:
        cat = category(e, backward_start, vocab)
        seconds[cat] += e.self_cpu_time_total / 1e6
        ops[f"{cat}: {e.name}"] = ops.get(f"{cat}: {e.name}", 0.0) + e.self_cpu_time_total / 1e6
    seconds["other"] += step.self_cpu_time_total / 1e6
    total = step.cpu_time_total / 1e6
    top = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:25])
    return {"seconds": seconds, "step_s": total, "unattributed_s": total - sum(seconds.values()), "top_ops": top}


def profiled(run: Callable[[], Any], vocab: int) -> tuple[Any, dict[str, Any], float]:
    """``run()``'s result, its breakdown and its wall time, in a profiler session of its own."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        with record_function("prof::step"):
            result = run()
        wall = time.perf_counter() - start
    return result, breakdown(prof, vocab), wall


def build(threads: int) -> Any:
    """The bench's rounds: vanilla (online reference, plain scorer, shared prompt) and ``trl-online``, 3 batches."""
    torch.set_num_threads(threads)
    data = DataSpec(str(DATA), tokenizer=str(GGUF), batch_size=4, max_length=192, max_prompt_length=128, seed=0,
                    options={"dialogues": "messages", "on_bad_row": "skip"})
    return build_rounds(OWN_MODEL, ["vanilla"], ["online"], ["plain"], ["shared"], 3, 1, torch.device("cpu"), 0,
                        None, ["trl-online"], source=pretrained_source(str(GGUF), "float32"),
                        data=data.data_module(), precision="32-true")


def run_steps(rounds: Any) -> dict[str, list[dict[str, Any]]]:
    """Batch 0 unprofiled, then batches 1 and 2 profiled: ours, TRL, ours, TRL."""
    (config,) = rounds.parts
    parts, rng, peer = rounds.parts[config], rounds.rngs[config], rounds.peers["trl-online"]
    labels, vocab = Labels(), rounds.module.policy.get_output_embeddings().weight.shape[0]
    for model in (rounds.module.policy, peer.model):
        labels.watch(getattr(model, body_name(model)), "prof::body")
    labels.watch(peer.reference, "prof::reference")
    label_context(parts.reference, "prof::reference")
    out: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    for r, batch in enumerate(rounds.batches):
        ours = lambda: train_step(rounds.module, rounds.optimizer, batch, parts, rng.next(), rounds.stepper)
        inputs = peer.inputs(r)
        if r == 0:
            ours(), peer.step(inputs)
            continue
        step, rec, wall = profiled(ours, vocab)
        stats = step.stats
        out["ours"].append({"batch": r, "wall_s": wall, "tokens": stats.tokens_executed,
                            "reference_tokens": stats.reference_tokens_executed,
                            "head_positions": stats.positions_scored, **rec})
        _, rec, wall = profiled(lambda: peer.step(inputs), vocab)
        fw = peer.forwards
        out["trl"].append({"batch": r, "wall_s": wall,
                           "tokens": sum(f.rows * f.width for f in fw if not f.reference),
                           "reference_tokens": sum(f.rows * f.width for f in fw if f.reference),
                           "head_positions": sum(f.positions for f in fw if not f.reference), **rec})
        print(f"batch {r}: ours {out['ours'][-1]['step_s']:.2f} s, TRL {out['trl'][-1]['step_s']:.2f} s",
              file=sys.stderr, flush=True)
    return out


def mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def account(out: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per category: the mean seconds of each side, their ratio, the work ratio ``k`` (TRL's tokens over ours in
    the count the category scales with; 1 for the optimizer and other), TRL's seconds expected from ours at ``k``
    and the rest (per-token efficiency); and the step's ratio as (work ratio) x (per-token ratio)."""
    sides = {s: {c: sum(r["seconds"][c] for r in rows) / len(rows) for c in CATEGORIES} for s, rows in out.items()}
    counts = {s: {k: mean(rows, k) for k in ("tokens", "reference_tokens", "head_positions")}
              for s, rows in out.items()}
    rows = []
    for c in CATEGORIES:
        ours, trl, scale = sides["ours"][c], sides["trl"][c], SCALES_WITH[c]
        k = counts["trl"][scale] / counts["ours"][scale] if scale else 1.0
        rows.append({"category": c, "ours_s": ours, "trl_s": trl, "ratio": trl / ours if ours else None,
                     "scales_with": scale, "work_ratio": k, "trl_expected_s": ours * k,
                     "gap_from_work_s": ours * (k - 1), "gap_per_token_s": trl - ours * k,
                     "per_token_ratio": trl / (ours * k) if ours else None})
    ours_total, trl_total = sum(sides["ours"].values()), sum(sides["trl"].values())
    expected = sum(r["trl_expected_s"] for r in rows)
    return {"rows": rows, "counts": counts, "ours_s": ours_total, "trl_s": trl_total,
            "ratio": trl_total / ours_total, "work_ratio": expected / ours_total,
            "per_token_ratio": trl_total / expected,
            "ours_step_s": mean(out["ours"], "step_s"), "trl_step_s": mean(out["trl"], "step_s"),
            "ours_unattributed_s": mean(out["ours"], "unattributed_s"),
            "trl_unattributed_s": mean(out["trl"], "unattributed_s")}


def table(acc: dict[str, Any]) -> list[str]:
    """The markdown table: category x (ours, TRL, ratio, work ratio, gap from work, gap per token)."""
    lines = ["| category | ours s | TRL s | TRL/ours | scales with | TRL's work / ours | gap from work s | "
             "gap per token s |", "|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in acc["rows"]:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        lines.append(f"| {r['category']} | {r['ours_s']:.2f} | {r['trl_s']:.2f} | {ratio} | "
                     f"{r['scales_with'] or '-'} | {r['work_ratio']:.2f}x | {r['gap_from_work_s']:+.2f} | "
                     f"{r['gap_per_token_s']:+.2f} |")
    work = sum(r["gap_from_work_s"] for r in acc["rows"])
    per_token = sum(r["gap_per_token_s"] for r in acc["rows"])
    lines.append(f"| **step** | **{acc['ours_s']:.2f}** | **{acc['trl_s']:.2f}** | **{acc['ratio']:.2f}x** | | "
                 f"{acc['work_ratio']:.2f}x | {work:+.2f} | {per_token:+.2f} |")
    return lines


def markdown(payload: dict[str, Any]) -> str:
    acc = payload["account"]
    c = acc["counts"]
    rows = {r["category"]: r for r in acc["rows"]}
    big = sorted(acc["rows"], key=lambda r: -abs(r["gap_per_token_s"]))[:3]
    lines = [
        "# Where the time goes: our exact step against TRL's, profiled", "",
        f"Generated by `lab/scripts/profile-trl-gap.py` on {payload['date']} at commit `{payload['commit']}`: "
        f"`{payload['command']}` ({payload['threads']} torch thread, torch {payload['torch']}, trl {payload['trl']}; "
        f"{payload['wall_s']:.0f} s wall). Model and data as in [the float32 bench](bench-fp32/bench.md): "
        "SmolLM2-135M-Instruct (float32) on HH-RLHF harmless-base test pairs, 4 pairs per batch, max length 192, "
        "max prompt length 128. Ours: the exact vanilla step, online reference, plain scorer, shared prompt. "
        "TRL: `DPOTrainer.compute_loss` with an online `ref_model`, backward, AdamW (the bench's `trl-online`). "
        "Batch 0 warmed each up; batches 1 and 2 were profiled, alternating; seconds are the mean of the two, "
        "self CPU time under `torch.profiler` (which slows both), grouped by the rules in the script's docstring.",
        "", *table(acc), "",
        f"Tokens per step (mean of the two batches): ours {c['ours']['tokens']:,.0f} policy and "
        f"{c['ours']['reference_tokens']:,.0f} reference tokens, {c['ours']['head_positions']:,.0f} head positions; "
        f"TRL {c['trl']['tokens']:,.0f} and {c['trl']['reference_tokens']:,.0f} (its chosen and rejected rows "
        f"concatenated, padded to the longest), {c['trl']['head_positions']:,.0f} head positions (on the CPU its "
        "fused head projects every shifted position, prompt and padding included). The bench's three measured "
        "batches average 705 against 1,147.", "",
        "## The account", "",
        f"TRL's profiled step takes **{acc['ratio']:.2f}x** ours. Had TRL run our per-token cost in every "
        f"category on its own token counts (the optimizer and other at 1x), it would take **{acc['work_ratio']:.2f}x**"
        f" ours: that much is work (tokens; padding and the prompt run twice). The rest, "
        f"**{acc['per_token_ratio']:.2f}x** ({acc['work_ratio']:.2f}x x {acc['per_token_ratio']:.2f}x = "
        f"{acc['ratio']:.2f}x), is cost per token. "
        "The categories where TRL's seconds exceed ours scaled by its work the most: "
        + "; ".join(f"{r['category']} {r['gap_per_token_s']:+.2f} s ({r['per_token_ratio']:.2f}x per token)"
                    for r in big) + ".", "",
        f"Policy body: {rows['policy body']['per_token_ratio']:.2f}x per token; reference forward: "
        f"{rows['reference forward']['per_token_ratio']:.2f}x; backward of the body: "
        f"{rows['backward: body and rest']['per_token_ratio']:.2f}x, of the head and log-softmax: "
        f"{rows['backward: head and log-softmax']['per_token_ratio']:.2f}x per head position; "
        f"optimizer {rows['optimizer']['ours_s']:.2f} s against {rows['optimizer']['trl_s']:.2f} s.", "",
        f"Profiled step time (`prof::step`): ours {acc['ours_step_s']:.2f} s, TRL {acc['trl_step_s']:.2f} s; "
        f"unattributed remainder {acc['ours_unattributed_s']:.4f} s and {acc['trl_unattributed_s']:.4f} s. "
        "The 25 largest ops of each step (category: op, seconds) are in [profile.json](profile.json).", "",
        "Not in this TRL step: activation checkpointing. `DPOConfig` defaults to `gradient_checkpointing=True`, "
        "which `Trainer.train` switches on; the bench calls `compute_loss` outside `train`, so the profiled TRL "
        f"step recomputes no activations (its policy's `is_activation_checkpointing`: "
        f"{payload['trl_activation_checkpointing']}); stock TRL training would recompute the body's forward in "
        "backward, a cost a user can turn off (`gradient_checkpointing=False`).", "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="docs/records/real-model/profile")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import trl

    start = time.perf_counter()
    rounds = build(args.threads)
    out = run_steps(rounds)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    payload = {"command": " ".join(["python lab/scripts/profile-trl-gap.py", *(argv or sys.argv[1:])]),
               "date": datetime.date.today().isoformat(), "commit": commit.stdout.strip(),
               "threads": torch.get_num_threads(), "torch": torch.__version__, "trl": trl.__version__,
               "categories": list(CATEGORIES), "steps": out, "account": account(out),
               "trl_activation_checkpointing": bool(getattr(rounds.peers["trl-online"].model,
                                                            "is_activation_checkpointing", False)),
               "wall_s": time.perf_counter() - start}
    Path(args.out + ".json").write_text(json.dumps(payload, indent=1) + "\n")
    Path(args.out + ".md").write_text(markdown(payload))
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
