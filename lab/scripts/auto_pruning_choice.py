"""What ``AutoPruning`` picks, with its default candidates, in the cells of a regime map: its own calibration
(:func:`lit_prunedpo_lab.study.map_auto.calibrate_cell`: the cell's first vanilla batch at the study's initial weights),
run for several seeds per cell, with each candidate's cost ratio ``k``, noise ratio ``within / between`` and
``(1 + within / between) / k`` (the rule picks the lowest if it is at most 0.9).

The time-to-quality verdicts these choices should agree with are the maps' own (``docs/records/study/cv-map``,
``cv-confirm``, ``cv-map2``, ``map``): a cell where a mode won should get that mode, a cell where none did vanilla.

    python lab/scripts/auto_pruning_choice.py \
        --specs docs/records/study/cv-map/spec.yaml,docs/records/study/cv-map2/spec.yaml \
        --seeds 0,1,2 --out paper_results/auto-choice.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from lit_prunedpo.callbacks.auto_pruning import DEFAULT_CANDIDATES
from lit_prunedpo_lab.study.map_auto import calibrate_cell
from lit_prunedpo_lab.study.map_spec import load_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", default="docs/records/study/cv-map/spec.yaml",
                        help="comma-separated map specs (YAML files, or a built-in map's name: default, quick)")
    parser.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES),
                        help=f"comma-separated modes (default: AutoPruning's, {','.join(DEFAULT_CANDIDATES)})")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one calibration each per cell")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    candidates = [m for m in args.candidates.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    rows = []
    print("| cell | seed | choice | " + " | ".join(f"{m}: k, within/between, (1+w/b)/k" for m in candidates) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in candidates) + " |")
    with tempfile.TemporaryDirectory(prefix="auto-choice-") as work:
        for spec in [s for s in args.specs.split(",") if s]:
            for cell in load_spec(spec).cells:
                for seed in seeds:
                    decision = calibrate_cell(cell, candidates, seed, Path(work))
                    arms = {a["mode"]: a for a in decision["arms"]}
                    figures = [f"{arms[m]['k']:.2f}, {arms[m]['within'] / decision['between']:.3g}, "
                               f"{arms[m]['inefficiency']:.2f}" if m in arms else "-" for m in candidates]
                    print(f"| {cell.name} | {seed} | {decision['choice']} | " + " | ".join(figures) + " |", flush=True)
                    rows.append({"spec": spec, "cell": cell.name, **decision})
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
