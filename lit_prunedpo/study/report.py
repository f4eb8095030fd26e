"""The study's outputs: ``study.json`` (every evaluation of every run, and the summary), ``study.md`` (the
table) and ``study.png`` (held-out loss and accuracy against training seconds and against steps, mean over
seeds with the min-max band; needs matplotlib, the ``[bench]`` extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from lit_prunedpo.study.curves import Ratio, mean_curve, ratio_to_vanilla, spread
from lit_prunedpo.study.runner import Clock, Run


def summarise(runs: Sequence[Run], clock: Clock, budget_s: float, evals: int, tolerance: float = 0.01) -> dict[str, Any]:
    """Per arm: final quality at the time budget and at the step budget, and time to vanilla's final quality.

    Raises:
        ValueError: if no run is a same-batch ``vanilla`` arm (the reference every ratio needs).
    """
    arms: dict[str, list[Run]] = {}
    for run in runs:
        arms.setdefault(run.arm.name, []).append(run)
    vanilla = [r for r in runs if r.arm.mode == "vanilla" and not r.arm.matched]
    if not vanilla:
        raise ValueError("a study summary needs the vanilla arm")
    grid = [0.0] + [budget_s * k / evals for k in range(1, evals + 1)]

    def curves(rs: list[Run], what: str, on: str = "time") -> list[list[float]]:
        return [[getattr(p, what) for p in r.on_grid(on)] for r in rs]

    clock_attr = f"{clock}_s"
    target_loss = mean_curve(curves(vanilla, "loss"))[-1]
    target_acc = mean_curve(curves(vanilla, "accuracy"))[-1]
    rows = []
    for name, rs in arms.items():
        times = [[getattr(p, clock_attr) for p in r.on_grid("time")] for r in rs]
        loss_ratio = ratio_to_vanilla(grid, curves(rs, "loss"), times, curves(vanilla, "loss"), target_loss, True)
        acc_ratio = ratio_to_vanilla(grid, curves(rs, "accuracy"), times, curves(vanilla, "accuracy"),
                                     target_acc - tolerance, False)
        final_loss = spread([c[-1] for c in curves(rs, "loss")])
        final_acc = spread([c[-1] for c in curves(rs, "accuracy")])
        step_loss = spread([c[-1] for c in curves(rs, "loss", "steps")])
        step_acc = spread([c[-1] for c in curves(rs, "accuracy", "steps")])
        step_clock = spread([r.on_grid("steps")[-1].__dict__[clock_attr] for r in rs])
        per_step = spread([r.summary()[f"median_step_{clock}_s"] for r in rs])
        rows.append({
            "arm": name, "mode": rs[0].arm.mode, "batch_size": rs[0].arm.batch_size, "matched": rs[0].arm.matched,
            "seeds": [r.seed for r in rs],
            "median_step_s": per_step[0],
            "steps_in_budget": spread([r.on_grid("time")[-1].step for r in rs])[0],
            "final_loss": final_loss, "final_accuracy": final_acc,
            "loss_time_ratio": vars(loss_ratio), "accuracy_time_ratio": vars(acc_ratio),
            "loss_time_ratio_text": str(loss_ratio), "accuracy_time_ratio_text": str(acc_ratio),
            "at_steps_loss": step_loss, "at_steps_accuracy": step_acc, "at_steps_clock_s": step_clock,
        })
    return {"target_loss": target_loss, "target_accuracy": target_acc, "accuracy_tolerance": tolerance,
            "time_grid": grid, "arms": rows}


def _pm(triple: Sequence[float], fmt: str = ".4f") -> str:
    mean, lo, hi = triple
    return f"{mean:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"


def to_markdown(payload: dict[str, Any]) -> str:
    s, task = payload["summary"], payload["task"]
    clock = payload["clock"]
    lines = [
        f"# Study: {task['name']}",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"Budget: {payload['budget_s']:g} s of training on the **{clock}** clock (evaluation excluded) and "
        f"{payload['steps']} steps; {len(payload['seeds'])} seeds {payload['seeds']}; {payload['evals']} exact evaluations "
        f"per budget on {payload['eval_pairs']} held-out pairs; 1 torch thread; runs interleaved round-robin. "
        f"Best achievable held-out accuracy: {task['best_accuracy'] if task['best_accuracy'] is not None else 'unknown'}.",
        "",
        f"Target = vanilla's final mean: val/loss {s['target_loss']:.4f}, val/accuracy {s['target_accuracy']:.3f} "
        f"(reached within {s['accuracy_tolerance']:g}). Ratios: time to target / vanilla's time, mean curve "
        f"[range over seeds that reached it]; < 1 is faster than vanilla. Values: mean [min-max] over seeds.",
        "",
        f"| arm | step ({clock} s) | steps in budget | loss at budget | accuracy at budget | time to loss target | "
        f"time to accuracy target | loss at {payload['steps']} steps | {clock} s for {payload['steps']} steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in s["arms"]:
        lines.append(
            f"| {r['arm']} | {r['median_step_s']:.4f} | {r['steps_in_budget']:.0f} | {_pm(r['final_loss'])} | "
            f"{_pm(r['final_accuracy'], '.3f')} | {r['loss_time_ratio_text']} | {r['accuracy_time_ratio_text']} | "
            f"{_pm(r['at_steps_loss'])} | {r['at_steps_clock_s'][0]:.1f} |"
        )
    warm = payload.get("warm_start")
    if warm:
        cpu = [w["cpu_s"] for w in warm.values()]
        lines += ["", f"Warm start (before every arm, not counted in any budget): {task['warm_start_steps']} supervised steps on the "
                  f"training split's chosen responses (lr {task['warm_start_lr']:g}), one per seed, policy and reference = the "
                  f"warmed model; cost {sum(cpu) / len(cpu):.0f} CPU-s per seed [{min(cpu):.0f}-{max(cpu):.0f}] when made; chosen "
                  "NLL over the first / last 10 steps: "
                  + ", ".join(f"seed {s} {w['nll_first']:.2f} -> {w['nll_last']:.2f}" for s, w in warm.items()) + "."]
    lines += ["", "![study](study.png)", ""]
    return "\n".join(lines)


def warm_start_summary(runs: Sequence[Run]) -> dict[str, Any] | None:
    """Per seed, what its warm start cost and did (``None`` when the study had none)."""
    out: dict[str, Any] = {}
    for run in runs:
        w = run.warm_start
        if w is not None and str(run.seed) not in out:
            out[str(run.seed)] = {"steps": w["steps"], "cpu_s": w["cpu_s"], "wall_s": w["wall_s"], "reused": w["reused"],
                                  "nll_first": sum(w["losses"][:10]) / len(w["losses"][:10]),
                                  "nll_last": sum(w["losses"][-10:]) / len(w["losses"][-10:]), "path": w["path"]}
    return out or None


def plot(payload: dict[str, Any], path: Path) -> bool:
    """Write the four panels to ``path``; False (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    clock = payload["clock"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for run in payload["runs"]:
        by_arm.setdefault(run["arm"], []).append(run)
    for name, runs in by_arm.items():
        for col, (grid, xkey, xlabel) in enumerate(((("time", f"{clock}_s", f"training {clock} seconds")),
                                                    ("steps", "step", "steps"))):
            pts = [[p for p in r["points"] for g in p["grids"] if g == grid] for r in runs]
            xs = mean_curve([[p[xkey] for p in ps] for ps in pts])
            for row, what in enumerate(("loss", "accuracy")):
                ys = [[p[what] for p in ps] for ps in pts]
                ax = axes[row][col]
                line, = ax.plot(xs, mean_curve(ys), label=name, linestyle="--" if "matched" in name else "-")
                ax.fill_between(xs, [min(v) for v in zip(*ys)], [max(v) for v in zip(*ys)], alpha=0.15, color=line.get_color())
                ax.set_xlabel(xlabel)
                ax.set_ylabel(f"held-out {what} (exact)")
    axes[0][0].set_yscale("log")
    axes[0][1].set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{payload['task']['name']}: mean over {len(payload['seeds'])} seeds, band = min-max")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(payload: dict[str, Any], out: Path) -> list[Path]:
    """Write study.json, study.md and (with matplotlib) study.png under ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "study.json", out / "study.md"]
    written[0].write_text(json.dumps(payload, indent=1))
    written[1].write_text(to_markdown(payload))
    if plot(payload, out / "study.png"):
        written.append(out / "study.png")
    return written


def payload_of(runs: Sequence[Run], task: dict[str, Any], clock: Clock, budget_s: float, steps: int, evals: int,
               seeds: Sequence[int], eval_pairs: int, command: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "task": task, "clock": clock, "budget_s": budget_s, "steps": steps, "evals": evals, "seeds": list(seeds),
        "eval_pairs": eval_pairs, "command": command, **(extra or {}),
        "summary": summarise(runs, clock, budget_s, evals),
        "runs": [r.summary() for r in runs],
    }
