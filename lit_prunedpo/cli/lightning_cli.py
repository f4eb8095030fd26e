"""``PrunedDPOCLI``: the LightningCLI subclass behind the ``lit-prunedpo`` Trainer subcommands (``fit``, ``validate``,
``test``).

It imports lightning (and torch) at its top, so :mod:`lit_prunedpo.cli` imports it only when a Trainer subcommand
runs (:func:`lit_prunedpo.cli.cli_class`): the command's help, ``export`` and ``configs`` start without it. What it
changes in LightningCLI:

* parsing: a chosen logger without a ``save_dir`` gets the trainer's folder (:func:`fill_logger_save_dirs`), the
  model's ``vocab_size`` comes from the data, a pretrained model's own tokenizer must be the data's
  (:mod:`lit_prunedpo.model_tokenizer`), and LightningCLI's own ``--optimizer`` / ``--lr_scheduler`` become the
  model's (:func:`route_optimizer_args`);
* the trainer: Lightning's default logger, progress bar, model summary and checkpoint callback are replaced by the
  package's (:func:`replace_default_callbacks`), its checkpoint files are written atomically, and every run claims
  a log version and checkpoint folder of its own (``lit_prunedpo.checkpoint``), but a resume, which goes on in the
  run folder of its checkpoint;
* the commands: no ``predict`` (``PrunedDPO`` has no predict step); ``export`` and ``configs`` listed in ``--help``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, RichModelSummary, RichProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info

from lit_prunedpo import callbacks
from lit_prunedpo.callbacks.final_checkpoint import FinalCheckpoint
from lit_prunedpo.callbacks.last_checkpoint import LastCheckpointAtValidation
from lit_prunedpo.callbacks.model_summary import RichSummaryWithoutZeroFlops, SummaryWithoutZeroFlops
from lit_prunedpo.callbacks.progress_bar import StepProgressBar
from lit_prunedpo.checkpoint import (
    checkpoint_problem, claim_checkpoint_folder, claim_log_version, continue_run_folder, install_atomic_io,
    lock_checkpoint_dirs, release_empty_claims, resolve_resume,
)
from lit_prunedpo.cli.top_level import add_own_commands
from lit_prunedpo.cli.packaged_configs import overlay_error
from lit_prunedpo.model_tokenizer import check_model_tokenizer
from lit_prunedpo.models import fill_vocab_size

# every callback of the package imported (lit_prunedpo.callbacks imports each on first use): jsonargparse lists a base
# class's subclasses in --help, and takes a class by its short name (--trainer.callbacks+=PruneEarly), only among the
# classes imported
for _name in callbacks.__all__:
    getattr(callbacks, _name)


class PrunedDPOCLI(LightningCLI):
    """LightningCLI whose checkpoint errors name the checkpoint, whose checkpoint files are written atomically,
    whose runs each get a log version (without a logger: a checkpoint folder) of their own, and whose
    ``ckpt_path=last`` resumes from the newest readable checkpoint of the previous runs
    (``lit_prunedpo.checkpoint``)."""

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads --ckpt_path itself (for saved hyperparameters) before any strategy sees it; a corrupt
        # file would otherwise fail with a bare unpickling error that does not say which file, and a file that is
        # no checkpoint with torch's advice to load it with weights_only=False.
        path = self.config[self.config.subcommand].get("ckpt_path") if self.config.get("subcommand") else None
        problem = not_a_checkpoint(path) if path and Path(path).is_file() else None
        if problem is not None:
            raise RuntimeError(f"could not read checkpoint {path}: not a lit_prunedpo checkpoint ({problem}); give "
                               "a checkpoint a fit wrote (its checkpoints/last.ckpt), or --ckpt_path last")
        try:
            super()._parse_ckpt_path()
        except Exception as err:
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
            parser.error(overlay_error(list(sys.argv[1:] if args is None else args), str(err)) or str(err), err)
        self.config = config

    def before_instantiate_classes(self) -> None:
        # FromConfig without vocab_size takes the data's (len(tokenizer)): nobody should copy it by hand
        config = self.config[self.subcommand] if self.subcommand else self.config
        said = fill_vocab_size(config.get("model", {}).get("policy"), config.get("data"))
        # a Pretrained policy's own tokenizer must be the data's: else it trains on ids it reads as other tokens
        check_model_tokenizer(config.get("model", {}).get("policy"), config.get("data"))
        if said is not None:
            rank_zero_info(said)
        for line in route_optimizer_args(config):
            rank_zero_info(line)

    # Outputs of one run are never torn or shared with another's (lit_prunedpo.checkpoint). The log version is
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
        replace_default_callbacks(trainer, given)
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
            # a run that failed before its first step (bad data, a stale cache, a refused resume) leaves no version_N
            trainer = getattr(self, "trainer", None)
            release_empty_claims(self._claimed, trained=getattr(trainer, "global_step", 0) > 0)
            raise

    def before_fit(self) -> None:
        self._claimed = claim_log_version(self.trainer)
        lock_checkpoint_dirs(self.trainer)  # the folders the user named; before the claim names the others
        claim_checkpoint_folder(self.trainer)
        config = self.config_init["fit"]
        config["ckpt_path"] = resolve_resume(self.trainer, config.get("ckpt_path"))
        # a resume logs into the run folder of its checkpoint, not the version just claimed (logged)
        self._claimed = continue_run_folder(self.trainer, config["ckpt_path"], self._claimed)

    def before_validate(self) -> None:
        self._claimed = claim_log_version(self.trainer)

    def before_test(self) -> None:
        self._claimed = claim_log_version(self.trainer)


def replace_default_callbacks(trainer: Trainer, given: set[int]) -> None:
    """Replace, in ``trainer.callbacks``, the callbacks Lightning adds by default (those whose ``id`` is not in
    ``given``, the config's own) with the package's, and put ``FinalCheckpoint`` last.

    Lightning's defaults, where the config names none of its own: a bar that shows "Epoch 0/-2", "v_num" and cut-off
    names; a summary with a FLOPs column of zeros (nothing gives it an example input); a checkpoint per validation
    beside FinalCheckpoint's last.ckpt, the same weights twice at the end. The ModelCheckpoint keeps saving at each
    validation, into last.ckpt, which FinalCheckpoint then rewrites or finds current.
    """
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
            trainer.callbacks[i] = LastCheckpointAtValidation(dirpath=callback.dirpath, save_top_k=0, save_last=True)
    # FinalCheckpoint's summary is printed at teardown: after the progress bar's, which takes the bar off the screen
    finals = [c for c in trainer.callbacks if isinstance(c, FinalCheckpoint)]
    trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, FinalCheckpoint)] + finals


def not_a_checkpoint(path: str | os.PathLike) -> str | None:
    """Why the file ``path`` is not a Lightning checkpoint (``None``: it is one): what torch could not read in it
    (the archive checked by :func:`~lit_prunedpo.checkpoint.checkpoint_problem` when it cannot be read), or what
    it holds instead of a ``state_dict``. The load maps the file, so a checkpoint is not read twice."""
    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - any failure to read the file is the answer
        if "Weights only load failed" in str(err):
            return "it holds Python objects other than tensors and plain values, which a checkpoint does not"
        return checkpoint_problem(path) or f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
    if isinstance(loaded, dict) and "state_dict" in loaded:
        return None
    keys = f" with the keys {', '.join(map(str, list(loaded)[:5]))}" if isinstance(loaded, dict) else ""
    return f"it holds a {type(loaded).__name__}{keys}, without the state_dict of a Lightning checkpoint"


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
