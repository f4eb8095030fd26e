"""One source for each figure: every measured figure of the README, ``docs/index.md`` and the summaries of the
performance, time-to-quality, paper and real-model pages, tied to the stored result file it came from.

Each row of ``FIGURES`` is (pages, text, source, compute): ``text`` is the page's own wording with each figure in
braces, ``source`` the result file under ``docs/`` and ``compute`` reads the figures from it, formatted as the page
writes them. A row passes when every page named contains the text (braces dropped, whitespace and line breaks
collapsed) and the file gives exactly the figures in braces; so a figure that differs from its source, or a page
that states a figure another page states differently, fails. To add a figure: add its row (docs/contributing.md).
Rows a loop generates (a table's lines) write ``{}``: the file fills the figure and the page must hold the line.
Figures no stored file holds are listed in ``UNSOURCED``, each with where it came from."""

from __future__ import annotations

import re

import pytest

from figure_sources import (Figure, arm_ratio, bench, learning, load, loss_text, map_row, memory_ratio, paper,
                            paper_row, pct, peer, ratio_only, remeasured, spread, verdicts, x)
from figures_pages import (BF16, CKPT, LEARNS, CV512, CV51230, CVCONF, CVLONG, CVLONG30, CVMAP, CVMAP2, CVMAP30,
                           DESIGNS, FP32, HBT, HGT, HH, LEARN, LONG, LONG2, LONG30, LONG230, MAP, MAP30, MED, MIXED,
                           CKPT_MIXED, PAGE_FIGURES, PAPER, SCALING, TTQ, against_trl, study_arm)
from helpers import REPO

R, I = "README.md", "docs/index.md"
ND16, ND64, U64, U256 = ("near-duplicate-L16-head0.97-B8", "near-duplicate-L64-head0.97-B8",
                         "unrelated-L64-head0.25-B8", "unrelated-L256-head0.25-B8")
SCE = "stratified-coupled-exact-targets"


def efficiency_range(data: dict) -> tuple[str, str]:
    """The lowest and highest efficiency of the pruned modes with the plain scorer."""
    found = [r["efficiency"] for r in data["results"] if r["mode"] != "vanilla" and r["scorer"] == "plain"]
    return f"{min(found):.2f}", f"{max(found):.2f}"


def wins(data: dict) -> tuple[str, str]:
    found = sorted(r["loss_ratio"] for r in data["rows"] if r["loss_verdict"] == "WIN")
    return x(found[0]), x(found[-1])


def branch_paper(data: dict, cells: tuple[int, ...] | None = None) -> tuple[str, ...]:
    """Branch pruning's time saved and step speedup over the two HH-RLHF cells (or the ``cells``-th cells of a
    report): the lowest and the highest of each."""
    rows = ([paper_row(data, cell, "branch@16") for cell in ("hh-rlhf", "hh-rlhf-gpt2")] if cells is None
            else [data["cells"][i]["rows"]["branch@16"] for i in cells])
    saved = sorted(round(100 * r["time_saved"][0]) for r in rows)
    speed = sorted(r["step_speedup"][0] for r in rows)
    return str(saved[0]), str(saved[-1]), x(speed[0]), x(speed[-1])


def scaling(sweep: str, mode: str) -> list[float]:
    """A mode's measured time ratios along one sweep, in the sweep's order."""
    return [r["time_ratio"] for r in load(REPO / SCALING)["rows"] if (r["sweep"], r["mode"]) == (sweep, mode)]


def scaling_headline(data: dict) -> tuple[str, ...]:
    branch, position = scaling("size", "branch"), scaling("size", "position-bernoulli")
    errors = sorted(round(100 * s["median_abs"]) for s in data["summary"] if s["quantity"] == "time_error")
    big = [r["time_ratio_pred"] for r in data["real_shapes"]["rows"] if r["mode"] == "position-bernoulli"
           and r["shape"] in ("Llama-3-8B", "Llama-3-70B") and r["lengths"] != "hh-rlhf"]
    return (f"{min(branch):.2f}", f"{max(branch):.2f}", f"{scaling('length', 'branch')[-1]:.2f}",
            f"{position[0]:.2f}", f"{position[-1]:.2f}", str(errors[0]), str(errors[-1]),
            f"{min(big):.2f}", f"{max(big):.2f}")


FIGURES = [
    Figure((R, I), "position pruning reached vanilla's held-out loss target on {1} of {5} seeds (time to quality: "
           "{LOSS})", TTQ, lambda d: tuple(str(study_arm(d, "position@8")["loss_time_ratio"][k])
                                           for k in ("reached", "seeds", "verdict"))),
    Figure((R, I), "no pruned design saved more than {11} % of an epoch", LEARNS,
           lambda d: str(max(round(100 * r["time_saved"][0]) for k, r in next(c for c in d["cells"])["rows"].items()
                             if not k.startswith("vanilla")))),
    # the top of the README and of docs/index.md: against TRL, the real model, what pruning does
    Figure((R, I), "exact DPO here took **{4.6x}** less step memory on a body-heavy model", HBT,
           lambda d: memory_ratio(d, peer(d), bench(d, "vanilla", "cached"))),
    Figure((R, I), "and **{6.1x}** less on a GPT-2-vocabulary model", HGT,
           lambda d: memory_ratio(d, peer(d), bench(d, "vanilla", "cached"))),
    Figure((R, I), "and ran {2.50x} and", HBT, lambda d: x(bench(d, "vanilla", "cached")["speedup_vs_peer"])),
    Figure((R, I), "and {5.98x} faster per step (re-measured 2026-12-06", HGT,
           lambda d: x(bench(d, "vanilla", "cached")["speedup_vs_peer"])),
    Figure((R, I), "its held-out exact loss is {0.6676 [0.6536, 0.6816]} (ln 2", LEARN, learning("val_loss", ".4f")),
    Figure((R, I), "held-out preference accuracy {0.599 [0.519, 0.680]} (5 seeds", LEARN,
           learning("val_accuracy", ".3f")),
    Figure((R, I), "Per step it ran {3.15x} [{2.58x}, {3.52x}] faster than TRL in float32", FP32,
           lambda d: against_trl(d, "online", "trl-online")),
    Figure((R, I), "{2.50x} against TRL with its default activation checkpointing, in another run)", CKPT,
           lambda d: x(bench(d, "vanilla")["speedup_vs_trl-online-checkpointing"])),
    Figure((R, I), "and {3.93x} in bfloat16 weights", BF16, lambda d: x(bench(d, "vanilla")["speedup_vs_trl-online"])),
    Figure((R, I), "{3.95x} [{3.42x}, {4.83x}] in `bf16-mixed`", MIXED,
           lambda d: against_trl(d, "online", "trl-online")),
    Figure((R, I), "({3.65x} against TRL with its checkpointing, in another run)", CKPT_MIXED,
           lambda d: x(bench(d, "vanilla")["speedup_vs_trl-online-checkpointing"])),
    Figure((R, I), "{4.38x} with a cached reference against TRL's precomputed one", BF16,
           lambda d: x(bench(d, "vanilla", "cached")["speedup_vs_trl"])),
    Figure((R, I), "(branch {1.04x}, position {1.08x} per step; the LM head is {8} % of its forward)", FP32,
           lambda d: (x(bench(d, "branch")["speedup"]), x(bench(d, "position")["speedup"]), pct(d["head_share"]))),
    Figure((R, I), "one branch per pair: {1.49x}-{1.66x} per step on a small random model", MED,
           lambda d: (x(bench(d, "branch")["speedup"]), x(bench(d, "branch", "cached")["speedup"]))),
    Figure((R, I), "position pruning: {3.4x} less step memory on a head-heavy model", HH,
           lambda d: memory_ratio(d, bench(d, "vanilla"), bench(d, "position"))),
    Figure((R, I), "reached the loss target in {0.25x}-", CVMAP, lambda d: wins(d)[0]),
    Figure((R, I), "-{0.56x} of the better vanilla's", CVMAP30, lambda d: wins(d)[1]),
    Figure((R, I), "every other design in none ({0} wins, {18} losses, {12} ties over {15} cells", MAP, verdicts),
    Figure((R, I), "{0} wins, {20} losses, {10} ties re-measured interleaved on new seeds, {29} of {30} intervals",
           MAP30, remeasured(MAP)),
    Figure((R,), "{0} wins, {20} losses and {10} ties, {29} of the {30} intervals overlapping", MAP30, remeasured(MAP)),
    # the README's results
    Figure((R,), "the shipped modes ran at {0.92}-{1.10} of their cost-model ideal: one", MED, efficiency_range),
    Figure((R,), "one back-propagated branch per pair was {1.49x} faster per step with an online reference, {1.66x} "
           "with a cached one; `configs/modes/all.yaml` {2.42x} and {2.69x}. Every pruned mode's step holds less "
           "memory than vanilla's, `all`'s {0.38x} of it", MED,
           lambda d: (*(x(bench(d, m, ref)["speedup"]) for m in ("branch", "all") for ref in ("online", "cached")),
                      x(bench(d, "all")["peak_step_memory_mb"] / bench(d, "vanilla")["peak_step_memory_mb"]))),
    Figure((R,), "Position pruning takes {3.4x} less step memory on a head-heavy model (V=32768), the chunked scorer "
           "{4.9x} less", HH, lambda d: (memory_ratio(d, bench(d, "vanilla"), bench(d, "position")),
                                        memory_ratio(d, bench(d, "vanilla"), bench(d, "vanilla", scorer="chunked")))),
    Figure((R,), "vanilla here (shared prompt, cached reference) ran {5.98x} faster per step, `all` {8.42x} "
           "(vanilla's four steps took {0.47}-{0.84} s, TRL's {2.33}-{6.00} s), with {6.1x} less step memory in "
           "vanilla",
           HGT, lambda d: (*(x(bench(d, m, "cached")["speedup_vs_peer"]) for m in ("vanilla", "all")),
                           *spread(bench(d, "vanilla", "cached")), *spread(peer(d)),
                           memory_ratio(d, peer(d), bench(d, "vanilla", "cached")))),
    Figure((R,), "reached the loss target in {0.25x [0.20x-0.32x]} of the better vanilla's time where the LM head is "
           "{97} % of a step", CVMAP, lambda d: (map_row(d, ND16, SCE)["loss_text"], pct(map_row(d, ND16, SCE)
                                                                                       ["head_share"]))),
    Figure((R,), "({0.34x [0.32x-0.56x]} on 5 new seeds,", CVCONF, loss_text(ND16, SCE)),
    Figure((R, "docs/time-to-quality.md"), "{0.31x [0.27x-0.48x]}", "docs/records/study/cv-interleaved/map.json",
           loss_text(ND16, SCE)),
    Figure((R,), "arms timed interleaved, {0.56x [0.52x-0.63x]} on those seeds again a day later;", CVMAP30,
           loss_text(ND16, SCE)),
    Figure((R,), "{0.54x [0.38x-0.79x]} at 64-token", CVMAP, loss_text(ND64, SCE)),
    Figure((R,), "a WIN at {0.63x [0.51x-0.79x]} on", CVLONG30, loss_text("unrelated-L256-head0.6-B8", "position")),
    Figure((R,), "20 vanilla steps; a {TIE} on 5 more seeds", CV51230,
           lambda d: map_row(d, "unrelated-L512-head0.6-B8", "position")["loss_verdict"]),
    Figure((R,), "tied where the head is 25 % ({1.00x},", CVMAP, ratio_only(loss_text(U64, SCE))),
    Figure((R,), ", {0.92x}) or 60 % with 256-token responses ({0.87x [0.72x-1.31x]};", CVMAP2,
           lambda d: (ratio_only(loss_text("near-duplicate-L64-head0.25-B8", SCE))(d),
                      loss_text("unrelated-L256-head0.6-B8", SCE)(d))),
    Figure((R,), "; {0.77x [0.61x-1.09x]} at three times the budget on new seeds,", CVLONG,
           loss_text("unrelated-L256-head0.6-B8", "position")),
    Figure((R,), "and {lost} at 512-token responses", CV512,
           lambda d: {"LOSS": "lost"}.get(map_row(d, "unrelated-L512-head0.6-B8", "position")["loss_verdict"])),
    Figure((R,), "{15} cells over response length {16}-{256}, LM-head share {3}-{97} %", MAP,
           lambda d: (verdicts(d)[3], str(min(r["length"] for r in d["rows"])),
                      str(max(r["length"] for r in d["rows"])), pct(min(r["head_share"] for r in d["rows"])),
                      pct(max(r["head_share"] for r in d["rows"])))),
    Figure((R,), "found **{0} wins, {18} losses and {12} ties**", MAP, lambda d: verdicts(d)[:3]),
    Figure((R,), "(coupled positions {0.92x [0.80x-1.13x]}, stratified coupled", MAP,
           loss_text(U256, "position-coupled")),
    Figure((R,), "stratified coupled {0.83x [0.60x-1.10x]})", DESIGNS, loss_text(U256, "stratified-coupled")),
    Figure((R,), "beat same-batch vanilla on seeds 0-9 ({0.53x [0.32x-0.73x]} of its time;", LONG,
           arm_ratio("stratified-coupled@8", "loss_time_ratio_same_batch")),
    Figure((R,), "{0.81x [0.55x-1.22x]} on new seeds)", LONG2,
           arm_ratio("stratified-coupled@8", "loss_time_ratio_same_batch")),
    Figure((R,), "beat it by more in both runs ({0.42x},", LONG, ratio_only(arm_ratio("vanilla@5 (cost-matched)"))),
    Figure((R,), ", {0.59x}); re-run on seeds 30-34", LONG2, ratio_only(arm_ratio("vanilla@5 (cost-matched)"))),
    Figure((R,), "the batch it prunes held ({0.45x [0.20x-0.73x]}) and the smaller batch's\ndid not ({0.75x "
           "[0.41x-1.65x]};", LONG30, lambda d: (arm_ratio("stratified-coupled@8", "loss_time_ratio_same_batch")(d),
                                                arm_ratio("vanilla@5 (cost-matched)")(d))),
    Figure((R,), "{1.51x} at the longer budget)", LONG230, ratio_only(arm_ratio("vanilla@5 (cost-matched)"))),
    Figure((R,), "one epoch with branch pruning took {16}-{19} % less training time with a {1.18x}-{1.24x} faster step",
           "docs/records/paper-results/reproduced/paper.json", lambda d: branch_paper(d, (1, 2, 3, 4))),
    Figure((R,), "(the {32}-{35} % and {1.51x}-{1.59x} published earlier were timed under load", PAPER, branch_paper),
    Figure((R,), "cost {0.28}-{0.31} of held-out accuracy", PAPER,
           lambda d: tuple(f"{-paper_row(d, c, 'branch@16')['accuracy_change'][0]:.2f}"
                           for c in ("edited", "edited-gpt2"))),
    Figure((R,), "(`edited`, {21} designs)", PAPER, lambda d: str(len(d["cells"][0]["rows"]))),
    Figure((R,), "branch pruning's step stays {0.68}-{0.75} of vanilla's from 1.2M to 42M parameters and falls to "
           "{0.58} at 2,048-token responses, while position pruning's rises from {0.44} to {0.90} as the LM head's "
           "share of the step falls (measured on the CPU, the cost model within a median {4}-{6} %; predicted "
           "{0.95}-{0.99} for Llama-3-8B and 70B)", SCALING, scaling_headline),
    # what the accuracy change on `edited` says in the paper's answers
    Figure(("docs/paper.md",), "one epoch with branch pruning ended at {0.560} held-out accuracy against vanilla's "
           "{0.844} ({-0.284 [-0.326, -0.233]})", PAPER,
           lambda d: (f"{paper_row(d, 'edited', 'branch@16')['accuracy'][0]:.3f}",
                      f"{paper_row(d, 'edited', 'vanilla@16')['accuracy'][0]:.3f}",
                      paper("edited", "branch@16", "accuracy_change")(d))),
    *PAGE_FIGURES,
]

#: figures the pages state that no stored result file holds: (page, text, where it came from)
UNSOURCED = [
    (I, "`val/loss` falls from 0.151 (step 40) to 0.013 (step 240)", "a quickstart run; no metrics.csv is kept"),
    (I, "28-33 s of wall time for 240 steps", "/usr/bin/time at 23b6166 (CHANGELOG)"),
    (I, "stepped 1.56x slower with one thread than with two", "a measurement kept in CHANGELOG only"),
    (R, "(4:39 on 2 quiet cores)", "a pytest run"),
    (R, "83 min on 2 CPU cores", "the map's wall time, in docs/study-log.md only (map.json was resumed)"),
]

FIGURE = re.compile(r"\{([^{}]*)\}")


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def name(figure: Figure) -> str:
    plain = FIGURE.sub(r"\1", figure.text)
    return f"{figure.pages[0]}:{plain[:60]}"


@pytest.mark.parametrize("figure", FIGURES, ids=name)
def test_each_figure_is_its_source(figure):
    wanted = FIGURE.findall(figure.text)
    got = figure.compute(load(REPO / figure.source))
    got = [got] if isinstance(got, str) else list(got)
    assert len(got) == len(wanted), f"{figure.source} gives {got} for {len(wanted)} figures: {figure.text}"
    stated = [w or g for w, g in zip(wanted, got)]  # an empty {} is a generated table's cell: the file fills it
    assert got == stated, f"{figure.source} gives {got}, the pages state {stated}: {figure.text}"
    parts = iter(stated)
    text = flat(FIGURE.sub(lambda _: next(parts), figure.text))
    missing = [page for page in figure.pages if text not in flat((REPO / page).read_text())]
    assert not missing, f"{missing} no longer state {text!r}: restate it from {figure.source} or update its row"


@pytest.mark.parametrize("page, text, why", UNSOURCED, ids=lambda v: str(v)[:40])
def test_the_unsourced_figures_are_the_listed_ones(page, text, why):
    assert text in flat((REPO / page).read_text()), f"{page} no longer states {text!r}: drop it from UNSOURCED"


def test_no_page_says_not_shown_once_shown():
    pages = ["README.md", *(f"docs/{p}.md" for p in ("index", "performance", "time-to-quality", "paper", "real-model"))]
    stale = [p for p in pages if re.search(r"not shown(\W+yet)?\)", (REPO / p).read_text())]
    assert not stale, f"{stale} say time to quality is not shown: it is (docs/time-to-quality.md)"
