"""Count what one forward of a step executes on HH-RLHF: real tokens, padding, and the prompt's share.

Reads the shared harmless-base test file (2,312 pairs) with the real GPT-2 tokenizer through the package's own
pipeline (``PreferenceDataModule``: ``max_length`` 512, ``max_prompt_length`` 256, the training split after the
5% validation hold-out), one epoch of training batches, with length grouping on and off, and for each batch
plans the unpruned step (every position of both responses of every pair) in the two layouts:

* ``padded``: one row per response, the prompt left-padded to the batch's longest, responses right-padded
  (``shared_prompt: false``);
* ``shared``: one sequence per pair, prompt and common response prefix once, padded at the end to the longest
  pair (``shared_prompt: true``, the default).

For each it prints, per step and averaged over the epoch, the tokens entering the model body in one pass over
the batch (the policy's forward of an unpruned step; the online reference runs the same), the real ones among
them and the padding as a share of the real tokens; beside them the count of a TRL-style concatenated pass
(``2B`` rows of prompt + response, right-padded to the longest row, every token fed). Counts only, no timing::

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python lab/scripts/measure_padding.py

``--quantiles`` prints instead the 5%-step quantiles of the prompt and response lengths of the same pairs: the
table ``lit_prunedpo_lab.bench.presets.HH_RLHF_LENGTHS`` that the ``hh-body`` benchmark preset draws lengths from.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from lit_prunedpo.data import PreferenceDataModule  # noqa: E402
from lit_prunedpo.step.execute import StepExecutor, layout_for  # noqa: E402
from lit_prunedpo.layout import PairLengths  # noqa: E402
from lit_prunedpo.step.plan import exact_plan, prompt_and_common_lengths  # noqa: E402

SHARED = Path(__file__).resolve().parents[3] / "shared"


def count(batch) -> dict[str, int]:
    """Tokens of one unpruned pass over ``batch`` in each layout."""
    out = {}
    plan, pairs = exact_plan(batch), PairLengths.of(batch)
    for layout in ("padded", "shared"):
        forwards = StepExecutor(layout_for(layout == "shared")).forwards(plan.groups, pairs)
        out[f"{layout}_executed"] = forwards.tokens_executed
        out[f"{layout}_real"] = forwards.real_tokens_executed
    prompt_len, common = prompt_and_common_lengths(batch)
    lengths = batch.response_lengths
    out["trl"] = 2 * batch.num_pairs * int((prompt_len[:, None] + lengths).max())
    out["trl_real"] = int((prompt_len[:, None] + lengths).sum())
    out["prompt_in_shared"] = int(prompt_len.sum())
    out["common"] = int(common.sum())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(SHARED / "data/hh-rlhf/harmless-base-test.jsonl.gz"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers/gpt2"))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--quantiles", action="store_true", help="print the length quantiles and exit")
    args = parser.parse_args()
    if args.quantiles:
        dm = PreferenceDataModule(args.data, tokenizer=args.tokenizer, max_length=512, max_prompt_length=256)
        dm.setup("fit")
        q = torch.linspace(0, 1, 21, dtype=torch.float64)
        for column in ("prompt_ids", "chosen_ids", "rejected_ids"):
            lengths = torch.tensor([len(x) for x in dm.train_dataset[column]], dtype=torch.float64)
            print(f"{column.removesuffix('_ids')}: {torch.quantile(lengths, q).round().long().tolist()}")
        return
    for batch_size in args.batch_sizes:
        for grouped in (True, False):
            dm = PreferenceDataModule(args.data, tokenizer=args.tokenizer, max_length=512, max_prompt_length=256,
                                      batch_size=batch_size, group_by_length=grouped)
            dm.setup("fit")
            counts = [count(batch) for batch in dm.train_dataloader()]
            mean = {k: statistics.fmean(c[k] for c in counts) for k in counts[0]}
            total = {k: sum(c[k] for c in counts) for k in counts[0]}
            print(f"batch {batch_size}, length grouping {'on' if grouped else 'off'}, {len(counts)} steps; "
                  "tokens per pass (mean per step):")
            for layout in ("padded", "shared"):
                executed, real = mean[f"{layout}_executed"], mean[f"{layout}_real"]
                pad = total[f"{layout}_executed"] - total[f"{layout}_real"]
                print(f"  {layout:6s}: executed {executed:7.1f}, real {real:7.1f}, "
                      f"padding {100 * pad / total[f'{layout}_real']:5.1f}% of real")
            print(f"  TRL-style concatenated: executed {mean['trl']:7.1f}, real {mean['trl_real']:7.1f}")
            print(f"  shared / padded executed: {total['shared_executed'] / total['padded_executed']:.3f}; "
                  f"prompt tokens are {100 * total['prompt_in_shared'] / total['shared_real']:.1f}% of the shared "
                  f"layout's real tokens; common response prefixes {mean['common']:.1f} tokens per step")


if __name__ == "__main__":
    main()
