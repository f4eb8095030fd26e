"""The ``lit-prunedpo`` command: a LightningCLI over ``PrunedDPO`` and any LightningDataModule.

Subcommands ``fit``, ``validate``, ``test`` (and ``--print_config``) come from LightningCLI; the data module
is chosen by ``class_path`` like every other plug-in. Every ``fit`` ends with a checkpoint of its last step and a
summary (``FinalCheckpoint``, options ``--final.*``). ``export`` (a Hugging Face folder from a checkpoint) and
``configs`` (the shipped configs: listed, or copied into a folder to edit) are not Trainer methods, which is all
LightningCLI subcommands can be: ``main`` hands them to ``lit_prunedpo.export.main`` and :func:`configs_main`. The
quickstart config ships inside the package and is the default config when no ``--config`` is given:
``lit-prunedpo fit`` alone trains the quickstart. A given ``--config`` is used alone, so nothing from the quickstart
leaks into it unseen; it names a file, or a shipped config by its name under ``configs/`` (:func:`resolve_config`:
``--config quickstart``, ``--config modes/branch``, and ``--config configs/quickstart.yaml`` from a folder without
that file).

Start-up: this module imports neither torch nor lightning (nor the package's modules that do) at its top. The
command's own help (``lit-prunedpo --help``, from a parser of the same shape as LightningCLI's:
:func:`~lit_prunedpo.cli.top_level.top_level_parser`), ``export --help`` and ``configs`` answer without them;
LightningCLI, and with it lightning, is imported when a Trainer subcommand runs (``fit --help`` included: its options
are the Trainer's and the model's). ``PrunedDPOCLI`` (:mod:`lit_prunedpo.cli.lightning_cli`) is imported then too
(:func:`cli_class`; ``lit_prunedpo.cli.PrunedDPOCLI`` still names it).
"""

from __future__ import annotations

import logging
import sys
import traceback
import warnings
from typing import TYPE_CHECKING, Any

from lit_prunedpo.cli.top_level import DESCRIPTION, top_level_parser
from lit_prunedpo.cli.packaged_configs import (  # noqa: F401 - quickstart_config, resolve_config, shipped_configs: public here too
    configs_main, quickstart_config, resolve_config, resolve_config_args, shipped_configs,
)

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningCLI


def cli_class() -> type[LightningCLI]:
    """``PrunedDPOCLI``, imported at its first use: its base class, LightningCLI, imports lightning (and torch), which
    the command's help, ``export`` and ``configs`` do without."""
    from lit_prunedpo.cli.lightning_cli import PrunedDPOCLI

    return PrunedDPOCLI


def __getattr__(name: str) -> Any:  # noqa: ANN401
    # ``lit_prunedpo.cli.PrunedDPOCLI``: imported (and lightning with it) on first use
    if name == "PrunedDPOCLI":
        return cli_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _DropTips(logging.Filter):
    """Drops Lightning's "💡 Tip:" lines (adverts for its cloud loggers and model registry, at every run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def quiet_lightning_tips() -> None:
    """Install :class:`_DropTips` on the logger Lightning's ``rank_zero_info`` writes to (once)."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropTips) for f in logger.filters):
        logger.addFilter(_DropTips())


def build_cli(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and with ``run=True`` run) the CLI on ``args`` (default: ``sys.argv``); a ``--config`` that names a
    shipped config is given its file (:func:`resolve_config`, logged).

    Raises:
        ValueError: a ``--config`` that is neither a file nor a shipped config's name.
    """
    from lightning.pytorch import LightningDataModule
    from lightning.pytorch.utilities import rank_zero_info

    from lit_prunedpo.checkpoint import SaveRunConfig
    from lit_prunedpo.module import PrunedDPO

    # torch 2.13 deprecates the LeafSpec that Lightning's own _pytree still builds: one warning per run about code that
    # is neither the user's nor ours, and works
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # the same for peft's own call of a transformers property renamed in transformers 5
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated")
    given = sys.argv[1:] if args is None else args
    resolved, said = resolve_config_args(given)
    has_config = any(a in ("-c", "--config") or a.startswith("--config=") for a in resolved)
    defaults = [] if has_config else [str(quickstart_config())]
    quiet_lightning_tips()
    for line in said:
        rank_zero_info(line)
    return cli_class()(
        PrunedDPO,
        LightningDataModule,
        subclass_mode_data=True,
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"description": DESCRIPTION,
                       **{cmd: {"default_config_files": defaults} for cmd in ("fit", "validate", "test")}},
        args=args if resolved == given else resolved,
        run=run,
    )


def _constructor_error(err: BaseException) -> BaseException | None:
    """The exception a class's constructor raised, when jsonargparse re-raised it wrapped (once per nesting
    level of plug-ins); else ``None``."""
    found = None
    while err.__cause__ is not None:
        frames = traceback.extract_tb(err.__traceback__)
        if not frames or "jsonargparse" not in frames[-1].filename:
            break
        found = err = err.__cause__
    return found


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lit-prunedpo`` and ``python -m lit_prunedpo``."""
    given = sys.argv[1:] if args is None else args
    if given[:1] == ["export"]:
        from lit_prunedpo.export import main as export_main

        return export_main(given[1:])
    if given[:1] == ["configs"]:
        return configs_main(given[1:])
    from lit_prunedpo.cli.fit_help import brief_help, full_help_args, wants_brief_help

    if wants_brief_help(given):
        print(brief_help())
        return None
    if "--help-all" in given:
        args = given = full_help_args(given)
    if not given or given[0] in ("-h", "--help"):
        # the command's help, or the error that no subcommand was given: the same words as LightningCLI's, without
        # importing lightning
        top_level_parser().parse_args(given)
        return None
    from lit_prunedpo.distributed import destroy_process_groups

    try:
        build_cli(args)
    except Exception as err:
        cause = _constructor_error(err)
        if cause is None:
            raise
        # jsonargparse wraps an error raised by a class's constructor (a bad argument, a missing tokenizer) in a
        # "Does not validate against any of the Union subtypes" message whose last line dumps the whole config;
        # the constructor's own message is the one to end the output with.
        raise cause.with_traceback(cause.__traceback__) from None
    finally:
        # Lightning leaves the process group alive, after a failed run too; a group freed during interpreter
        # shutdown can abort the process ("terminate called without an active exception").
        destroy_process_groups()
    return None


def command() -> None:
    """The ``lit-prunedpo`` console command: :func:`main` on ``sys.argv`` through the runner every console command
    goes through (:func:`lit_prunedpo.cli.user_errors.run_command`: one line for the package's own errors, a full disk,
    Ctrl-C and SIGTERM, with what was kept: :func:`kept_when_interrupted`)."""
    from lit_prunedpo.cli.user_errors import run_command

    run_command(main, kept=kept_when_interrupted)


def kept_when_interrupted() -> str | None:
    """What an interrupted ``lit-prunedpo`` kept (a fit that had begun says above which checkpoint itself)."""
    subcommand = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    # a fit stopped at once said what it kept (FinalCheckpoint): said again, not contradicted
    said = getattr(sys.modules.get("lit_prunedpo.callbacks.final_checkpoint"), "KEPT_AFTER_INTERRUPT", None)
    if subcommand == "fit" and said:
        return said.split("; ", 1)[1] if "; " in said else said.split(": ", 1)[-1]
    if subcommand == "fit":
        return "the checkpoints already written are kept; the same command with --ckpt_path last resumes the last one"
    if subcommand == "export":
        return "--out is as it was (an export is written beside it and moved into place once complete)"
    return None
