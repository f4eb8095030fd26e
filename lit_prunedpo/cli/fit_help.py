"""``lit-prunedpo fit --help``: the options a TRL user looks for, on one screen, in a fraction of a second.

LightningCLI's help for ``fit`` lists every option of the Trainer and of each plug-in (over 800 lines, about 5 s:
it imports lightning and builds the whole parser); the dozen a DPO user sets first (model, data, loss, beta, learning
rate, batch, precision, steps, output) are lost in it. ``fit --help`` (or ``-h``) with nothing else prints
:data:`OPTIONS` instead, each with the name of TRL's ``DPOConfig`` field it stands for and the quickstart's value
(read from the shipped YAML, without lightning); ``fit --help-all`` is LightningCLI's full help, and ``fit -c FILE
--help`` too (its defaults are that file's). A test passes every option listed here through the real CLI.
"""

from __future__ import annotations

import textwrap
from typing import Any

#: (option, TRL's name for it, what it is); an option without a value in the quickstart shows none
OPTIONS = (
    ("--model.policy", "model_name_or_path", "the model: lit_prunedpo.models.Pretrained (a hub name, folder or "
                                             ".gguf) then --model.policy.init_args.name_or_path NAME"),
    ("--data.init_args.path", "dataset_name", "preference pairs: a .jsonl/.json/.parquet/.csv file or a hub name"),
    ("--data.init_args.tokenizer", "processing_class", "the tokenizer (a pretrained model's own: its name again)"),
    ("--model.loss", "loss_type", "sigmoid (default), ipo, hinge, robust, ... TRL's names; a list combines them"),
    ("--model.beta", "beta", "the DPO temperature"),
    ("--model.optimizer.init_args.lr", "learning_rate", "AdamW's learning rate"),
    ("--data.init_args.batch_size", "per_device_train_batch_size", "pairs per step on each device"),
    ("--trainer.accumulate_grad_batches", "gradient_accumulation_steps", "batches per optimizer step"),
    ("--trainer.precision", "bf16 / fp16", "32-true, bf16-mixed, bf16-true, 16-mixed"),
    ("--trainer.max_steps", "max_steps", "optimizer steps to train"),
    ("--trainer.max_epochs", "num_train_epochs", "epochs (with --trainer.max_steps -1)"),
    ("--data.init_args.max_length", "max_length", "prompt + response tokens kept per sequence"),
    ("--data.init_args.max_prompt_length", "max_prompt_length", "prompt tokens kept (the start is cut)"),
    ("--trainer.gradient_clip_val", "max_grad_norm", "gradient norm clipping (none if unset)"),
    ("--trainer.val_check_interval", "eval_steps", "steps between exact validations"),
    ("--trainer.log_every_n_steps", "logging_steps", "steps between logged rows"),
    ("--trainer.default_root_dir", "output_dir", "where checkpoints, logs and the run's config go"),
    ("--seed_everything", "seed", "the run's seed"),
    ("--ckpt_path", "resume_from_checkpoint", "last (this run's latest checkpoint) or a checkpoint file"),
)

FOOTER = """\
Pruning is an overlay on any config: -c configs/quickstart.yaml -c configs/modes/branch.yaml (lit-prunedpo configs
lists them); a pretrained model and its data: -c smollm2_hh (the recipe). Configs: -c FILE or a shipped name.
Every option (about 830 lines: the Trainer's and each plug-in's): lit-prunedpo fit --help-all
A plug-in's own options: lit-prunedpo fit --model.policy.help lit_prunedpo.models.Pretrained"""


def _lookup(config: dict[str, Any], option: str) -> Any:
    node: Any = config
    for key in option.lstrip("-").split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    if isinstance(node, dict):
        return node.get("class_path")
    return node


def brief_help() -> str:
    """The text ``fit --help`` prints."""
    import yaml

    from lit_prunedpo.cli.packaged_configs import quickstart_config

    quickstart = yaml.safe_load(quickstart_config().read_text()) or {}
    width = max(len(option) for option, _, _ in OPTIONS)
    lines = ["usage: lit-prunedpo fit [-c CONFIG ...] [--OPTION VALUE ...]", "",
             "Train a policy with DPO (exact unless a pruning overlay is added); with no -c, the quickstart.", "",
             "The options a TRL DPOTrainer user sets first (TRL's DPOConfig name in brackets; the quickstart's "
             "value):"]
    for option, trl, words in OPTIONS:
        value = _lookup(quickstart, option)
        shown = "" if value is None else f" (quickstart: {value})"
        lines.append(textwrap.fill(f"{option:<{width}}  [{trl}] {words}{shown}", 118, initial_indent="  ",
                                   subsequent_indent=" " * (width + 4)))
    return "\n".join([*lines, "", FOOTER])


def wants_brief_help(given: list[str]) -> bool:
    """``fit --help`` / ``fit -h`` and nothing else."""
    return len(given) == 2 and given[0] == "fit" and given[1] in ("-h", "--help")


def full_help_args(given: list[str]) -> list[str]:
    """``given`` with ``--help-all`` read as LightningCLI's ``--help``."""
    return ["--help" if arg == "--help-all" else arg for arg in given]
