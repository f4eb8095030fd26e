"""Checkpoints and run outputs that are never torn or shared: how checkpoints are written and read, how a
checkpoint is checked without loading it, which folders and files each run claims, and how a run resumes.

* :mod:`~lit_prunedpo.checkpoint.io`: atomic checkpoint writes (:class:`AtomicCheckpointIO`, and a folder of
  shards replaced in one rename) and loads whose errors name the file (:class:`VerifiedCheckpointIO`);
* :mod:`~lit_prunedpo.checkpoint.checks`: :func:`checkpoint_problem`, why a file or a folder of shards is not a
  readable checkpoint;
* :mod:`~lit_prunedpo.checkpoint.claims`: a log version (or, without a logger, a checkpoint folder and config
  file) per run, so two runs never write into one;
* :mod:`~lit_prunedpo.checkpoint.locks`: one run at a time in a fixed checkpoint folder;
* :mod:`~lit_prunedpo.checkpoint.resume`: :func:`resolve_resume`, ``ckpt_path="last"`` as the newest readable
  checkpoint of the previous runs (the search's answer is a :class:`ResumeSearch`);
* :mod:`~lit_prunedpo.checkpoint.run_folder`: :func:`continue_run_folder`, a resume logging into the run folder of
  its checkpoint (one ``version_N``, one ``metrics.csv``).

:class:`~lit_prunedpo.cli.PrunedDPOCLI` applies all of them. With a plain ``Trainer``, ``PrunedDPO`` puts
:class:`AtomicCheckpointIO` in place itself when it saves (a ``CheckpointIO`` you chose is kept) and
:class:`~lit_prunedpo.distributed.FSDP2Strategy` writes its folders of shards atomically; call the functions
yourself for the rest.
"""

from lit_prunedpo.checkpoint.checks import DCP_METADATA, LIGHTNING_METADATA, checkpoint_problem
from lit_prunedpo.checkpoint.claims import (
    DEFAULT_CHECKPOINT_FOLDER,
    RANK_VARIABLES,
    SaveRunConfig,
    claim_checkpoint_folder,
    claim_log_version,
    launched_as_rank_zero,
    release_empty_claims,
    run_checkpoint_dir,
)
from lit_prunedpo.checkpoint.io import (
    AtomicCheckpointIO,
    VerifiedCheckpointIO,
    install_atomic_io,
    replace_folder,
    sharded_save_names,
)
from lit_prunedpo.checkpoint.locks import LOCK_NAME, lock_checkpoint_dirs
from lit_prunedpo.checkpoint.resume import ResumeSearch, find_checkpoints, resolve_resume
from lit_prunedpo.checkpoint.run_folder import continue_run_folder

__all__ = [
    "DCP_METADATA",
    "DEFAULT_CHECKPOINT_FOLDER",
    "LIGHTNING_METADATA",
    "LOCK_NAME",
    "RANK_VARIABLES",
    "AtomicCheckpointIO",
    "ResumeSearch",
    "SaveRunConfig",
    "VerifiedCheckpointIO",
    "checkpoint_problem",
    "claim_checkpoint_folder",
    "claim_log_version",
    "continue_run_folder",
    "find_checkpoints",
    "install_atomic_io",
    "launched_as_rank_zero",
    "lock_checkpoint_dirs",
    "release_empty_claims",
    "replace_folder",
    "resolve_resume",
    "run_checkpoint_dir",
    "sharded_save_names",
]
