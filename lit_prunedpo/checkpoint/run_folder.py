"""A resumed run goes on in the folder of the run it resumes: :func:`continue_run_folder`.

Lightning gives every run a new ``version_N``, so a run and its resume split their metrics over two folders (and
two ``metrics.csv``). Here a ``fit`` that resumes from a checkpoint inside a run folder of its logger
(``<save_dir>/<name>/<version>/checkpoints/``, where the checkpoints go by default) logs into that folder instead:
the version :func:`~lit_prunedpo.checkpoint.claims.claim_log_version` claimed for it is given back, the CSV logger
appends to the run's ``metrics.csv`` (Lightning's writer would delete it: it is kept and written on), dropping the
earlier run's rows from the first step the resumed run logs on (logged after the checkpoint; the resumed run logs
those steps again), and the run's config is saved beside the first one's (``config-1.yaml``, ...). A checkpoint
anywhere else (a fixed ``dirpath``, a copied file) keeps Lightning's new version; a logged line says which folder
the metrics go to either way.
"""

from __future__ import annotations

import csv
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info

from lit_prunedpo.checkpoint.claims import (
    DEFAULT_CHECKPOINT_FOLDER, SaveRunConfig, claim_file, ignore_warning, launched_as_rank_zero, release_empty_claims,
)
from lit_prunedpo.checkpoint.io import is_local
from lit_prunedpo.checkpoint.locks import take_lock

if TYPE_CHECKING:
    import lightning.pytorch as pl

METRICS_FILE = "metrics.csv"


def continue_run_folder(trainer: "pl.Trainer", ckpt_path: str | None, claimed: list[Path]) -> list[Path]:
    """Point the trainer's versioned loggers (CSV, TensorBoard) at the run folder ``ckpt_path`` lies in, in place
    of the versions claimed for this run (``claimed``, from ``claim_log_version``); returns the claims left.

    A logger whose version the user chose is left alone. Runs on the first process only (the others write no logs,
    and Lightning gives them rank 0's checkpoint folder). The run's checkpoint folder is locked for this process
    (``lock_checkpoint_dirs``'s lock): a second resume of the same run at the same time is refused.
    """
    # "best", "hpc" and the like are Lightning's to find: only a checkpoint on this disk names a folder
    if not ckpt_path or not launched_as_rank_zero() or not is_local(ckpt_path) or not os.path.exists(ckpt_path):
        return claimed
    checkpoint = Path(os.path.abspath(ckpt_path))
    run = checkpoint.parent.parent if checkpoint.parent.name == DEFAULT_CHECKPOINT_FOLDER else None
    left = list(claimed)
    for logger in trainer.loggers:
        version = getattr(logger, "_version", None)
        if not hasattr(logger, "_get_next_version") or version is None:
            continue
        root = Path(os.path.abspath(logger.root_dir))
        new = root / (version if isinstance(version, str) else f"version_{version}")
        if new not in claimed:
            continue  # the user's own version: theirs to choose
        if run is None or run.parent != root:
            rank_zero_info(f"resume: {ckpt_path} lies in no run folder of {type(logger).__name__} ({root}/<version>/"
                           f"{DEFAULT_CHECKPOINT_FOLDER}/): this run's metrics go to {new}, a new version")
            continue
        match = re.fullmatch(r"version_(\d+)", run.name)
        logger._version = int(match.group(1)) if match else run.name  # read lazily: nothing has asked for it yet
        left.remove(new)
        release_empty_claims([new])
        _continue_in(trainer, logger, checkpoint, run)
    return left


def _continue_in(trainer: "pl.Trainer", logger: Any, checkpoint: Path, run: Path) -> None:
    """Lock ``run``'s checkpoint folder, keep its ``metrics.csv`` for ``logger`` (a CSV logger) and claim a config
    name there; say so in one line."""
    checkpoints = run / DEFAULT_CHECKPOINT_FOLDER
    take_lock(checkpoints)
    # ModelCheckpoint warns at set-up that the folder "exists and is not empty": it holds the run this one goes on
    ignore_warning(rf"Checkpoint directory {re.escape(str(checkpoints))} exists and is not empty")
    said = ""
    if isinstance(logger, CSVLogger):
        said = _keep_metrics(logger)
    config = _claim_config(trainer, logger)
    if config:
        said += f"; its config is {config}"
    rank_zero_info(f"resume: this run logs into {logger.log_dir}, the run folder of {checkpoint}{said}")


def _keep_metrics(logger: Any) -> str:
    """Open ``logger``'s writer on the run's ``metrics.csv`` without losing it (Lightning's writer deletes a
    metrics file it finds); what was done, for the logged line."""
    path = Path(logger.log_dir) / METRICS_FILE
    if not path.is_file():
        _writer(logger)
        return ""
    aside = path.with_name(f".{METRICS_FILE}.resumed")
    os.replace(path, aside)  # out of the writer's way; a crash here leaves the rows in the hidden file
    try:
        writer = _writer(logger)
    finally:
        os.replace(aside, path)
    with open(path, newline="") as f:
        header, rows = _read(f)
    writer.metrics_keys = header  # the header of the file it appends to; a new key rewrites it whole, rows kept
    log_metrics = writer.log_metrics

    def first_row(metrics: dict[str, Any], step: int | None = None) -> None:
        # the first step this run logs says where the earlier run's rows end: any from this step on were logged
        # after its checkpoint (whatever the step counts: Lightning's rows, TRL's), and this run logs them again
        del writer.log_metrics
        if step is not None:
            _drop_rows_from(path, step)
        log_metrics(metrics, step)

    writer.log_metrics = first_row  # an instance attribute, for the first row alone
    return f"; it appends to {path} ({len(rows)} rows of the earlier run)"


def _read(f: Any) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(f)
    return list(reader.fieldnames or []), list(reader)


def _drop_rows_from(path: Path, step: int) -> None:
    """Remove from ``path`` the rows whose ``step`` is ``step`` or later, saying how many."""
    with open(path, newline="") as f:
        header, rows = _read(f)
    kept = [row for row in rows if not row.get("step") or float(row["step"]) < step]
    if len(kept) < len(rows):
        _rewrite(path, header, kept)
        rank_zero_info(f"resume: dropped {len(rows) - len(kept)} rows of {path} from step {step} on, logged after "
                       "the checkpoint: this run logs those steps again")


def _writer(logger: Any) -> Any:
    """The logger's metrics writer, made now, without the warning that its folder's earlier files will be deleted
    (the run's own, kept here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
        return logger.experiment


def _rewrite(path: Path, header: list[str], rows: list[dict[str, str]]) -> None:
    """Replace ``path`` with ``header`` and ``rows``, whole (a temporary beside it renamed over it)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(temporary, path)


def _claim_config(trainer: "pl.Trainer", logger: Any) -> Path | None:
    """Give the CLI's config callback a file name of its own in the run folder (``config-1.yaml``, ...): the
    first run's ``config.yaml`` is there, and the resumed run's arguments may differ. Only for the first logger,
    whose folder the config goes to."""
    config = next((cb for cb in trainer.callbacks if isinstance(cb, SaveRunConfig) and cb.save_to_log_dir
                   and not cb.already_saved), None)
    if config is None or not trainer.loggers or trainer.loggers[0] is not logger:
        return None
    folder = Path(logger.log_dir)
    if not (folder / config.config_filename).exists():
        return None
    config.config_filename, config.claimed = claim_file(folder, Path(config.config_filename)), True
    return folder / config.config_filename
