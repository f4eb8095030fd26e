"""Generations of SmolLM2-135M-Instruct before and after DPO, on the same held-out HH-RLHF prompts: the shared GGUF
model, and the folder ``lab/scripts/real-model-learning.py --export`` wrote (seed 0's run), each driven as
``docs/export.md`` tells a user to drive an export: ``AutoModelForCausalLM.from_pretrained(out)``, the prompt's ids
as training built them (chat template, BOS as the data module adds it), greedy decoding.

    python lab/scripts/real-model-samples.py --after /tmp/learn/export-seed0 \
        --out docs/records/real-model/samples.md [--n 6]

The prompts are the first ``--n`` pairs of seed 0's held-out split whose prompt fits in 128 tokens (same data settings
as the learning run), whose chosen and rejected responses are printed beside the generations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo.models import Pretrained

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
GGUF = SHARED / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
DATA = SHARED / "data/hh-rlhf/harmless-base-test.jsonl.gz"


def held_out(n: int) -> tuple[PreferenceDataModule, list[dict]]:
    dm = PreferenceDataModule(path=str(DATA), tokenizer=str(GGUF), val_fraction=0.05, seed=0, max_length=192,
                              max_prompt_length=128, dialogues="messages", on_bad_row="skip", batch_size=8)
    dm.setup("fit")
    # prompts the data did not cut (a cut one keeps its end but loses the system message and its first turns)
    whole = [row for row in dm.val_dataset if len(row["prompt_ids"]) < dm.max_prompt_length]
    return dm, whole[:n]


@torch.no_grad()
def generate(model: torch.nn.Module, prompt_ids: list[int], eos: int, max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt_ids):].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--after", type=Path, required=True, help="the exported folder of the trained model")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    dm, rows = held_out(args.n)
    tok = dm.tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    models = {"before": Pretrained(str(GGUF), dtype="float32").build().eval(),
              "after": AutoModelForCausalLM.from_pretrained(args.after, dtype=torch.float32).eval()}
    lines = [f"# SmolLM2-135M-Instruct before and after DPO: {args.n} held-out HH-RLHF prompts", "",
             f"Written by `python lab/scripts/real-model-samples.py --after {args.after} --out {args.out} "
             f"--n {args.n}`: "
             f"greedy, at most {args.max_new_tokens} new tokens; *before* is the shared GGUF model, *after* seed 0's "
             "export of `lab/scripts/real-model-learning.py`. Prompts are shown as the model read them (its chat "
             "template), the first held-out pairs whose prompt was not cut.", ""]
    for i, row in enumerate(rows):
        lines += [f"## Held-out pair {i + 1}", "", "Prompt:", "", "```", tok.decode(row["prompt_ids"]).strip(), "```",
                  ""]
        for name, ids in (("chosen (HH)", row["chosen_ids"]), ("rejected (HH)", row["rejected_ids"])):
            lines += [f"{name}:", "", "```", tok.decode(ids, skip_special_tokens=True).strip(), "```", ""]
        for name, model in models.items():
            text = tok.decode(generate(model, row["prompt_ids"], eos, args.max_new_tokens), skip_special_tokens=True)
            lines += [f"**{name}**:", "", "```", text.strip() or "(empty)", "```", ""]
        print(f"pair {i + 1} done", flush=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
