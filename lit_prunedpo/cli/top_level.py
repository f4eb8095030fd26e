"""The ``lit-prunedpo`` command's words and top-level parser, without lightning.

:func:`top_level_parser` builds the parser LightningCLI builds at the top (``-c/--config``, ``--print_config``, the
subcommands and their help lines) from the standard library and jsonargparse only, so that ``lit-prunedpo --help``
and a missing subcommand are answered in a fraction of a second; ``PrunedDPOCLI`` (:mod:`.lightning_cli`)
lists the same commands (:func:`add_own_commands`). tests/test_startup.py checks that both helps are the same.
"""

from __future__ import annotations

from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser

from lit_prunedpo.cli.packaged_configs import CONFIGS_HELP

DESCRIPTION = ("DPO training with a randomly pruned computation graph (PrunedDPO). "
               "`lit-prunedpo fit` alone trains the quickstart; `lit-prunedpo export` writes the trained model out.")
EXPORT_HELP = ("Write a Hugging Face folder (model, tokenizer; LoRA merged or as an adapter) from a checkpoint; "
               "see: lit-prunedpo export --help")
CONFIG_HELP = "Path to a configuration file in json or yaml format."  # LightningCLI's words for its -c/--config
#: LightningCLI's subcommands here (``predict`` aside: :meth:`PrunedDPOCLI.subcommands`) with the help line it gives
#: each, the first line of the Trainer method's docstring; :func:`top_level_parser` writes them without importing
#: lightning (tests/test_startup.py checks that both helps are the same)
TRAINER_COMMANDS = {
    "fit": "Runs the full optimization routine.",
    "validate": "Perform one evaluation epoch over the validation set.",
    "test": "Perform one evaluation epoch over the test set. It's separated from fit to make sure you never run on "
            "your",
}
#: the commands ``main`` runs itself, before (and without) LightningCLI, with their help lines
OWN_COMMANDS = {"export": EXPORT_HELP, "configs": CONFIGS_HELP}


def add_own_commands(subcommands: Any) -> None:  # noqa: ANN401 - jsonargparse's _ActionSubCommands
    """List ``export`` and ``configs`` among ``subcommands`` (a parser's ``add_subcommands()``): only so that
    ``--help`` names them with the others; ``main`` runs them before any parser sees them."""
    for name, text in OWN_COMMANDS.items():
        subcommands.add_subcommand(name, ArgumentParser(description=text), help=text)


def top_level_parser() -> ArgumentParser:
    """The command's top-level parser, as LightningCLI builds it (``-c/--config``, ``--print_config``, the
    subcommands and their help lines) but without lightning: ``lit-prunedpo --help`` and a missing subcommand are
    answered from it in a fraction of a second. It parses nothing else: a subcommand goes to LightningCLI."""
    parser = ArgumentParser(description=DESCRIPTION, env_prefix="PL", default_env=False)
    parser.add_argument("-c", "--config", action=ActionConfigFile, help=CONFIG_HELP)
    subcommands = parser.add_subcommands()
    for name, text in TRAINER_COMMANDS.items():
        subcommands.add_subcommand(name, ArgumentParser(description=text), help=text)
    add_own_commands(subcommands)
    return parser
