"""The study's outputs: ``study.json`` (every evaluation of every run, the calibration, the sweep and the
summary), ``study.md`` (the tables and the verdicts), ``study.png`` (held-out loss and accuracy against
training seconds and against steps, mean over seeds with the min-max band; needs matplotlib, the ``[bench]``
extra), and ``progress.jsonl``, written as the study goes (:class:`Journal`): a study stopped late keeps what
it measured. :func:`check_writable` proves the output folder usable before any training starts. Reports are
written whole (a temporary file renamed into place) and journal lines are never left half-written
(:mod:`lit_prunedpo.study.outputs`); a file that cannot be written raises an ``OutputError`` naming it (``the disk
is full`` for ENOSPC).

The protocol the summary applies (target, censoring, intervals, win rule) is in :mod:`lit_prunedpo.study.curves`.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from lit_prunedpo.study.curves import improvement_target, mean_curve, mean_interval, spread, time_ratio, time_to_target
from lit_prunedpo.study.memory import budget_binds, not_binding_text
from lit_prunedpo.study.outputs import OutputError, append_line, atomic_path, drop_cut_off_tail, write_atomic
from lit_prunedpo.study.runner import Clock, Run


def check_writable(out: Path) -> None:
    """Create ``out`` (and its parents) and write and delete a probe file in it.

    Raises:
        OSError: naming the folder, if it cannot be created or written.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise OSError(f"output folder {str(out)!r} cannot be created or written: {exc.strerror or exc}") from exc


class Journal:
    """``progress.jsonl`` under the output folder: one JSON object per line, appended and flushed as each
    thing is measured (the calibration, every evaluation of the sweep and of the study, every finished run).
    Started afresh for each study, its first line naming the command (``keep``: appended to, for a resumed run);
    ``replaced`` says whether an earlier study's file was replaced (the command logs it), ``dropped`` how many bytes
    of a cut-off last line a kept file lost (a run killed while appending it: the next line would be glued on).

    Raises:
        OutputError: naming the file, when a line cannot be written (never left half-written in the file).
    """

    def __init__(self, out: Path, command: str, keep: bool = False) -> None:
        self.path = Path(out) / "progress.jsonl"
        self.replaced = self.path.exists() and not keep
        self.dropped = drop_cut_off_tail(self.path) if keep else 0
        if not keep:
            try:
                self.path.write_text("")
            except OSError as exc:
                raise OutputError.of(self.path, exc) from exc
        self.append("study", command=command)

    def append(self, kind: str, **record: Any) -> None:
        append_line(self.path, json.dumps({"kind": kind, **record}))

    def point(self, phase: str, run: Run, point: Any) -> None:
        self.append("point", phase=phase, arm=run.arm.name, seed=run.seed, lr=run.optimizer.param_groups[0]["initial_lr"],
                    **vars(point))

    def run(self, phase: str, run: Run) -> None:
        self.append("run", phase=phase, **run.summary())


#: What a study at one pair per step cannot conclude (logged and in study.md).
ONE_PAIR_NOTE = ("batch 1: no vanilla batch is smaller, so no cost-matched control exists (each pruned arm is judged "
                 "against same-batch vanilla only, whatever its step costs) and the vanilla cost line rests on one batch "
                 "size; the verdicts cannot say whether pruning beats vanilla at equal cost per step")


def _by_seed(runs: Sequence[Run]) -> dict[int, Run]:
    return {r.seed: r for r in runs}


def summarise(runs: Sequence[Run], clock: Clock, budget_s: float, evals: int, share: float = 0.8, resamples: int = 2000,
              confidence: float = 0.95, seed: int = 0, controls: Mapping[str, str | Sequence[str]] | None = None,
              same_batch_reference: bool = True) -> dict[str, Any]:
    """Per arm: best and final quality within the budget, quality at the step budget, and the time to the
    improvement targets as a ratio to the better vanilla arm, with bootstrap intervals and verdicts.

    Args:
        controls: per pruned mode, the name (or names) of its control vanilla arms (cost-matched, memory-fitted);
            every arm of that mode is judged against the best of them and the same-batch vanilla arm (only the
            latter without one).
        same_batch_reference: False when the same-batch vanilla arm is over a memory budget: it still sets the
            targets (a memory-fitted vanilla computes the same steps), but pruned arms are judged against their
            controls only.

    Raises:
        ValueError: if no run is a same-batch ``vanilla`` arm (the reference every ratio needs), or a control
            arm or a seed is missing, or a pruned mode is left without a reference.
    """
    arms: dict[str, list[Run]] = {}
    for run in runs:
        arms.setdefault(run.arm.name, []).append(run)
    vanilla = [r for r in runs if r.arm.mode == "vanilla" and not r.arm.matched and not r.arm.cost_matched and not r.arm.memory_fitted]
    if not vanilla:
        raise ValueError("a study summary needs the vanilla arm")
    vanilla_name = vanilla[0].arm.name
    seeds = [r.seed for r in vanilla]
    controls = {mode: [names] if isinstance(names, str) else list(names) for mode, names in (controls or {}).items()}
    for mode, names in controls.items():
        for name in names:
            if name not in arms:
                raise ValueError(f"the control {name!r} of mode {mode!r} has no runs")
    grid = [0.0] + [budget_s * k / evals for k in range(1, evals + 1)]
    clock_attr = f"{clock}_s"

    def curve(r: Run, what: str, on: str = "time") -> list[float]:
        return [getattr(p, what) for p in r.on_grid(on)]

    def seed_times(rs: list[Run], what: str, target: float) -> list[float | None]:
        by = _by_seed(rs)
        if set(by) != set(seeds):
            raise ValueError(f"arm {rs[0].arm.name} ran seeds {sorted(by)}, vanilla {sorted(seeds)}: they must pair")
        return [time_to_target([getattr(p, clock_attr) for p in by[s].on_grid("time")], curve(by[s], what), target,
                               what == "loss") for s in seeds]

    targets = {
        "loss": improvement_target(mean_curve([curve(r, "loss") for r in vanilla]), share, True),
        "accuracy": improvement_target(mean_curve([curve(r, "accuracy") for r in vanilla]), share, False),
    }
    times = {what: {name: seed_times(rs, what, targets[what]) for name, rs in arms.items()} for what in targets}
    rows = []
    for name, rs in arms.items():
        arm = rs[0].arm
        refs = [vanilla_name]
        if arm.mode != "vanilla":
            refs = ([vanilla_name] if same_batch_reference else []) + [c for c in controls.get(arm.mode, []) if c != vanilla_name]
            if not refs:
                raise ValueError(f"arm {name}: no vanilla reference (the same-batch arm is excluded and mode {arm.mode!r} has no control)")
        row: dict[str, Any] = {
            "arm": name, "mode": arm.mode, "batch_size": arm.batch_size, "matched": arm.matched,
            "cost_matched": arm.cost_matched, "memory_fitted": arm.memory_fitted, "fit": arm.fit,
            "micro_batches": arm.micro_batches, "lr": rs[0].summary()["lr"], "schedule_steps": arm.schedule_steps,
            "seeds": [r.seed for r in rs],
            "median_step_s": spread([r.summary()[f"median_step_{clock}_s"] for r in rs])[0],
            "steps_in_budget": spread([r.on_grid("time")[-1].step for r in rs])[0],
            "final_loss": spread([curve(r, "loss")[-1] for r in rs]),
            "final_accuracy": spread([curve(r, "accuracy")[-1] for r in rs]),
            "best_loss": mean_interval([min(curve(r, "loss")) for r in rs], resamples, confidence, seed),
            "best_accuracy": mean_interval([max(curve(r, "accuracy")) for r in rs], resamples, confidence, seed),
            "at_steps_loss": spread([curve(r, "loss", "steps")[-1] for r in rs]),
            "at_steps_accuracy": spread([curve(r, "accuracy", "steps")[-1] for r in rs]),
            "at_steps_clock_s": spread([getattr(r.on_grid("steps")[-1], clock_attr) for r in rs]),
            "references": refs,
        }
        for what in targets:
            ratio = time_ratio(times[what][name], {ref: times[what][ref] for ref in refs}, budget_s, resamples, confidence, seed)
            row[f"{what}_time_ratio"] = ratio.as_dict()
            row[f"{what}_seed_times"] = times[what][name]
            if len(refs) > 1 or refs != [vanilla_name]:
                same = time_ratio(times[what][name], {vanilla_name: times[what][vanilla_name]}, budget_s, resamples, confidence, seed)
                row[f"{what}_time_ratio_same_batch"] = same.as_dict()
        rows.append(row)
    return {"target_share": share, "target_loss": targets["loss"], "target_accuracy": targets["accuracy"],
            "reference": vanilla_name, "controls": controls, "resamples": resamples, "confidence": confidence,
            "bootstrap_seed": seed, "time_grid": grid, "same_batch_reference": same_batch_reference, "arms": rows}


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
    s, task = payload["summary"], payload["task"]
    clock = payload["clock"]
    conf = f"{s['confidence'] * 100:g} %"
    lines = [
        f"# Study: {task['name']}",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"Budget: {payload['budget_s']:g} s of training on the **{clock}** clock (evaluation excluded) and "
        f"{payload['steps']} steps; {len(payload['seeds'])} seeds {payload['seeds']}; {payload['evals']} exact evaluations "
        f"per budget on {payload['eval_pairs']} held-out pairs; 1 torch thread; runs interleaved round-robin; warm-up then "
        f"cosine decay over each arm's estimated steps. "
        f"Best achievable held-out accuracy: {task['best_accuracy'] if task['best_accuracy'] is not None else 'unknown'}.",
        "",
        f"Targets = {s['target_share']:g} of {s['reference']}'s best improvement on its mean curve: val/loss "
        f"{s['target_loss']:.4f}, val/accuracy {s['target_accuracy']:.3f}. Time ratios: summed time to target over seeds "
        f"/ the better vanilla's (largest ratio over the arm's references), {conf} percentile bootstrap over seeds "
        f"({s['resamples']} resamples, seed {s['bootstrap_seed']}); a seed that never reaches the target counts against "
        f"the arm. WIN: upper end < 1; LOSS: lower end > 1; TIE: undecided. Best: mean [{conf} interval] over seeds of "
        f"the best evaluation within the budget; other values: mean [min-max].",
        "",
        f"| arm | lr | step ({clock} s) | steps in budget | best loss | best accuracy | loss at budget | "
        f"time to loss target | time to accuracy target | loss at {payload['steps']} steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in s["arms"]:
        ref = lambda what: "" if r[f"{what}_time_ratio"]["reference"] == s["reference"] else f" vs {r[f'{what}_time_ratio']['reference']}"  # noqa: E731
        lines.append(
            f"| {r['arm']} | {r['lr']:.3g} | {r['median_step_s']:.4f} | {r['steps_in_budget']:.0f} | {_pm(r['best_loss'])} | "
            f"{_pm(r['best_accuracy'], '.3f')} | {_pm(r['final_loss'])} | {r['loss_time_ratio']['text']}{ref('loss')} | "
            f"{r['accuracy_time_ratio']['text']}{ref('accuracy')} | {_pm(r['at_steps_loss'])} |"
        )
    verdicts = verdict_lines(s)
    if verdicts:
        lines += ["", "Verdicts:", ""] + [f"- {v.removeprefix('verdict ')}" for v in verdicts]
    cal = payload.get("calibration")
    if cal:
        lines += ["", f"Calibration (median of {cal['steps']} timed steps per arm after {cal['warmup']} untimed, seed {cal['seed']}): "
                  f"vanilla step cost {cal['vanilla_line'][0]:.4f} + {cal['vanilla_line'][1]:.4f} x batch {clock}-s (fitted on "
                  f"batches {', '.join(str(b) for b in cal['vanilla_measured'])})."]
        peaks = {name: a.get("peak_mb") for name, a in cal.get("arms", {}).items()}
        if any(p is not None for p in peaks.values()):
            lines.append("- Peak step memory above the step's start (MB, the largest over the timed steps): "
                         + ", ".join(f"{name} {p:.1f}" for name, p in peaks.items() if p is not None) + ".")
        for mode, m in cal.get("cost_matched", {}).items():
            lines.append(f"- {mode}: pruned step {m['pruned_cost_s']:.4f} {clock}-s -> cost-matched vanilla batch "
                         f"**{m['batch']}** (measured); the FLOP model's ideal speedup {m['flop_speedup']:.2f}x gives {m['flop_batch']}.")
        if task.get("batch_size") == 1 and cal.get("cost_matched"):
            lines.append(f"- {ONE_PAIR_NOTE}.")
    mem = payload.get("memory")
    if mem:
        lines += ["", memory_markdown(mem, clock)]
    sw = payload.get("sweep")
    if sw:
        chosen = [row for row in sw["rows"] if row["chosen"]]
        lines += ["", f"Learning rates: each arm's best of {', '.join(f'{f:g}' for f in sw['factors'])} x the base on tuning "
                  f"seeds {sw['seeds']} (lowest mean held-out loss over the last {sw['window']} evaluations): "
                  + ", ".join(f"{row['arm']} {row['lr']:.3g}" for row in chosen) + "."]
    elif payload.get("sweep") is None and "sweep" in payload:
        lines += ["", "No learning-rate sweep (`--no-sweep`): every arm at the base rate."]
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


def memory_markdown(mem: Mapping[str, Any], clock: str) -> str:
    """The memory budget's paragraph: the budget, each arm's measured peak and fit, the references, the GPU note."""
    peaks = ", ".join(f"{name} {peak:.1f}" if peak is not None else f"{name} unmeasured" for name, peak in mem["peaks"].items())
    lines = [f"Memory budget: **{mem['budget_mb']:g} MB** of peak step memory above the step's start ({mem['measure']}, "
             f"the largest over the calibration's steps). Measured peaks (MB): {peaks}."]
    if not budget_binds(mem):
        text = not_binding_text(mem)
        lines.append(f"- **{text[0].upper()}{text[1:]}**.")
    for name, rows in mem["tables"].items():
        chosen = next(r for r in rows if r["chosen"])
        lines.append(f"- {name} is over the budget: fitted as **{chosen['fit']}** ({chosen['peak_mb']:.1f} MB, "
                     f"{chosen['cost_s']:.4f} {clock}-s/step), the fastest of " + ", ".join(
                         f"{r['fit']} {r['peak_mb']:.1f} MB {r['cost_s']:.4f} s" for r in rows) + ".")
    lines.append("- References of the pruned arms (the better vanilla that fits the budget): " + ", ".join(mem["references"]) + ".")
    if mem["over"]:
        lines.append(f"- Over the budget, not a reference: {', '.join(mem['over'])}.")
    if mem["gpu_needed"]:
        lines.append(f"- {mem['gpu_note']}: a fit uses gradient accumulation, nearly free on the CPU but not on a GPU, "
                     "where small micro-batches under-use the device (scripts/gpu-check measures it).")
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


#: Line style of an arm by its batch: the task's, enlarged to a vanilla step's cost, shrunk to a pruned step's, or
#: vanilla at the task's batch run its fastest exact way under a memory budget.
ARM_STYLES = {"same batch": "-", "compute-matched": "--", "cost-matched": ":", "memory-fitted": "-."}


def arm_kind(run: dict[str, Any]) -> str:
    """Which batch an arm runs: a key of :data:`ARM_STYLES`."""
    if run.get("matched"):
        return "compute-matched"
    if run.get("cost_matched"):
        return "cost-matched"
    return "memory-fitted" if run.get("memory_fitted") else "same batch"


def plot(payload: dict[str, Any], path: Path) -> bool:
    """Write :func:`study_figure` to ``path``; False (and nothing written) without matplotlib. Renders from a
    saved report too: ``plot(json.loads(Path("study.json").read_text()), Path("study.png"))``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = study_figure(payload)
    try:
        with atomic_path(path) as tmp:  # whole or absent
            fig.savefig(tmp, dpi=110, bbox_inches="tight")  # "tight" keeps the legend below the panels in the file
    finally:
        plt.close(fig)
    return True


def _plain_log_labels(ax: Any) -> None:
    """Label a log y axis with plain decimals (0.3, not 3 x 10^-1), the in-between ticks too: all but 7 and 9 when
    the axis spans little more than a decade, 2 and 5 up to 2.6 decades, 3 up to 4, none past that."""
    import matplotlib.ticker

    def label(value: float, _: Any) -> str:
        return f"{value:g}"

    def minor(value: float, _: Any) -> str:
        low, high = ax.get_ylim()
        decades = math.log10(high / low) if low > 0 and high > low else 3.0
        digit = round(value / 10 ** math.floor(math.log10(value) + 1e-9)) if value > 0 else 0
        shown = (2, 3, 4, 5, 6, 8) if decades <= 1.2 else (2, 5) if decades <= 2.6 else (3,) if decades <= 4 else ()
        return f"{value:g}" if digit in shown else ""

    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(label))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor))


def study_figure(payload: dict[str, Any]) -> Any:
    """The four panels as a matplotlib figure: held-out loss (top; a log axis with plain labels when it spans a
    factor of 4 or more) and accuracy (bottom), against the training clock (left) and against steps (right), each
    row on one y axis; one colour per arm, one line style per kind of batch (:data:`ARM_STYLES`), one legend of the
    arms' names below the panels; the accuracy panels span the measured values (a title says so when every arm has
    saturated them)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    clock = payload["clock"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey="row")
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for run in payload["runs"]:
        by_arm.setdefault(run["arm"], []).append(run)
    palette = plt.get_cmap("tab10" if len(by_arm) <= 10 else "tab20")
    colour = {name: palette(i % palette.N) for i, name in enumerate(by_arm)}
    accuracy_ends: list[float] = []
    losses = [p["loss"] for r in payload["runs"] for p in r["points"]]
    for name, runs in by_arm.items():
        style = dict(color=colour[name], linestyle=ARM_STYLES[arm_kind(runs[0])], linewidth=1.8)
        for col, (grid, xkey, xlabel) in enumerate(((("time", f"{clock}_s", f"training {clock.upper()} seconds")),
                                                    ("steps", "step", "steps"))):
            pts = [[p for p in r["points"] for g in p["grids"] if g == grid] for r in runs]
            xs = mean_curve([[p[xkey] for p in ps] for ps in pts])
            for row, what in enumerate(("loss", "accuracy")):
                ys = [[p[what] for p in ps] for ps in pts]
                ax = axes[row][col]
                mean = mean_curve(ys)
                ax.plot(xs, mean, label=name, **style)
                ax.fill_between(xs, [min(v) for v in zip(*ys)], [max(v) for v in zip(*ys)], alpha=0.1,
                                color=style["color"], linewidth=0)
                ax.set_xlabel(xlabel, fontsize=10)
                if what == "accuracy":
                    accuracy_ends.append(mean[-1])
    for row, what in enumerate(("loss", "accuracy")):
        axes[row][0].set_ylabel(f"held-out {what} (exact)", fontsize=10)
        for ax in axes[row]:
            ax.grid(True, which="major", alpha=0.3)
    if losses and min(losses) > 0 and max(losses) / min(losses) >= 4:  # a loss falling by decades: a log axis
        axes[0][0].set_yscale("log")  # the row shares its y axis
        _plain_log_labels(axes[0][0])
    axes[0][0].set_title(f"against training {clock.upper()} time", fontsize=10)
    axes[0][1].set_title("against steps", fontsize=10)
    if accuracy_ends and min(accuracy_ends) >= 0.995:
        for ax in axes[1]:
            ax.set_title("every arm ends at accuracy >= 0.995: the loss panels tell the arms apart", fontsize=9)
    handles = [Line2D([], [], color=colour[name], linestyle=ARM_STYLES[arm_kind(runs[0])], linewidth=1.8, label=name)
               for name, runs in by_arm.items()]
    fig.suptitle(f"{payload['task']['name']}: held-out loss and accuracy, mean over {len(payload['seeds'])} seeds "
                 "(band: min-max over seeds)", fontsize=12)
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 4),
               fontsize=10, frameon=False, handlelength=3)
    return fig


def write_report(payload: dict[str, Any], out: Path) -> list[Path]:
    """Write study.json, study.md and (with matplotlib) study.png under ``out``, each whole; returns the paths written.

    Raises:
        OutputError: naming the file that could not be written (the others already written stay).
    """
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "study.json", out / "study.md"]
    write_atomic(written[0], json.dumps(payload, indent=1))
    write_atomic(written[1], to_markdown(payload))
    if plot(payload, out / "study.png"):
        written.append(out / "study.png")
    return written


def payload_of(runs: Sequence[Run], task: dict[str, Any], clock: Clock, budget_s: float, steps: int, evals: int,
               seeds: Sequence[int], eval_pairs: int, command: str, extra: dict[str, Any] | None = None,
               protocol: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole report; ``protocol`` holds :func:`summarise`'s keyword arguments (share, bootstrap, controls)."""
    return {
        "task": task, "clock": clock, "budget_s": budget_s, "steps": steps, "evals": evals, "seeds": list(seeds),
        "eval_pairs": eval_pairs, "command": command, **(extra or {}),
        "summary": summarise(runs, clock, budget_s, evals, **(protocol or {})),
        "runs": [r.summary() for r in runs],
    }
