"""How far each layout of the zoo's architectures is from the float32 plain forward at 16-bit precision, in units of
the plain forward's own rounding there: the measurement behind ``lit_prunedpo.probe_precision.ROUNDING_FACTOR``.

    python lab/scripts/probe-rounding.py [--types llama,mixtral] [--out rounding.json]

For every causal-LM architecture of the installed transformers (built tiny, as the zoo tests build them) and each of
bfloat16 autocast (``bf16-mixed``), float16 autocast (``16-mixed``) and bfloat16 weights (``bf16-true``): the layout
the automatic choice keeps (it must be the float32 one), and, where that is the packed layout, its largest distance
from the float32 plain forward divided by the plain forward's own. Prints the worst ratios and every architecture whose
choice or forward differs from float32. About 4 minutes on one CPU thread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import warnings

import torch

from lit_prunedpo.conformance import AutoLayout, _Probes, choose_layout, layout_error
from lit_prunedpo.layout import SharedPromptLayout
from lit_prunedpo.probe_precision import WorkingPrecision
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.zoo import build_tiny, causal_lm_types

PRECISIONS = {"32-true": (None, None), "bf16-mixed": (torch.bfloat16, None), "16-mixed": (torch.float16, None),
              "bf16-true": (None, torch.bfloat16)}


def measure(model_type: str) -> dict:
    model = build_tiny(model_type).eval()
    cells = {}
    for name, (autocast, weights) in PRECISIONS.items():
        if weights is not None:
            model.to(weights)
        context = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        try:
            with context:
                choice = choose_layout(AutoLayout(), [model], TokenScorer(), dropout_check=False)
                probe = _Probes(256, {id(model): WorkingPrecision.of(model)})[model]
                ratio = None
                if type(choice.layout) is SharedPromptLayout and probe.precision.reduced:
                    error = layout_error(model, choice.layout, TokenScorer(), probe.batch, probe.expected)
                    ratio = error / max(probe.rounding, 1e-12)
            cells[name] = {"layout": type(choice.layout).__name__, "ratio": ratio, "rounding": probe.rounding}
        except Exception as err:  # noqa: BLE001 - recorded and printed: the point is to see every failure
            cells[name] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        finally:
            model.float()
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default=None, help="comma-separated model types (default: every causal LM)")
    parser.add_argument("--out", default=None, help="write every cell to this JSON file")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    types = args.types.split(",") if args.types else causal_lm_types()
    results = {}
    for model_type in types:
        try:
            results[model_type] = measure(model_type)
        except Exception as err:  # noqa: BLE001 - an architecture that does not build tiny here
            print(f"{model_type}: not built ({type(err).__name__})")
    ratios = sorted(((c["ratio"], t, p) for t, cells in results.items() for p, c in cells.items()
                     if c.get("ratio") is not None), reverse=True)
    print(f"{len(results)} architectures; packed layout at 16 bits in {len({t for _, t, _ in ratios})} of them "
          f"({len(ratios)} cells); worst ratios:")
    for ratio, model_type, precision in ratios[:8]:
        print(f"  {ratio:6.2f}  {model_type} {precision}")
    for model_type, cells in results.items():
        base = cells["32-true"].get("layout")
        for precision, cell in cells.items():
            if "error" in cell or cell["layout"] != base:
                print(f"  differs: {model_type} {precision}: {cell.get('error') or cell['layout']} (float32: {base})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
