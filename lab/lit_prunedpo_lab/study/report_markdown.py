"""``study.md``: the study's settings, one table row per arm, the verdicts, and the calibration, memory budget,
learning-rate sweep and warm start each in a paragraph (:func:`to_markdown`, from the report's payload).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from lit_prunedpo_lab.study.memory import budget_binds, not_binding_text
from lit_prunedpo_lab.study.turns import load_summary, load_text

#: What a study at one pair per step cannot conclude (logged and in study.md).
ONE_PAIR_NOTE = ("batch 1: no vanilla batch is smaller, so no cost-matched control exists (each pruned arm is judged "
                 "against same-batch vanilla only, whatever its step costs) and the vanilla cost line rests on one "
                 "batch size; the verdicts cannot say whether pruning beats vanilla at equal cost per step")


def _pm(triple: Sequence[float], fmt: str = ".4f") -> str:
    mean, lo, hi = triple
    return f"{mean:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"


def verdict_lines(summary: dict[str, Any]) -> list[str]:
    """One line per arm other than the same-batch vanilla: the verdict on each target and the reference."""
    lines = []
    for r in summary["arms"]:
        if r["arm"] == summary["reference"]:
            continue
        parts = []
        for what in ("loss", "accuracy"):
            ratio = r[f"{what}_time_ratio"]
            parts.append(f"{what} {ratio['verdict']}: {ratio['interval_text']} of {ratio['reference']}'s time "
                         f"({ratio['reached']}/{ratio['seeds']} seeds)")
        lines.append(f"verdict {r['arm']}: " + "; ".join(parts))
    return lines


def to_markdown(payload: dict[str, Any]) -> str:
    """``study.md`` of a report's payload (:func:`lit_prunedpo_lab.study.report.payload_of`)."""
    lines = _table(payload)
    verdicts = verdict_lines(payload["summary"])
    if verdicts:
        lines += ["", "Verdicts:", ""] + [f"- {v.removeprefix('verdict ')}" for v in verdicts]
    cal = payload.get("calibration")
    if cal:
        lines += ["", *_calibration_lines(cal, payload["clock"], payload["task"])]
    mem = payload.get("memory")
    if mem:
        lines += ["", memory_markdown(mem, payload["clock"])]
    sw = payload.get("sweep")
    if sw:
        chosen = [row for row in sw["rows"] if row["chosen"]]
        lines += ["", f"Learning rates: each arm's best of {', '.join(f'{f:g}' for f in sw['factors'])} x the base on "
                  f"tuning seeds {sw['seeds']} (lowest mean held-out loss over the last {sw['window']} evaluations): "
                  + ", ".join(f"{row['arm']} {row['lr']:.3g}" for row in chosen) + "."]
    elif payload.get("sweep") is None and "sweep" in payload:
        lines += ["", "No learning-rate sweep (`--no-sweep`): every arm at the base rate."]
    warm = payload.get("warm_start")
    if warm:
        lines += ["", _warm_start_text(warm, payload["task"])]
    lines += ["", f"Clocks: {load_text(load_summary(payload.get('runs', []), _threads(payload)))}."]
    lines += ["", "![study](study.png)", ""]
    return "\n".join(lines)


def _threads(payload: Mapping[str, Any]) -> int | None:
    """The torch threads the study ran with, where its payload says (``torch_threads``)."""
    threads = payload.get("torch_threads")
    return int(threads) if isinstance(threads, int) else None


def _threads_words(payload: Mapping[str, Any]) -> str:
    threads = _threads(payload) or 1  # studies recorded before the payload named its threads ran on one
    return f"{threads} torch thread{'s' if threads > 1 else ''}"


def _precision_words(payload: Mapping[str, Any]) -> str:
    precision = payload.get("precision", "32-true")  # studies recorded before the option trained in float32
    if precision == "32-true":
        return "float32"
    return f"{precision} (float32 weights, the forward under bfloat16 autocast)"


def _device_words(payload: Mapping[str, Any]) -> str:
    """``; on cuda:0`` for a study run on a GPU; nothing for the CPU (studies recorded before the option ran there)."""
    device = payload.get("device", "cpu")
    return "" if device == "cpu" else f"; on {device}"


def _table(payload: Mapping[str, Any]) -> list[str]:
    """The title, the command, the budgets and the protocol in words, then one table row per arm."""
    s, task = payload["summary"], payload["task"]
    clock = payload["clock"]
    conf = f"{s['confidence'] * 100:g} %"
    lines = [
        f"# Study: {task['name']}",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"Budget: {payload['budget_s']:g} s of training on the **{clock}** clock (evaluation excluded) and "
        f"{payload['steps']} steps; {len(payload['seeds'])} seeds {payload['seeds']}; {payload['evals']} exact "
        f"evaluations per budget on {payload['eval_pairs']} held-out pairs; {_threads_words(payload)}; "
        f"{_precision_words(payload)}{_device_words(payload)}; runs interleaved "
        f"round-robin; warm-up then cosine decay over each arm's estimated steps. "
        "Best achievable held-out accuracy: "
        f"{task['best_accuracy'] if task['best_accuracy'] is not None else 'unknown'}.",
        "",
        f"Targets = {s['target_share']:g} of {s['reference']}'s best improvement on its mean curve: val/loss "
        f"{s['target_loss']:.4f}, val/accuracy {s['target_accuracy']:.3f}. Time ratios: summed time to target over "
        f"seeds / the better vanilla's (largest ratio over the arm's references), {conf} percentile bootstrap over "
        f"seeds ({s['resamples']} resamples, seed {s['bootstrap_seed']}); a seed that never reaches the target counts "
        f"against the arm. WIN: upper end < 1; LOSS: lower end > 1; TIE: undecided. Best: mean [{conf} interval] over "
        f"seeds of the best evaluation within the budget; other values: mean [min-max].",
        "",
        f"| arm | lr | step ({clock} s) | steps in budget | best loss | best accuracy | loss at budget | "
        f"time to loss target | time to accuracy target | loss at {payload['steps']} steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in s["arms"]:
        ref = (lambda what: "" if r[f"{what}_time_ratio"]["reference"] == s["reference"]
               else f" vs {r[f'{what}_time_ratio']['reference']}")  # noqa: E731
        lines.append(
            f"| {r['arm']} | {r['lr']:.3g} | {r['median_step_s']:.4f} | {r['steps_in_budget']:.0f} | "
            f"{_pm(r['best_loss'])} | {_pm(r['best_accuracy'], '.3f')} | {_pm(r['final_loss'])} | "
            f"{r['loss_time_ratio']['text']}{ref('loss')} | {r['accuracy_time_ratio']['text']}{ref('accuracy')} | "
            f"{_pm(r['at_steps_loss'])} |"
        )
    return lines


def _calibration_lines(cal: Mapping[str, Any], clock: str, task: Mapping[str, Any]) -> list[str]:
    """The calibration's paragraph: the vanilla cost line, the measured peaks, each mode's cost-matched batch."""
    lines = [f"Calibration (median of {cal['steps']} timed steps per arm after {cal['warmup']} untimed, seed "
             f"{cal['seed']}): vanilla step cost {cal['vanilla_line'][0]:.4f} + {cal['vanilla_line'][1]:.4f} x batch "
             f"{clock}-s (fitted on batches {', '.join(str(b) for b in cal['vanilla_measured'])})."]
    peaks = {name: a.get("peak_mb") for name, a in cal.get("arms", {}).items()}
    if any(p is not None for p in peaks.values()):
        lines.append("- Peak step memory above the step's start (MB, the largest over the timed steps): "
                     + ", ".join(f"{name} {p:.1f}" for name, p in peaks.items() if p is not None) + ".")
    for mode, m in cal.get("cost_matched", {}).items():
        lines.append(f"- {mode}: pruned step {m['pruned_cost_s']:.4f} {clock}-s -> cost-matched vanilla batch "
                     f"**{m['batch']}** (measured); the FLOP model's ideal speedup {m['flop_speedup']:.2f}x gives "
                     f"{m['flop_batch']}.")
    if task.get("batch_size") == 1 and cal.get("cost_matched"):
        lines.append(f"- {ONE_PAIR_NOTE}.")
    return lines


def _warm_start_text(warm: Mapping[str, Any], task: Mapping[str, Any]) -> str:
    """The warm start's paragraph: its steps and rate, its cost per seed and the chosen responses' NLL it reached."""
    cpu = [w["cpu_s"] for w in warm.values()]
    return (f"Warm start (before every arm, not counted in any budget): {task['warm_start_steps']} supervised steps on "
            f"the training split's chosen responses (lr {task['warm_start_lr']:g}), one per seed, policy and reference "
            f"= the warmed model; cost {sum(cpu) / len(cpu):.0f} CPU-s per seed [{min(cpu):.0f}-{max(cpu):.0f}] when "
            "made; chosen NLL over the first / last 10 steps: "
            + ", ".join(f"seed {s} {w['nll_first']:.2f} -> {w['nll_last']:.2f}" for s, w in warm.items()) + ".")


def memory_markdown(mem: Mapping[str, Any], clock: str) -> str:
    """The memory budget's paragraph: the budget, each arm's measured peak and fit, the references, the GPU note."""
    peaks = ", ".join(f"{name} {peak:.1f}" if peak is not None else f"{name} unmeasured" for name,
                      peak in mem["peaks"].items())
    lines = [f"Memory budget: **{mem['budget_mb']:g} MB** of peak step memory above the step's start "
             f"({mem['measure']}, the largest over the calibration's steps). Measured peaks (MB): {peaks}."]
    if not budget_binds(mem):
        text = not_binding_text(mem)
        lines.append(f"- **{text[0].upper()}{text[1:]}**.")
    for name, rows in mem["tables"].items():
        chosen = next(r for r in rows if r["chosen"])
        lines.append(f"- {name} is over the budget: fitted as **{chosen['fit']}** ({chosen['peak_mb']:.1f} MB, "
                     f"{chosen['cost_s']:.4f} {clock}-s/step), the fastest of " + ", ".join(
                         f"{r['fit']} {r['peak_mb']:.1f} MB {r['cost_s']:.4f} s" for r in rows) + ".")
    lines.append("- References of the pruned arms (the better vanilla that fits the "
                 "budget): " + ", ".join(mem["references"]) + ".")
    if mem["over"]:
        lines.append(f"- Over the budget, not a reference: {', '.join(mem['over'])}.")
    if mem["gpu_needed"]:
        lines.append(f"- {mem['gpu_note']}: a fit uses gradient accumulation, nearly free on the CPU but not on a GPU, "
                     "where small micro-batches under-use the device (lab/scripts/gpu-check measures it).")
    return "\n".join(lines)
