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
command's own help (``lit-prunedpo --help``, from a parser of the same shape as LightningCLI's: :func:`top_level_parser`),
``export --help`` and ``configs`` answer without them; LightningCLI, and with it lightning, is imported when a Trainer
subcommand runs (``fit --help`` included: its options are the Trainer's and the model's). ``PrunedDPOCLI`` is defined
then too (:func:`cli_class`; ``lit_prunedpo.cli.PrunedDPOCLI`` still names it).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from lit_prunedpo.shipped_configs import (  # noqa: F401 - quickstart_config, resolve_config, shipped_configs: public here too
    CONFIGS_HELP, configs_main, quickstart_config, resolve_config, resolve_config_args, shipped_configs,
)

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningCLI


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


# --- the shipped configs ---------------------------------------------------------------------------------------------

# --- LightningCLI ----------------------------------------------------------------------------------------------------

@functools.cache
def cli_class() -> type[LightningCLI]:
    """``PrunedDPOCLI``, defined at its first use: its base class, LightningCLI, imports lightning (and torch), which
    the command's help, ``export`` and ``configs`` do without."""
    from lit_prunedpo import callbacks

    # every callback of the package imported (lit_prunedpo.callbacks imports each on first use): jsonargparse lists
    # a base class's subclasses in --help, and takes a class by its short name (--trainer.callbacks+=PruneEarly),
    # only among the classes imported
    for name in callbacks.__all__:
        getattr(callbacks, name)

    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, RichModelSummary, RichProgressBar
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.utilities import rank_zero_info

    from lit_prunedpo.callbacks.final_checkpoint import FinalCheckpoint
    from lit_prunedpo.callbacks.last_checkpoint import LastCheckpointAtValidation
    from lit_prunedpo.callbacks.model_summary import RichSummaryWithoutZeroFlops, SummaryWithoutZeroFlops
    from lit_prunedpo.callbacks.progress_bar import StepProgressBar
    from lit_prunedpo.checkpointing import (
        claim_checkpoint_folder, claim_log_version, install_atomic_io, lock_checkpoint_dirs, release_empty_claims,
        resolve_resume,
    )
    from lit_prunedpo.models import fill_vocab_size

    class PrunedDPOCLI(LightningCLI):
        """LightningCLI whose checkpoint errors name the checkpoint, whose checkpoint files are written atomically,
        whose runs each get a log version (without a logger: a checkpoint folder) of their own, and whose
        ``ckpt_path=last`` resumes from the newest readable checkpoint of the previous runs
        (``lit_prunedpo.checkpointing``)."""

        def _parse_ckpt_path(self) -> None:
            # LightningCLI reads --ckpt_path itself (for saved hyperparameters) before any strategy sees it; a corrupt
            # file would otherwise fail with a bare unpickling error that does not say which file.
            try:
                super()._parse_ckpt_path()
            except Exception as err:
                path = self.config[self.config.subcommand].get("ckpt_path")
                raise RuntimeError(f"could not read checkpoint {path}: {type(err).__name__}: {err}") from err

        def parse_arguments(self, parser, args) -> None:  # noqa: ANN001 - LightningArgumentParser, ArgsType
            # A logger the user names (--trainer.logger lightning.pytorch.loggers.TensorBoardLogger) must get its
            # required save_dir before jsonargparse validates the config, or the parse fails; Lightning's own default
            # logger gets the trainer's default_root_dir, and so does a chosen one without a save_dir (logged).
            if isinstance(args, (dict, Namespace)):
                return super().parse_arguments(parser, args)
            config = parser.parse_args(args, _skip_validation=True)
            for line in fill_logger_save_dirs(config[config.subcommand] if config.get("subcommand") else config):
                rank_zero_info(line)
            try:
                parser.validate(config)
            except (TypeError, KeyError) as err:  # as parse_args itself reports them: usage and message, exit code 2
                parser.error(str(err), err)
            self.config = config

        def before_instantiate_classes(self) -> None:
            # FromConfig without vocab_size takes the data's (len(tokenizer)): nobody should copy it by hand
            config = self.config[self.subcommand] if self.subcommand else self.config
            said = fill_vocab_size(config.get("model", {}).get("policy"), config.get("data"))
            if said is not None:
                rank_zero_info(said)
            for line in route_optimizer_args(config):
                rank_zero_info(line)

        # Outputs of one run are never torn or shared with another's (lit_prunedpo.checkpointing). The log version is
        # claimed when a subcommand runs, not at instantiation: lit-prunedpo-cache instantiates and logs nothing.
        def instantiate_trainer(self, **kwargs: Any) -> Trainer:
            config = self.config_init[self.subcommand] if self.subcommand else self.config_init
            given = config.get("trainer", {}).get("callbacks") or []
            given = {id(c) for c in (given if isinstance(given, list) else [given])}
            trainer_config = config["trainer"]
            if trainer_config.get("logger") in (None, True):  # every config, the shipped ones included
                # Lightning's default logger is TensorBoard's when tensorboard is installed, else CSVLogger: the files a
                # run writes (metrics.csv) would depend on what else is installed. Same folder as Lightning's default.
                trainer_config["logger"] = CSVLogger(save_dir=trainer_config.get("default_root_dir") or os.getcwd())
            trainer = super().instantiate_trainer(**kwargs)
            install_atomic_io(trainer)
            # Lightning's defaults, where the config names none of its own: a bar that shows "Epoch 0/-2", "v_num" and
            # cut-off names; a summary with a FLOPs column of zeros (nothing gives it an example input); a checkpoint
            # per validation beside FinalCheckpoint's last.ckpt, the same weights twice at the end. The
            # ModelCheckpoint keeps saving at each validation, into last.ckpt, which FinalCheckpoint then rewrites or
            # finds current.
            replacements = {
                RichProgressBar: lambda c: StepProgressBar(),
                RichModelSummary: lambda c: RichSummaryWithoutZeroFlops(c._max_depth, **c._summarize_kwargs),
                ModelSummary: lambda c: SummaryWithoutZeroFlops(c._max_depth, **c._summarize_kwargs),
            }
            for i, callback in enumerate(trainer.callbacks):
                if id(callback) in given:
                    continue
                if type(callback) in replacements:
                    trainer.callbacks[i] = replacements[type(callback)](callback)
                elif type(callback) is ModelCheckpoint and callback.monitor is None:
                    # last.ckpt at every validation (Lightning 2.6's ModelCheckpoint with save_top_k=0 writes none)
                    trainer.callbacks[i] = LastCheckpointAtValidation(dirpath=callback.dirpath, save_top_k=0,
                                                                      save_last=True)
            # FinalCheckpoint's summary is printed at teardown: after the progress bar's, which takes the bar off the
            # screen
            finals = [c for c in trainer.callbacks if isinstance(c, FinalCheckpoint)]
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, FinalCheckpoint)] + finals
            return trainer

        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            """LightningCLI's subcommands but ``predict``: ``PrunedDPO`` has no predict step, so the command could
            only fail; it is not offered (``--help`` does not list it, ``lit-prunedpo predict`` is an invalid
            choice)."""
            commands = LightningCLI.subcommands()
            commands.pop("predict", None)
            return commands

        def _add_subcommands(self, parser, **kwargs: Any) -> None:  # noqa: ANN001 - LightningArgumentParser
            super()._add_subcommands(parser, **kwargs)
            # ``export`` and ``configs`` are no Trainer methods, so LightningCLI cannot build them; ``main`` runs them
            # before LightningCLI parses anything. Listed here only so that ``--help`` names them with the others.
            add_own_commands(parser._subcommands_action)

        def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 - LightningArgumentParser
            # a forced callback: every fit saves its last step, whatever the config's callbacks are
            parser.add_lightning_class_args(FinalCheckpoint, "final")

        def _run_subcommand(self, subcommand: str) -> None:
            self._claimed: list[Path] = []
            try:
                super()._run_subcommand(subcommand)
            except BaseException:
                release_empty_claims(self._claimed)  # a run that failed before writing anything leaves no version_N
                raise

        def before_fit(self) -> None:
            self._claimed = claim_log_version(self.trainer)
            lock_checkpoint_dirs(self.trainer)  # the folders the user named; before the claim names the others
            claim_checkpoint_folder(self.trainer)
            config = self.config_init["fit"]
            config["ckpt_path"] = resolve_resume(self.trainer, config.get("ckpt_path"))

        def before_validate(self) -> None:
            self._claimed = claim_log_version(self.trainer)

        def before_test(self) -> None:
            self._claimed = claim_log_version(self.trainer)

    PrunedDPOCLI.__qualname__ = "PrunedDPOCLI"
    return PrunedDPOCLI


def __getattr__(name: str) -> Any:  # noqa: ANN401
    # ``lit_prunedpo.cli.PrunedDPOCLI``: defined (and lightning imported) on first use
    if name == "PrunedDPOCLI":
        return cli_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fill_logger_save_dirs(config: Namespace) -> list[str]:
    """Give each logger in ``config.trainer.logger`` whose class requires a ``save_dir`` (``TensorBoardLogger``,
    ``CSVLogger``) and has none the trainer's ``default_root_dir`` (the current folder when that is unset, as
    Lightning's default logger does). Returns one line per logger filled in."""
    trainer = config.get("trainer") or {}
    loggers = trainer.get("logger")
    root = trainer.get("default_root_dir") or os.getcwd()
    lines = []
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        if not isinstance(logger, Namespace) or not logger.get("class_path") or logger.get("init_args") is None:
            continue
        if "save_dir" not in logger.init_args or logger.init_args.save_dir is not None:
            continue
        module, _, name = logger.class_path.rpartition(".")
        try:
            parameter = inspect.signature(getattr(importlib.import_module(module), name)).parameters.get("save_dir")
        except (ImportError, AttributeError, TypeError, ValueError):
            continue  # jsonargparse names the class it cannot import
        if parameter is not None and parameter.default is inspect.Parameter.empty:
            logger.init_args.save_dir = str(root)
            lines.append(f"trainer.logger: {name} save_dir not set, using trainer.default_root_dir: {root}")
    return lines


def route_optimizer_args(config: Namespace) -> list[str]:
    """Move LightningCLI's own ``--optimizer`` / ``--lr_scheduler`` into ``model.optimizer`` / ``model.scheduler``.

    LightningCLI would otherwise replace ``PrunedDPO.configure_optimizers`` with its own: an optimizer over every
    parameter (the frozen reference's too), no ``model.scheduler`` (the warm-up and cosine dropped), nothing recorded
    for a resume. Through the model's arguments the one ``configure_optimizers`` applies to both spellings: a given
    ``--optimizer`` keeps the config's ``model.scheduler``, a given ``--lr_scheduler`` replaces it (stepped every
    optimizer step, as ``model.scheduler`` is). Returns one line per argument moved.

    Raises:
        ValueError: ``--lr_scheduler`` ``ReduceLROnPlateau``, which needs a monitored metric per epoch.
    """
    lines = []
    model = config.get("model")
    for cli_key, model_key in (("optimizer", "optimizer"), ("lr_scheduler", "scheduler")):
        given = config.get(cli_key)
        if not given or model is None:
            continue
        name = given.get("class_path", "?") if isinstance(given, Namespace) else str(given)
        if cli_key == "lr_scheduler" and name.endswith("ReduceLROnPlateau"):
            raise ValueError(f"--lr_scheduler {name}: PrunedDPO steps its scheduler every optimizer step without a "
                             "monitored metric; give a step-based scheduler as --model.scheduler")
        kept = "" if cli_key == "lr_scheduler" or not model.get("scheduler") else (
            f", so model.scheduler ({model.scheduler.get('class_path', '?')}) still applies")
        model[model_key], config[cli_key] = given, None
        lines.append(f"--{cli_key} {name}: used as --model.{model_key}{kept} (PrunedDPO.configure_optimizers builds "
                     "both; spell it --model." + model_key + " to say so)")
    return lines


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

    from lit_prunedpo.checkpointing import SaveRunConfig
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
    """The ``lit-prunedpo`` console command: :func:`main` on ``sys.argv``, an error of the package's own checks
    printed as one line (``lit_prunedpo.user_errors``)."""
    from lit_prunedpo.user_errors import run_command

    run_command(main)


if __name__ == "__main__":
    command()
