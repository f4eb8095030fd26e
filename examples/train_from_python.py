"""Training from Python instead of the command line: the objects a YAML config names, built in code.

A tiny random Llama on the generated task by default (seconds on a CPU); ``--model`` takes what ``Pretrained``
takes (a hub name, a ``save_pretrained`` folder, a ``.gguf`` file) and then tokenizes with the model's own
tokenizer; ``--data`` a preference file (.json, .jsonl, .jsonl.gz, .parquet, .csv with prompt / chosen / rejected).
``--branch-pruning`` back-propagates one branch per pair (``RandomBranch``), re-weighted so the gradient stays
unbiased; validation always scores the exact, unpruned objective.

Run it:
    python examples/train_from_python.py --steps 20
    python examples/train_from_python.py --model HuggingFaceTB/SmolLM2-135M-Instruct --data pairs.jsonl --lr 5e-7
"""

from __future__ import annotations

import argparse
import functools
from typing import Sequence

import lightning as L
import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo.models import FromConfig, Pretrained
from lit_prunedpo.optim import WarmupCosineLR
from lit_prunedpo.samplers import RandomBranch

#: the quickstart's model (configs/quickstart.yaml), with ByT5's byte-level vocabulary
TINY_LLAMA = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)


def build(model: str | None, data: str | None, lr: float, branch_pruning: bool, batch_size: int,
          max_rows: int | None) -> tuple[PrunedDPO, PreferenceDataModule]:
    """The module (policy, its frozen reference, the samplers, the optimizer) and the data."""
    policy = Pretrained(model) if model else FromConfig(model_type="llama", config=TINY_LLAMA, seed=0)
    module = PrunedDPO(
        policy,
        beta=0.1,
        branch_sampler=RandomBranch() if branch_pruning else None,  # None: both branches, concatenated DPO
        optimizer=functools.partial(torch.optim.AdamW, lr=lr, weight_decay=0.0),
        scheduler=functools.partial(WarmupCosineLR, warmup_steps=2),  # spans the run (trainer.max_steps)
    )
    datamodule = PreferenceDataModule(path=data, tokenizer=model or "byt5", batch_size=batch_size,
                                      max_length=64 if model is None else 512,
                                      max_prompt_length=24 if model is None else 256, max_rows=max_rows)
    return module, datamodule


def main(argv: Sequence[str] | None = None) -> L.Trainer:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="what Pretrained takes (default: a tiny random Llama)")
    parser.add_argument("--data", default=None, help="a preference file (default: the generated task)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=2e-3, help="default: a tiny random model's; ~5e-7 pretrained")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-rows", type=int, default=None, help="use only the first N rows of the data")
    parser.add_argument("--branch-pruning", action="store_true")
    parser.add_argument("--out", default="runs/from_python")
    args = parser.parse_args(argv)
    L.seed_everything(1234)
    module, datamodule = build(args.model, args.data, args.lr, args.branch_pruning, args.batch_size, args.max_rows)
    trainer = L.Trainer(accelerator="auto", devices=1, max_steps=args.steps, val_check_interval=args.steps,
                        check_val_every_n_epoch=None, log_every_n_steps=min(10, args.steps),
                        default_root_dir=args.out)
    trainer.fit(module, datamodule=datamodule)
    print({k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.startswith("val/")})
    return trainer


if __name__ == "__main__":
    main()
