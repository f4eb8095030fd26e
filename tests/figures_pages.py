"""The figure table's rows for the performance, time-to-quality, paper and real-model pages (``test_figures.py``
holds the README's and ``docs/index.md``'s, the test and the format)."""

from __future__ import annotations

import math

from figure_sources import (Figure, arm_ratio, bench, learning, load, loss_text, map_row, memory_ratio, mib, paper,
                            paper_row, peer, ratio_only, remeasured, reproduced, spread, threads, verdicts, x)
from helpers import REPO
from lit_prunedpo.intervals import paired_ratio_interval

P, T, A, M = "docs/performance.md", "docs/time-to-quality.md", "docs/paper.md", "docs/real-model.md"
MED, HH, QS = ("docs/records/bench/medium/bench.json", "docs/records/bench/head-heavy/bench.json",
               "docs/records/bench/quickstart/bench.json")
BODY, HBT, HGT = ("docs/records/bench/hh-body/bench.json", "docs/records/bench/hh-body-trl/bench.json",
                  "docs/records/bench/hh-gpt2-trl/bench.json")
MODES = "docs/records/bench/position-modes/bench.json"
BODY_VANILLA = "docs/records/bench/hh-body-vanilla/bench.json"
QS_PROMPTS = "docs/records/bench/quickstart-prompts-vanilla/bench.json"
COMPILE = "docs/records/bench/compile-quickstart/bench.json"
FP32, BF16 = "docs/records/real-model/bench-fp32/bench.json", "docs/records/real-model/bench-bf16/bench.json"
MIXED = "docs/records/real-model/bench-bf16-mixed/bench.json"
LEARN = "docs/records/real-model/learning/records.jsonl"
PROFILE = "docs/records/real-model/profile.json"
LEARNS = "docs/records/real-model/epoch-cell-learns/report/paper.json"
LIMIT = "docs/records/real-model/limit-b8/bench.json"
TTQ = "docs/records/real-model/ttq/study.json"
CKPT = "docs/records/real-model/bench-trl-checkpointing-fp32/bench.json"
CKPT_MIXED = "docs/records/real-model/bench-trl-checkpointing-bf16-mixed/bench.json"
MAP, CVMAP, CVMAP2 = ("docs/records/study/map/map.json", "docs/records/study/cv-map/map.json",
                      "docs/records/study/cv-map2/map.json")
CVCONF, CVLONG, CV512 = ("docs/records/study/cv-confirm/map.json", "docs/records/study/cv-long/map.json",
                         "docs/records/study/cv-l512/map.json")
DESIGNS = "docs/records/study/map-designs/map.json"
#: the same cells re-measured with the arms interleaved on seeds 30-34 (2026-12-07)
CVMAP30, CVMAP230 = "docs/records/study/cv-map-30/map.json", "docs/records/study/cv-map2-30/map.json"
MAP30 = "docs/records/study/map-30/map.json"
CVLONG30, CV51230 = "docs/records/study/cv-long-30/map.json", "docs/records/study/cv-l512-30/map.json"
LONG = "docs/records/study/map-long/cells/unrelated-L512-head0.6-B8/study.json"
LONG2 = "docs/records/study/map-long-confirm/cells/unrelated-L512-head0.6-B8/study.json"
LONG30 = "docs/records/study/map-long-30/cells/unrelated-L512-head0.6-B8/study.json"
LONG230 = "docs/records/study/map-long-confirm-30/cells/unrelated-L512-head0.6-B8/study.json"
PAPER, SCALING = "docs/records/paper-results/paper.json", "docs/records/paper-results/scaling/scaling.json"
REPRODUCED = "docs/records/paper-results/reproduced/paper.json"
SCE, L512, L256 = "stratified-coupled-exact-targets", "unrelated-L512-head0.6-B8", "unrelated-L256-head0.6-B8"
CELLS = ("edited", "edited-gpt2", "hh-rlhf", "hh-rlhf-gpt2")


def reproduced_row(index: int):
    """A row of the paper page's re-measure table: step speedup, time saved, memory ratio, accuracy change of
    branch pruning in the ``index``-th cell of the reproduced report."""
    return lambda d: tuple(reproduced(index, "branch@16", q)(d)
                           for q in ("step_speedup", "time_saved", "memory_ratio", "accuracy_change"))


#: the paper table's designs, and the re-measure of each: (page's cell name, design, published cell, reproduced cell)
TABLE_DESIGNS = ("branch", "antithetic", "sequence", "position-bernoulli", "stratified-coupled", "all", "all-coupled")
REMEASURED = (
    *(("`edited` Llama", d, "edited", 0 if d in ("branch", "sequence", "stratified-coupled") else 5)
      for d in TABLE_DESIGNS),
    *(("`edited` GPT-2", d, "edited-gpt2", 6) for d in TABLE_DESIGNS),
    *(("HH-RLHF Llama", d, "hh-rlhf", 4 if d == "branch" else 7) for d in TABLE_DESIGNS),
    *(("HH-RLHF GPT-2", d, "hh-rlhf-gpt2", 3 if d == "branch" else 8) for d in TABLE_DESIGNS),
)


def remeasured_row(published: str, design: str, index: int):
    """A row of the paper page's table of every design re-measured: the published step speedup, then the
    interleaved re-measure's step speedup, time saved, peak memory and accuracy change."""
    def compute(data: dict) -> tuple[str, ...]:
        old = paper(published, f"{design}@16", "step_speedup")(load(REPO / PAPER))
        return old, *(reproduced(index, f"{design}@16", q)(data)
                      for q in ("step_speedup", "time_saved", "memory_ratio", "accuracy_change"))
    return compute


def profile_row(data: dict, category: str) -> dict:
    """One category's row of the profile's account (``lab/scripts/profile-trl-gap.py``)."""
    return next(r for r in data["account"]["rows"] if r["category"] == category)


def speedups(mode: str, prompt: str = "shared", memory: bool = True):
    """Online and cached speedup with their ideals (and the online step memory) of one mode."""
    def compute(data: dict) -> tuple[str, ...]:
        rows = [bench(data, mode, ref, prompt) for ref in ("online", "cached")]
        found = tuple(x(r[k]) for r in rows for k in ("speedup", "ideal_speedup"))
        return found + ((f"{rows[0]['peak_step_memory_mb']:.0f}",) if memory else ())
    return compute


def against_peer(mode: str, prompt: str = "shared"):
    """A configuration's line of a table against TRL: median step, step memory, tokens, times faster."""
    def compute(data: dict) -> tuple[str, ...]:
        r = bench(data, mode, "cached", prompt)
        return (f"{r['step_time_s']:.3f}", f"{r['peak_step_memory_mb']:.0f}", f"{r['tokens_executed']:.0f}",
                x(r["speedup_vs_peer"]))
    return compute


def trl_line(data: dict) -> tuple[str, ...]:
    p = peer(data)
    return f"{p['step_time_s']:.3f}", f"{p['peak_step_memory_mb']:.0f}", f"{p['tokens_executed']:.0f}"


def against_trl(data: dict, reference: str, name: str) -> tuple[str, str, str]:
    """Vanilla's ratio to a TRL peer and its bootstrap interval over the paired rounds, as the pages write them."""
    r, p = bench(data, "vanilla", reference), peer(data, name)
    low, high = paired_ratio_interval(p["step_times_s"], r["step_times_s"])
    return x(r[f"speedup_vs_{name}"]), x(low), x(high)


def real_trl(reference: str, name: str):
    """A line of the real model's table against TRL: the medians, their ratio, its bootstrap interval over the paired
    rounds, and the range of the ratio batch by batch (the bench's rounds: each round one batch, every configuration
    on it)."""
    def compute(data: dict) -> tuple[str, ...]:
        r, p = bench(data, "vanilla", reference), peer(data, name)
        paired = [theirs / ours for theirs, ours in zip(p["step_times_s"], r["step_times_s"], strict=True)]
        ratio, low, high = against_trl(data, reference, name)
        return (f"{r['step_time_s']:.2f}", mib(r["peak_step_memory_mb"]), f"{p['step_time_s']:.2f}",
                mib(p["peak_step_memory_mb"]), ratio, f"[{low}, {high}]", f"{x(min(paired))}-{x(max(paired))}")
    return compute


def real_pruning(mode: str):
    def compute(data: dict) -> tuple[str, ...]:
        r, base = bench(data, mode), bench(data, "vanilla")
        return (f"{r['step_time_s']:.2f}", x(r["speedup"]), f"{100 * (1 - 1 / r['speedup']):.0f}",
                mib(r["peak_step_memory_mb"]), x(r["peak_step_memory_mb"] / base["peak_step_memory_mb"]))
    return compute


def seed_line(seed: int):
    def compute(records: list[dict]) -> tuple[str, ...]:
        r = next(r for r in records if r["seed"] == seed)
        return str(seed), f"{r['val_loss']:.4f}", f"{r['val_accuracy']:.3f}"
    return compute


def paper_line(design: str, first: str, second: str):
    """One design's line of an epoch-matched table: ``first; second`` in each of the four cells."""
    return lambda data: tuple(paper(cell, f"{design}@16", q)(data) for cell in CELLS for q in (first, second))


def paper_table(design: str) -> list[Figure]:
    cells = " | ".join(["{}; {}"] * 4)
    return [Figure((A,), f"| `{design}` | {cells} |", PAPER, paper_line(design, "step_speedup", "time_saved")),
            Figure((A,), f"| `{design}` | {cells} |", PAPER, paper_line(design, "memory_ratio", "accuracy_change"))]


def hh_accuracies(data: dict) -> tuple[str, str, str]:
    means = [r["accuracy"][0] for c in ("hh-rlhf", "hh-rlhf-gpt2") for r in
             next(cell for cell in data["cells"] if cell["name"] == c)["rows"].values()]
    return f"{min(means):.2f}", f"{max(means):.2f}", f"{paper_row(data, 'hh-rlhf', 'vanilla@16')['loss'][0]:.3f}"


def sweep(data: dict, name: str, mode: str) -> tuple[str, str]:
    found = [r["time_ratio"] for r in data["rows"] if (r["sweep"], r["mode"]) == (name, mode)]
    return f"{found[0]:.2f}", f"{found[-1]:.2f}"


def scaling_answer(data: dict) -> tuple[str, ...]:
    branch = [r["time_ratio"] for r in data["rows"] if (r["sweep"], r["mode"]) == ("size", "branch")]
    errors = [s for s in data["summary"] if s["quantity"] == "time_error"]
    medians = sorted(round(100 * s["median_abs"]) for s in errors)
    return (f"{min(branch):.2f}", f"{max(branch):.2f}", *sweep(data, "size", "position-bernoulli"),
            *sweep(data, "size", "all"), *sweep(data, "length", "branch"), *sweep(data, "length", "all"),
            *sweep(data, "length", "position-bernoulli"), str(medians[0]), str(medians[-1]),
            f"{100 * max(s['max_abs'] for s in errors):.0f}")


def noise(data: dict) -> tuple[str, str]:
    found = [r["within"] / r["between"] for r in data["rows"]
             if r["mode"] == "position-coupled" and r["similarity"] == "near-duplicate"]
    return f"{min(found):.1f}", f"{max(found):.1f}"


def efficiencies(data: dict) -> tuple[str, str]:
    """The lowest and highest efficiency (measured / ideal speedup) of the pruned modes with the plain scorer."""
    found = [r["efficiency"] for r in data["results"] if r["mode"] != "vanilla" and r["scorer"] == "plain"]
    return f"{min(found):.2f}", f"{max(found):.2f}"


def compiled_row(mode: str):
    """A mode's line of the compile table: eager and compiled medians, their ratio, the numbers' differences."""
    def compute(data: dict) -> tuple[str, ...]:
        r = next(r for r in data["rows"] if r["mode"] == mode)
        return (f"{r['eager_s']:.4f}", f"{r['compiled_s']:.4f}", x(r["speedup"]),
                f"{r['max_objective_difference']:.1e}", f"{r['max_grad_relative_difference']:.1e}")
    return compute


def quiet_load(data: dict) -> tuple[str, str]:
    """The load average a bench's rounds ran under (``load`` in bench.json) and its torch threads."""
    return f"{data['load']['loadavg_mean']:.2f}", threads(data)


PERFORMANCE = [
    *(Figure((P,), f"| {m} | {{}} | {{}} | {{}} | {{}} | {{}} |", COMPILE, compiled_row(m))
      for m in ("vanilla", "branch", "all")),
    Figure((P,), "Graphs: {5} compiled in the warm-up rounds", COMPILE, lambda d: str(d["graphs"]["total"])),
    Figure((P,), "{0} in the 100 measured rounds", COMPILE, lambda d: str(d["graphs"]["after_warmup"])),
    Figure((P,), "The first compiled step took {9.0} s", COMPILE,
           lambda d: f"{d['rows'][0]['first_step_compiled_s']:.1f}"),
    Figure((P,), "| vanilla | 1.00x (1.00x), {1.701} s | 1.00x (1.00x), {1.208} s | {556} |", MED,
           lambda d: (*(f"{bench(d, 'vanilla', r)['step_time_s']:.3f}" for r in ("online", "cached")),
                      f"{bench(d, 'vanilla')['peak_step_memory_mb']:.0f}")),
    *(Figure((P,), f"| {m} | {{}} ({{}}) | {{}} ({{}}) | {{}} |", MED, speedups(m))
      for m in ("branch", "sequence", "position", "all")),
    Figure((P,), "(`medium`'s `all`, cached reference, chunked scorer: {0.43}-{0.57} s)", MED,
           lambda d: spread(bench(d, "all", "cached", scorer="chunked"))),
    Figure((P,), "The plain scorer's modes ran at {0.92}-{1.10} of their cost-model ideal", MED,
           efficiencies),
    Figure((P,), "`all`'s about {0.38x} of it", MED,
           lambda d: x(bench(d, "all")["peak_step_memory_mb"] / bench(d, "vanilla")["peak_step_memory_mb"])),
    Figure((P,), "With the chunked scorer `all` is {2.26x} online / {2.49x} cached (ideal {2.28x} / {2.69x})", MED,
           lambda d: tuple(x(bench(d, "all", r, scorer="chunked")[k]) for k in ("speedup", "ideal_speedup")
                           for r in ("online", "cached"))),
    Figure((P,), "`position` ran at {3.03x} (ideal {2.89x}) and its step memory above start is {141} MiB against "
           "vanilla's {478} ({3.4x} less); the chunked scorer alone takes {97} MiB ({4.9x} less, full supervision), "
           "both together {79} MiB", HH,
           lambda d: (*speedups("position")(d)[:2], f"{bench(d, 'position')['peak_step_memory_mb']:.0f}",
                      f"{bench(d, 'vanilla')['peak_step_memory_mb']:.0f}",
                      x(bench(d, "vanilla")["peak_step_memory_mb"] / bench(d, "position")["peak_step_memory_mb"], 1),
                      f"{bench(d, 'vanilla', scorer='chunked')['peak_step_memory_mb']:.0f}",
                      x(bench(d, "vanilla")["peak_step_memory_mb"]
                        / bench(d, "vanilla", scorer="chunked")["peak_step_memory_mb"], 1),
                      f"{bench(d, 'position', scorer='chunked')['peak_step_memory_mb']:.0f}")),
    Figure((P,), "with the cached reference `position` ran at {3.25x}, and its online steps took {0.20}-{0.23} s", HH,
           lambda d: (x(bench(d, "position", "cached")["speedup"]), *spread(bench(d, "position")))),
    Figure((P,), "Online reference: {3.45x} against {3.44x} for `position-bernoulli` (ideal {2.87x} / {2.88x}; over "
           "the summed steps {3.42x} / {3.21x}); cached reference: {3.31x} against {3.25x}; step memory {173} / "
           "{133} MiB against {177} / {176}", MODES,
           lambda d: (*(x(bench(d, m)[k]) for k in ("speedup", "ideal_speedup", "speedup_total_time")
                        for m in ("position", "position-bernoulli")),
                      *(x(bench(d, m, "cached")["speedup"]) for m in ("position", "position-bernoulli")),
                      *(f"{bench(d, m, r)['peak_step_memory_mb']:.0f}" for m in ("position", "position-bernoulli")
                        for r in ("online", "cached")))),
    Figure((P,), "`branch` is {1.03x} online and {1.01x} cached (ideal {1.32x} / {1.48x}), `all` {1.13x} / {1.21x} "
           "(ideal {1.84x} / {2.04x})", QS,
           lambda d: tuple(x(bench(d, m, r)[k]) for m in ("branch", "all") for k in ("speedup", "ideal_speedup")
                           for r in ("online", "cached"))),
    Figure((P,), "(its step holds {8.2} against vanilla's {12.8} MiB online)", QS,
           lambda d: tuple(f"{bench(d, m)['peak_step_memory_mb']:.1f}" for m in ("branch", "vanilla"))),
    Figure((P,), "on a quiet machine (load average {1.84} beside its {2} torch threads), float32, 4 steps", BODY,
           quiet_load),
    Figure((P,), "the medians gave {2.34x} online / {1.88x} cached", BODY,
           lambda d: tuple(x(bench(d, "vanilla", r)["speedup"]) for r in ("online", "cached"))),
    Figure((P,), "({2.09x} vs {2.34x} online, {1.94x} vs {1.88x} cached; step memory {213} vs {223} MiB)", BODY,
           lambda d: (*(x(bench(d, m, r)["speedup"]) for r in ("online", "cached") for m in ("branch", "vanilla")),
                      *(f"{bench(d, m)['peak_step_memory_mb']:.0f}" for m in ("branch", "vanilla")))),
    Figure((P,),
           "| vanilla, padded (baseline) | {1542} | 1.00x (1.00x), {1.513} s | 1.00x (1.00x), {1.002} s | {421} |",
           BODY, lambda d: (f"{bench(d, 'vanilla', prompt='padded')['tokens_executed']:.0f}",
                            *(f"{bench(d, 'vanilla', r, 'padded')['step_time_s']:.3f}" for r in ("online", "cached")),
                            f"{bench(d, 'vanilla', prompt='padded')['peak_step_memory_mb']:.0f}")),
    *(Figure((P,), f"| {m}, {p} | {{}} | {{}} ({bold}{{}}{bold}) | {{}} ({bold}{{}}{bold}) | {{}} |", BODY,
             lambda d, m=m, p=p: (f"{bench(d, m, prompt=p)['tokens_executed']:.0f}", *speedups(m, p)(d)))
      for m, p, bold in (("vanilla", "shared", "**"), ("branch", "shared", ""), ("all", "shared", "**"),
                         ("branch", "padded", ""), ("all", "padded", ""))),
    Figure((P,), "`all`'s median step was {1.03x} online and {1.24x} cached (ideal {1.29x} / {1.30x}) of "
           "vanilla-shared's", BODY,
           lambda d: (*(x(bench(d, "vanilla", r)["step_time_s"] / bench(d, "all", r)["step_time_s"])
                        for r in ("online", "cached")),
                      *(x(bench(d, "all", r)["ideal_speedup"] / bench(d, "vanilla", r)["ideal_speedup"])
                        for r in ("online", "cached")))),
    Figure((P,), "Shared vs padded **{2.04x}** faster with the online reference (ideal {2.22x}), {2.07x} cached (ideal "
           "{2.22x}; p90 step times up to {2.5}x the medians: the batches differ in length), step memory {667} vs "
           "{1312} MiB online",
           BODY_VANILLA,
           lambda d: (*(x(bench(d, "vanilla", r)[k]) for r in ("online", "cached")
                        for k in ("speedup", "ideal_speedup")),
                      f"{max(r['step_time_p90_s'] / r['step_time_s'] for r in d['results']):.1f}",
                      *(f"{bench(d, 'vanilla', prompt=p)['peak_step_memory_mb']:.0f}" for p in ("shared", "padded")))),
    Figure((P,), "on a quiet machine (load average {1.46} beside its {2} torch threads), float32, 4 steps, medians",
           HBT,
           quiet_load),
    Figure((P,), "TRL's four steps took {0.75}-{1.91} s, vanilla's (shared prompt) {0.38}-{0.66} s", HBT,
           lambda d: (*spread(peer(d)), *spread(bench(d, "vanilla", "cached")))),
    Figure((P,), "| TRL DPOTrainer, precomputed reference | {1.437} s | {1002} MiB | {1334} | 1.00x |", HBT, trl_line),
    Figure((P,), "| vanilla, padded | {1.144} s | {412} MiB | {1542} | {1.26x} |", HBT,
           against_peer("vanilla", "padded")),
    Figure((P,), "| all, padded | {0.638} s | {183} MiB | {1297} | {2.25x} |", HBT, against_peer("all", "padded")),
    Figure((P,), "| vanilla, shared prompt | {0.575} s | {220} MiB | {704} | {2.50x} |", HBT, against_peer("vanilla")),
    Figure((P,), "| all, shared prompt | {0.455} s | {188} MiB | {672} | **{3.16x}** |", HBT, against_peer("all")),
    Figure((P,), "TRL's {1002} MiB against vanilla's {220} with the shared prompt ({4.6x} less) and `all`'s {188}", HBT,
           lambda d: (f"{peer(d)['peak_step_memory_mb']:.0f}",
                      f"{bench(d, 'vanilla', 'cached')['peak_step_memory_mb']:.0f}",
                      memory_ratio(d, peer(d), bench(d, "vanilla", "cached")),
                      f"{bench(d, 'all', 'cached')['peak_step_memory_mb']:.0f}")),
    Figure((P,), "on a quiet machine (load average {1.72} beside its {2} torch threads), float32, 4 steps each", HGT,
           quiet_load),
    Figure((P,), "| TRL DPOTrainer, precomputed reference | {3.805} s | {2121} MiB | {1334} | 1.00x |", HGT, trl_line),
    Figure((P,), "| vanilla | {0.636} s | {350} MiB | {704} | **{5.98x}** |", HGT, against_peer("vanilla")),
    Figure((P,), "| all | {0.452} s | {212} MiB | {672} | **{8.42x}** |", HGT, against_peer("all")),
    Figure((P,), "The step's own memory is {6.1x} lower in vanilla.", HGT,
           lambda d: x(peer(d)["peak_step_memory_mb"] / bench(d, "vanilla", "cached")["peak_step_memory_mb"], 1)),
    Figure((P,), "Vanilla's four steps took {0.47}-{0.84} s and TRL's {2.33}-{6.00} s, so vanilla's {5.98x} comes with "
           "a wide spread",
           HGT, lambda d: (*spread(bench(d, "vanilla", "cached")), *spread(peer(d)),
                           x(bench(d, "vanilla", "cached")["speedup_vs_peer"]))),
    Figure((P,), "Shared vs padded: {1.19x} faster online and {1.21x} cached (the ideal is {1.34x}: quickstart prompts "
           "are 3 tokens, so the shared layout saves only the padding, {719} vs {1091} tokens per step), step memory "
           "{12.8} vs {15.1} MiB online", QS_PROMPTS,
           lambda d: (*(x(bench(d, "vanilla", r)["speedup"]) for r in ("online", "cached")),
                      x(bench(d, "vanilla")["ideal_speedup"]),
                      *(f"{bench(d, 'vanilla', prompt=p)['tokens_executed']:.0f}" for p in ("shared", "padded")),
                      *(f"{bench(d, 'vanilla', prompt=p)['peak_step_memory_mb']:.1f}" for p in ("shared", "padded")))),
]

TIME_TO_QUALITY = [
    Figure((T,), "reached the loss target in **{0.25x [0.20x-0.32x]}** of the better vanilla's time", CVMAP,
           loss_text("near-duplicate-L16-head0.97-B8", SCE)),
    Figure((T,), "and **{0.34x [0.32x-0.56x]} on 5 seeds not looked at before**", CVCONF,
           loss_text("near-duplicate-L16-head0.97-B8", SCE)),
    Figure((T,), "again, **{0.56x [0.52x-0.63x]}** (16 tokens) and **{0.55x [0.34x-0.90x]}** (64 tokens); the "
           "25 %-head cells TIE, {0.79x [0.57x-1.06x]}", CVMAP30,
           lambda d: tuple(loss_text(c, SCE)(d) for c in (
               "near-duplicate-L16-head0.97-B8", "near-duplicate-L64-head0.97-B8", "unrelated-L64-head0.25-B8"))),
    Figure((T,), "and {1.10x [0.97x-1.27x]}; at a 60 % head and 256 tokens TIE {1.04x [0.89x-1.59x]}", CVMAP230,
           lambda d: (loss_text("near-duplicate-L64-head0.25-B8", SCE)(d), loss_text(L256, SCE)(d))),
    Figure((T,), "position mode at three times the budget WINs, {0.63x [0.51x-0.79x]}", CVLONG30,
           loss_text(L256, "position")),
    Figure((T,), "at 512 tokens the LOSS is a {TIE}, {1.50x [0.80x-4.58x]}", CV51230,
           lambda d: (map_row(d, L512, "position")["loss_verdict"], loss_text(L512, "position")(d))),
    Figure((T,), "the pruned step measured {0.41x} of vanilla's CPU time in this run",
           "docs/records/study/cv-map-30/cells/near-duplicate-L16-head0.97-B8/study.json",
           lambda d: x(study_arm(d, f"{SCE}@8")["median_step_s"] / study_arm(d, "vanilla@8")["median_step_s"])),
    Figure((T,), "and {0.32x} in that one",
           "docs/records/study/cv-interleaved/cells/near-duplicate-L16-head0.97-B8/study.json",
           lambda d: x(study_arm(d, f"{SCE}@8")["median_step_s"] / study_arm(d, "vanilla@8")["median_step_s"])),
    Figure((T,), "at 64-token responses **{0.54x [0.38x-0.79x]}** against vanilla shrunk", CVMAP,
           loss_text("near-duplicate-L64-head0.97-B8", SCE)),
    Figure((T,), "TIEs, {1.00x [0.96x-1.06x]} (unrelated 64-token pairs)", CVMAP,
           loss_text("unrelated-L64-head0.25-B8", SCE)),
    Figure((T,), "and {0.92x [0.87x-1.05x]} (near-duplicate); at a 60 % head with 256-token responses, a TIE at "
           "{0.87x [0.72x-1.31x]}", CVMAP2,
           lambda d: (loss_text("near-duplicate-L64-head0.25-B8", SCE)(d), loss_text(L256, SCE)(d))),
    Figure((T,), "still a TIE at {0.77x [0.61x-1.09x]}", CVLONG, loss_text(L256, "position")),
    Figure((T,), "At 512 tokens and a 60 % head it {LOST}", CV512,
           lambda d: map_row(d, L512, "position")["loss_verdict"].replace("LOSS", "LOST")),
    Figure((T,), "({15} cells, 2 modes, 5 seeds each", MAP, lambda d: verdicts(d)[3]),
    Figure((T,), "{0} WIN, {18} LOSS, {12} TIE of {30} (cell, mode) verdicts. The noise model predicted \"vanilla "
           "better\" for every one of them and agrees with all {18} that were decided", MAP,
           lambda d: (*verdicts(d)[:3], str(len(d["rows"])),
                      str(sum(r["agreement"] == "agrees" for r in d["rows"])))),
    Figure((T,), "**{0} WIN, {20} LOSS, {10} TIE**, {29} of the {30} intervals overlapping the published ones", MAP30,
           remeasured(MAP)),
    Figure((T,), "(coupled positions, 64-token near-duplicates, 97 % head: {1.08x [0.71x-1.92x]})", MAP30,
           loss_text("near-duplicate-L64-head0.97-B8", "position-coupled")),
    Figure((T,), "said \"vanilla better\" in all {30} and agrees with all {20} decided", MAP30,
           lambda d: (str(sum(r["prediction"] == "vanilla better" for r in d["rows"])),
                      str(sum(r["agreement"] == "agrees" for r in d["rows"])))),
    Figure((T,), "coupled positions {0.92x [0.80x-1.13x]} of vanilla's time", MAP,
           loss_text("unrelated-L256-head0.25-B8", "position-coupled")),
    Figure((T,), "stratified coupled positions {0.83x [0.60x-1.10x]}: TIEs", DESIGNS,
           loss_text("unrelated-L256-head0.25-B8", "stratified-coupled")),
    Figure((T,), "beat same-batch vanilla, {0.53x [0.32x-0.73x]}, but vanilla with the batch shrunk to the pruned "
           "step's cost beat it by more ({0.42x [0.26x-0.66x]})", LONG,
           lambda d: (arm_ratio("stratified-coupled@8", "loss_time_ratio_same_batch")(d),
                      arm_ratio("vanilla@5 (cost-matched)")(d))),
    Figure((T,), "the 0.53x did not hold ({0.81x [0.55x-1.22x]}) and the smaller vanilla batch won again "
           "({0.59x [0.37x-1.00x]})", LONG2,
           lambda d: (arm_ratio("stratified-coupled@8", "loss_time_ratio_same_batch")(d),
                      arm_ratio("vanilla@5 (cost-matched)")(d))),
    Figure((T,), "win over the batch it prunes held ({0.45x [0.20x-0.73x]}) and the smaller batch's did not ({0.75x "
           "[0.41x-1.65x]};", LONG30,
           lambda d: (arm_ratio("stratified-coupled@8", "loss_time_ratio_same_batch")(d),
                      arm_ratio("vanilla@5 (cost-matched)")(d))),
    Figure((T,), "the longer budget {1.51x [0.71x-3.69x]}, pruning {0.75x [0.51x-1.39x]})", LONG230,
           lambda d: (arm_ratio("vanilla@5 (cost-matched)")(d),
                      arm_ratio("stratified-coupled@8", "loss_time_ratio_same_batch")(d))),
    Figure((T,), "coupled\n  positions included", "docs/records/study/map-long-30/map.json",
           lambda d: () if [r["loss_verdict"] for r in d["rows"]] == ["TIE"] * 4 else ("not all TIE",)),
    Figure((T,), "(pruning {0.45x}, the smaller batch {0.75x})", LONG30,
           lambda d: (ratio_only(arm_ratio("stratified-coupled@8", "loss_time_ratio_same_batch"))(d),
                      ratio_only(arm_ratio("vanilla@5 (cost-matched)"))(d))),
    Figure((T,), "**sequence pruning** lost on long unrelated pairs ({1.42x [1.21x-1.99x]})", DESIGNS,
           loss_text("unrelated-L256-head0.25-B8", "sequence")),
    Figure((T,), "(coupled positions {2.3}-{3.2}x, antithetic", MAP, noise),
]

PAPER_PAGE = [
    Figure((A,), "the accuracy frontier is\n  again vanilla's alone", REPRODUCED, lambda d: (
        () if d["cells"][9]["pareto_accuracy"] == ["vanilla@16/0.5", "vanilla@16/0.75", "vanilla@32"] else ("no",))),
    Figure((A,), "prefix fraction 0.75 ({0.4789} in {6.2} CPU-s, between vanilla's three quarters of an\n  epoch, "
           "{0.4955} in {5.0}, and its full epoch, {0.4757} in {6.6})", REPRODUCED, lambda d: tuple(
               v for design in ("sequence:min_fraction=0.75@16", "vanilla@16/0.75", "vanilla@16")
               for v in (f"{d['cells'][9]['rows'][design]['loss'][0]:.4f}",
                         f"{d['cells'][9]['rows'][design]['train_cpu_s'][0]:.1f}"))
           if d["cells"][9]["pareto_loss"][1:4] == ["vanilla@16/0.75", "sequence:min_fraction=0.75@16", "vanilla@16"]
           else ("not on the frontier",)),
    *(Figure((A,), f"| {cell} | `{design}` | {{}} | {{}} | {{}} | {{}} | {{}} |", REPRODUCED,
             remeasured_row(published, design, index)) for cell, design, published, index in REMEASURED),
    Figure((A,), "took **{18 % [16, 18]}** less training time with a step **{1.20x [1.19, 1.22]}** faster, and "
           "**{19 % [16, 22]}** with **{1.24x [1.19, 1.31]}** in a second run", REPRODUCED,
           lambda d: tuple(reproduced(i, "branch@16", q)(d) for i in (1, 2) for q in ("time_saved", "step_speedup"))),
    Figure((A,), "on a quiet machine (Llama), **{16 % [16, 17]}** and **{1.18x [1.18, 1.19]}**", REPRODUCED,
           lambda d: tuple(reproduced(4, "branch@16", q)(d) for q in ("time_saved", "step_speedup"))),
    Figure((A,), "| interleaved, quiet machine (wall/CPU 1.00) | {1.18x [1.18, 1.19]} | {16 % [16, 17]} | "
           "{0.83x [0.83, 0.83]} | {+0.012 [-0.004, +0.029]} |", REPRODUCED, reproduced_row(4)),
    Figure((A,), "with GPT-2, **{18 % [16, 20]}** and **{1.23x [1.18, 1.28]}**", REPRODUCED,
           lambda d: tuple(reproduced(3, "branch@16", q)(d) for q in ("time_saved", "step_speedup"))),
    Figure((A,), "| interleaved, wall/CPU 1.40 | {1.23x [1.18, 1.28]} | {18 % [16, 20]} | {0.83x [0.83, 0.83]} | "
           "{-0.013 [-0.043, +0.008]} |", REPRODUCED, reproduced_row(3)),
    Figure((A,), "reported {32 % [23, 39]} with {1.51x [1.33, 1.67]} (Llama) and {35 % [25, 42]} with {1.59x "
           "[1.35, 1.78]} (GPT-2)", PAPER,
           lambda d: tuple(paper(c, "branch@16", q)(d) for c in ("hh-rlhf", "hh-rlhf-gpt2")
                           for q in ("time_saved", "step_speedup"))),
    Figure((A,), "they cost about 0.01 ({-0.013 [-0.020, -0.004]} and {-0.014 [-0.020, -0.008]})", REPRODUCED,
           lambda d: tuple(reproduced(0, f"{m}@16", "accuracy_change")(d) for m in ("sequence", "stratified-coupled"))),
    Figure((A,), "| interleaved, wall/CPU 1.51 | {1.20x [1.19, 1.22]} | {18 % [16, 18]} | {0.83x [0.83, 0.83]} | "
           "{+0.012 [-0.004, +0.029]} |", REPRODUCED, reproduced_row(1)),
    Figure((A,), "| interleaved again, wall/CPU 1.33 | {1.24x [1.19, 1.31]} | {19 % [16, 22]} | {0.83x [0.83, 0.83]} | "
           "{+0.012 [-0.004, +0.029]} |", REPRODUCED, reproduced_row(2)),
    Figure((A,), "saves nothing measurable ({1.01x [0.94, 1.09]})", PAPER,
           paper("edited", "branch@16", "step_speedup")),
    Figure((A,), "Sequence pruning ({-0.005 [-0.010, -0.001]}) and coupled stratified positions "
           "({-0.004 [-0.013, +0.005]})", PAPER,
           lambda d: tuple(paper("edited", f"{m}@16", "accuracy_change")(d)
                           for m in ("sequence", "stratified-coupled"))),
    Figure((A,), "(accuracy {0.49}-{0.54}, chance; vanilla's exact loss rose from 0.693 to {0.816})", PAPER,
           hh_accuracies),
    Figure((A,), "than their intervals (all {0.49}-{0.52}, chance)", PAPER,
           lambda d: tuple(f"{f([r['accuracy'][0] for r in d['cells'][2]['rows'].values()]):.2f}" for f in (min, max))),
    Figure((A,), "cut the step's peak to {0.32x [0.30, 0.33]} of vanilla's on HH-RLHF", REPRODUCED,
           reproduced(7, "position-bernoulli@16", "memory_ratio")),
    Figure((A,), "sequence pruning to {0.78x [0.67, 0.88]} there and {0.82x [0.81, 0.83]} on `edited`", REPRODUCED,
           lambda d: tuple(reproduced(i, "sequence@16", "memory_ratio")(d) for i in (7, 0))),
    Figure((A,), "({0.83x [0.83, 0.83]} with Llama)", REPRODUCED, reproduced(4, "branch@16", "memory_ratio")),
    Figure((A,), "reaches the lowest loss ({0.470}), at {1.4x} vanilla's time", PAPER,
           lambda d: (f"{paper_row(d, 'edited', 'vanilla@8')['loss'][0]:.3f}",
                      x(paper_row(d, "edited", "vanilla@8")["time_ratio"][0], 1))),
    Figure((A,), "coupled stratified positions at rate 0.5 keep accuracy ({0.838}) where rate 0.125 loses it "
           "({0.765 [0.651, 0.832]})", PAPER,
           lambda d: (f"{paper_row(d, 'edited', 'stratified-coupled:rate=0.5@16')['accuracy'][0]:.3f}",
                      paper("edited", "stratified-coupled:rate=0.125@16", "accuracy")(d))),
    Figure((A,), "branch pruning's step costs {0.68}-{0.75} of vanilla's at every size, position pruning's rises from "
           "{0.44} to {0.90} as the LM head's share falls, `all` from {0.41} to {0.55}. Over response lengths "
           "256-2048 (3.2M parameters) branch pruning goes from {0.76} to {0.58} (1.3x to 1.7x), `all` from {0.48} "
           "to {0.32}, position pruning from {0.73} to {0.86}. The cost model predicted these time ratios to a "
           "median {4}-{6} % (at most {18} %)", SCALING, scaling_answer),
    *(row for design in ("branch", "antithetic", "sequence", "position-bernoulli", "stratified-coupled", "all",
                         "all-coupled") for row in paper_table(design)),
    Figure((A,), "Vanilla's held-out accuracy and exact loss after the epoch: `edited` {}, {}; `edited-gpt2` {}, {}; "
           "`hh-rlhf` {}, {}; `hh-rlhf-gpt2` {}, {}.", PAPER,
           lambda d: tuple(paper(c, "vanilla@16", q)(d) for c in CELLS for q in ("accuracy", "loss"))),
]

def study_arm(data: dict, arm: str) -> dict:
    """One arm's summary in a study's ``study.json``."""
    return next(a for a in data["summary"]["arms"] if a["arm"] == arm)


def sweep_row(data: dict, arm: str, chosen: bool) -> dict:
    """An arm's chosen (or its other) learning rate in a study's sweep of two."""
    return next(r for r in data["sweep"]["rows"] if r["arm"] == arm and r["chosen"] == chosen)


def at_budget_loss(run: dict) -> float:
    """A study run's exact held-out loss at the end of its time budget."""
    return [p for p in run["points"] if "time" in p["grids"]][-1]["loss"]


def learns_row(design: str):
    """A design's line of the real model's epoch cell at the learning budget."""
    qs = ("accuracy", "loss") if design == "vanilla" else ("time_saved", "step_speedup", "memory_ratio", "accuracy",
                                                          "loss")
    return lambda d: tuple(paper("smollm2-hh", f"{design}@8", q)(d) for q in qs)


def limit_row(mode: str):
    """A mode's line of the precision table: float32 step and utilisation, each 16-bit precision's ratio and share."""
    def compute(data: dict) -> tuple[str, ...]:
        rows = {r["variant"]: r for r in data["rows"] if r["mode"] == mode}
        out = [f"{rows['32-true']['step_time_s']:.2f}", f"{100 * rows['32-true']['utilisation']:.0f}"]
        for p in ("bf16-mixed", "bf16-true"):
            out += [x(rows[p]["vs_first"]), f"{100 * rows[p]['utilisation']:.0f}"]
        return tuple(out)
    return compute


def limit_range(data: dict) -> tuple[str, ...]:
    ratios = [r["vs_first"] for r in data["rows"] if r["variant"] != "32-true"]
    peaks = data["peaks"]
    return (f"{peaks['float32']['flops_per_s'] / 1e9:.0f}", f"{peaks['bfloat16']['flops_per_s'] / 1e9:.0f}",
            f"{min(ratios):.2f}", f"{max(ratios):.2f}x")


REAL_MODEL = [
    *(Figure((M,), f"| {m} | {{}} s, {{}} % | {{}}, {{}} % | {{}}, {{}} % |", LIMIT, limit_row(m))
      for m in ("vanilla", "branch", "position", "all")),
    Figure((M,), "(float32 {194} GFLOP/s, bfloat16 {400} GFLOP/s)", LIMIT, lambda d: limit_range(d)[:2]),
    Figure((M,), "bfloat16 makes the step {1.55}-{1.71x} faster", LIMIT, lambda d: limit_range(d)[2:]),
    Figure((M,), "| vanilla | - | 1 | 1 | {} | {} |", LEARNS, learns_row("vanilla")),
    *(Figure((M,), f"| {m} | {{}} | {{}} | {{}} | {{}} | {{}} |", LEARNS, learns_row(m))
      for m in ("branch", "position", "all")),
    Figure((M,), "the closest, branch, stood at {0.685} after {1.00}x of vanilla's training time", LEARNS,
           lambda d: (paper("smollm2-hh", "branch@8", "loss")(d).split(" ")[0],
                      f"{paper_row(d, 'smollm2-hh', 'branch@8')['time_ratio'][0]:.2f}")),
    Figure((M,), "(position at {0.689} after {0.92}x)", LEARNS,
           lambda d: (paper("smollm2-hh", "position@8", "loss")(d).split(" ")[0],
                      f"{paper_row(d, 'smollm2-hh', 'position@8')['time_ratio'][0]:.2f}")),
    *(Figure((M,), f"{m} {{}}", LEARNS, lambda d, m=m: (
        "{:+.4f} [{:+.4f}, {:+.4f}]".format(*paper_row(d, "smollm2-hh", f"{m}@8")["loss_change"]),))
      for m in ("branch", "position")),
    Figure((M,), "`all` {} each interval above zero", LEARNS, lambda d: (
        "{:+.4f} [{:+.4f}, {:+.4f}],".format(*paper_row(d, "smollm2-hh", "all@8")["loss_change"]),)),
    Figure((M,), "position step at {7.49} CPU-s against vanilla's fitted {7.77} s at batch {8}", TTQ, lambda d: (
        f"{d['calibration']['cost_matched']['position']['pruned_cost_s']:.2f}",
        f"{d['calibration']['cost_matched']['position']['vanilla_cost_at_batch_s']:.2f}",
        str(d['calibration']['cost_matched']['position']['batch']))),
    Figure((M,), "In the study's own steps position ran {7.90} CPU-s against vanilla's {8.46} ({33} steps in the "
           "budget against {30})", TTQ, lambda d: (
               *(f"{study_arm(d, arm)['median_step_s']:.2f}" for arm in ("position@8", "vanilla@8")),
               *(f"{study_arm(d, arm)['steps_in_budget']:.0f}" for arm in ("position@8", "vanilla@8")))),
    Figure((M,), "kept vanilla at {1e-05} ({0.6890} against {0.6890} at half the rate", TTQ, lambda d: (
        str(sweep_row(d, "vanilla@8", True)["lr"]),
        *(f"{sweep_row(d, 'vanilla@8', c)['mean']:.4f}" for c in (True, False)))),
    Figure((M,), "moved position to {5e-06} ({0.6921} against {0.6968}", TTQ, lambda d: (
        str(sweep_row(d, "position@8", True)["lr"]),
        *(f"{sweep_row(d, 'position@8', c)['mean']:.4f}" for c in (True, False)))),
    Figure((M,), "best held-out loss within the budget was {0.6859 [0.6832-0.6895]}, position's "
           "{0.6921 [0.6902-0.6931]}", TTQ, lambda d: tuple(
               "{:.4f} [{:.4f}-{:.4f}]".format(*study_arm(d, arm)["best_loss"])
               for arm in ("vanilla@8", "position@8"))),
    Figure((M,), "is a loss of {0.6892}, which vanilla itself\nreached on {4} of {5} seeds", TTQ, lambda d: (
        f"{d['summary']['target_loss']:.4f}",
        *(str(study_arm(d, 'vanilla@8')['loss_time_ratio'][k]) for k in ("reached", "seeds")))),
    Figure((M,), "**Position pruning reached it on {1} of {5} seeds: {LOSS}** (time to target\n"
           "{not reached [not reached-not reached]} of vanilla's)", TTQ, lambda d: tuple(
               str(study_arm(d, 'position@8')['loss_time_ratio'][k])
               for k in ("reached", "seeds", "verdict", "interval_text"))),
    Figure((M,), "ended the budget above ln 2 on {4} of 5 seeds (vanilla on\n{1})", TTQ, lambda d: tuple(
        str(sum(at_budget_loss(r) > math.log(2) for r in d["runs"] if r["arm"] == arm))
        for arm in ("position@8", "vanilla@8"))),
    Figure((M,), "The accuracy target ({0.416})", TTQ, lambda d: (f"{d['summary']['target_accuracy']:.3f}",)),
    Figure((M,), "position still lost there: {LOSS}, reached on {4} of 5 seeds against vanilla's {5}, time\n"
           "{not reached [1.02x-not reached]} of vanilla's", TTQ, lambda d: (
               study_arm(d, "position@8")["accuracy_time_ratio"]["verdict"],
               str(study_arm(d, "position@8")["accuracy_time_ratio"]["reached"]),
               str(study_arm(d, "vanilla@8")["accuracy_time_ratio"]["reached"]),
               study_arm(d, "position@8")["accuracy_time_ratio"]["interval_text"])),
    *(Figure((M,), "| {} | {} | {} |", LEARN, seed_line(seed)) for seed in range(5)),
    Figure((M,), "| **mean [95 % t-interval]** | **{0.6676 [0.6536, 0.6816]}** | **{0.599 [0.519, 0.680]}** |", LEARN,
           lambda r: (learning("val_loss", ".4f")(r), learning("val_accuracy", ".3f")(r))),
    Figure((M,), "| float32 | online reference | {6.38} s | {1,713} MiB | online | {20.11} s | {3,826} MiB | "
           "**{3.15x}** | {[2.58x, 3.52x]} | {2.03x-3.70x} |", FP32, real_trl("online", "trl-online")),
    Figure((M,), "| float32 | online reference | {6.38} s | {1,713} MiB | precomputed (TRL's cheaper) | {16.90} s | "
           "{3,826} MiB | {2.65x} | {} | {} |", FP32, real_trl("online", "trl")),
    Figure((M,), "| bfloat16 | online reference | {1.86} s | {1,069} MiB | online | {7.33} s | {2,765} MiB | "
           "**{3.93x}** | {} | {} |", BF16, real_trl("online", "trl-online")),
    Figure((M,), "| bfloat16 | cached reference | {1.47} s | {1,067} MiB | precomputed | {6.44} s | {2,765} MiB | "
           "**{4.38x}** | {} | {} |", BF16, real_trl("cached", "trl")),
    Figure((M,), "| bf16-mixed | online reference | {2.15} s | {1,496} MiB | online | {8.47} s | {3,261} MiB | "
           "**{3.95x}** | {} | {} |", MIXED, real_trl("online", "trl-online")),
    Figure((M,), "| bf16-mixed | online reference | {2.15} s | {1,496} MiB | precomputed | {8.06} s | {3,261} MiB | "
           "{3.76x} | {} | {} |", MIXED, real_trl("online", "trl")),
    Figure((M,), "Its bfloat16 matmul peak read {936} GFLOP/s", MIXED,
           lambda d: f"{d['peak_flops_per_s'] / 1e9:.0f}"),
    Figure((M,), "same rounds: branch {1.03x}, position {1.08x}, `all` {1.15x} vanilla's step, step memory {0.81x}, "
           "{0.95x} and {0.71x} of vanilla's {1,496} MiB", MIXED,
           lambda d: (*(x(bench(d, m)["speedup"]) for m in ("branch", "position", "all")),
                      *(x(bench(d, m)["peak_step_memory_mb"] / bench(d, "vanilla")["peak_step_memory_mb"])
                        for m in ("branch", "position", "all")), mib(bench(d, "vanilla")["peak_step_memory_mb"]))),
    Figure((M,), "it **chose {vanilla}**, after {160.7} s of calibration", "docs/records/real-model/auto-pruning.json",
           lambda d: (d["chose"], f"{d['calibration_s']:.1f}")),
    Figure((M,), "{AutoPruning: chose vanilla in 160.7 s of calibration on 4 pairs x 4 draws: no candidate reaches (1 "
           "+ within/between)/k <= 0.90: vanilla (position: k 1.08, within/between 6.81, (1 + within/between)/k 7.20; "
           "antithetic: k 1.36, within/between 1.18, (1 + within/between)/k 1.60)}",
           "docs/records/real-model/auto-pruning.json",
           lambda d: d["line"]),
    *(Figure((M,), f"| {mode} | {{}} s | {{}} | {{}} % | {{}} MiB ({{}}) |", FP32, real_pruning(mode))
      for mode in ("branch", "position", "all")),
    Figure((M,), "the LM head is {7.9} % of a vanilla forward", FP32, lambda d: f"{100 * d['head_share']:.1f}"),
    Figure((M,), "({746} tokens per step here against TRL's {1,285} with its padding, {1.7x})", FP32,
           lambda d: (mib(bench(d, "vanilla")["tokens_executed"]), mib(peer(d)["tokens_executed"]),
                      x(peer(d)["tokens_executed"] / bench(d, "vanilla")["tokens_executed"], 1))),
    Figure((M,), "{74} % of {159} GFLOP/s in float32 against TRL's {47} %", FP32,
           lambda d: (f"{100 * bench(d, 'vanilla')['utilisation']:.0f}", f"{d['peak_flops_per_s'] / 1e9:.0f}",
                      f"{100 * peer(d, 'trl-online')['utilisation']:.0f}")),
    Figure((M,), "{43} % of {945} GFLOP/s in bfloat16 against TRL's {22} %", BF16,
           lambda d: (f"{100 * bench(d, 'vanilla')['utilisation']:.0f}", f"{d['peak_flops_per_s'] / 1e9:.0f}",
                      f"{100 * peer(d, 'trl-online')['utilisation']:.0f}")),
    Figure((M,), "TRL's step took {2.45x} ours. Work explains {1.92x}", PROFILE,
           lambda d: (x(d["account"]["ratio"]), x(d["account"]["work_ratio"]))),
    Figure((M,), "projects every position, prompt and padding included: {3.85x} our head positions", PROFILE,
           lambda d: x(profile_row(d, "LM head")["work_ratio"])),
    Figure((M,), "Cost per token explains the other {1.28x}", PROFILE, lambda d: x(d["account"]["per_token_ratio"])),
    Figure((M,), "costs {1.60x} ours per token, the backward of its head and log-softmax {1.63x} per position, while "
           "the body costs the same per token forward ({0.99x}) and backward ({0.91x})", PROFILE,
           lambda d: tuple(x(profile_row(d, c)["per_token_ratio"]) for c in (
               "reference forward", "backward: head and log-softmax", "policy body", "backward: body and rest"))),
]


def checkpointing_row(name: str | None):
    """A row of the real model's table against TRL with its default activation checkpointing (``None``: vanilla)."""
    def compute(data: dict) -> tuple[str, ...]:
        r = bench(data, "vanilla") if name is None else peer(data, name)
        cells = (f"{r['step_time_s']:.2f}", mib(r["peak_step_memory_mb"]), f"{100 * r['utilisation']:.0f}")
        return cells if name is None else (*cells, *against_trl(data, "online", name))
    return compute


def checkpointing_rounds(data: dict) -> tuple[str, ...]:
    plain, checkpointed = (peer(data, n)["step_times_s"] for n in ("trl-online", "trl-online-checkpointing"))
    ratios = [c / p for c, p in zip(checkpointed, plain)]
    return str(sum(r < 1 for r in ratios)), str(len(ratios)), x(min(ratios)), x(max(ratios))


REAL_MODEL += [
    Figure((M,), "| exact DPO here (vanilla) | {7.30} s | {1,713} MiB | {53} % | - |", CKPT, checkpointing_row(None)),
    Figure((M,), "| TRL | {22.09} s | {3,657} MiB | {35} % | **{3.02x}** [{2.37x}, {3.87x}] |", CKPT,
           checkpointing_row("trl-online")),
    Figure((M,), "| TRL with activation checkpointing (its default) | {18.30} s | {1,799} MiB | {51} % | "
           "**{2.50x}** [{2.18x}, {3.30x}] |",
           CKPT, checkpointing_row("trl-online-checkpointing")),
    Figure((M,), "| exact DPO here (vanilla) | {2.31} s | {1,496} MiB | {35} % | - |", CKPT_MIXED,
           checkpointing_row(None)),
    Figure((M,), "| TRL | {10.40} s | {3,261} MiB | {16} % | **{4.51x}** [{4.11x}, {5.13x}] |", CKPT_MIXED,
           checkpointing_row("trl-online")),
    Figure((M,), "| TRL with activation checkpointing (its default) | {8.41} s | {1,741} MiB | {23} % | "
           "**{3.65x}** [{2.79x}, {4.27x}] |",
           CKPT_MIXED, checkpointing_row("trl-online-checkpointing")),
    Figure((M,), "shortened TRL's step (in {6} of the {8} rounds)", CKPT_MIXED,
           lambda d: checkpointing_rounds(d)[:2]),
    Figure((M,), "TRL online's median step read {10.40} s here and {8.47} s in the `bf16-mixed` run above", CKPT_MIXED,
           lambda d: (f"{peer(d, 'trl-online')['step_time_s']:.2f}",
                      f"{peer(load(REPO / MIXED), 'trl-online')['step_time_s']:.2f}")),
    Figure((M,), "({4.51x} [{4.11x}, {5.13x}] here, {3.95x} [{3.42x}, {4.83x}] there: the two intervals overlap)",
           CKPT_MIXED, lambda d: (*against_trl(d, "online", "trl-online"),
                                  *against_trl(load(REPO / MIXED), "online", "trl-online"))),
    Figure((M,), "(its steps spread over {4.1}-{13.1} s", CKPT_MIXED,
           lambda d: tuple(f"{f(peer(d, 'trl-online')['step_times_s']):.1f}" for f in (min, max))),
    Figure((M,), "({1,701} against {1,429} GFLOP per step by the cost model)", CKPT,
           lambda d: tuple(mib(peer(d, n)["flops"] / 1e9) for n in ("trl-online-checkpointing", "trl-online"))),
    Figure((M,), "shorter in {4} of the {5} rounds ({0.72x}-{1.11x} of the plain one's", CKPT, checkpointing_rounds),
    Figure((M,), "(vanilla {3.35}-{10.30} s", CKPT,
           lambda d: tuple(f"{f(bench(d, 'vanilla')['step_times_s']):.2f}" for f in (min, max))),
    Figure((M,), "its two peak readings differed ({183} and {133} GFLOP/s", CKPT,
           lambda d: tuple(f"{v / 1e9:.0f}" for v in d["peak_measure"]["readings_flops_per_s"])),
]

PAGE_FIGURES = [*PERFORMANCE, *TIME_TO_QUALITY, *PAPER_PAGE, *REAL_MODEL]
