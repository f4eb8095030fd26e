"""Open one split of preference data from a local file, a ``save_to_disk`` directory or the hub.

Every local source goes through ``datasets`` so its rows live in Arrow cache files: that is what lets
``Dataset.map`` cache the tokenized result by fingerprint. ``datasets`` keys a local file's cache by its
path and modification time; a file edited in place with its time kept (``cp -p``, ``rsync -t``, ``tar``)
would be read from the stale cache. So a local file is parsed into a cache folder named by its content
digest (:func:`lit_prunedpo.fingerprint.content_digest`), after the line-by-line readability check of
:mod:`~lit_prunedpo.data.readable`.
"""

from __future__ import annotations

from pathlib import Path

import datasets
from datasets.naming import camelcase_to_snakecase

from lit_prunedpo.data.readable import readable_copy
from lit_prunedpo.fingerprint import content_digest
from lit_prunedpo.hub import hub_or_cache, in_hub_cache, offline_hint

#: Local file endings and the ``datasets`` builder that reads each (``.gz`` is decompressed by datasets).
FILE_BUILDERS: dict[str, str] = {
    ".json": "json",
    ".jsonl": "json",
    ".json.gz": "json",
    ".jsonl.gz": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}


def _builder_for(path: Path) -> str | None:
    name = path.name.lower()
    for ending, builder in FILE_BUILDERS.items():
        if name.endswith(ending):
            return builder
    return None


def _looks_local(path: str) -> bool:
    """A string that names a file rather than a hub dataset (hub names like ``org/name-2.5`` pass)."""
    return path.startswith(("/", "./", "../", "~")) or _builder_for(Path(path)) is not None


def is_single_split(path: str) -> bool:
    """True when ``path`` is one file or one saved ``Dataset``: a source with no split names."""
    local = Path(path).expanduser()
    if local.is_file():
        return True
    if local.is_dir():
        return not (local / "dataset_dict.json").exists()
    return False


def load_split(path: str, split: str, digest: str | None = None, on_bad_row: str = "error") -> datasets.Dataset:
    """Load one split of a preference dataset.

    Args:
        path: a local ``.json``/``.jsonl``/``.jsonl.gz``/``.parquet``/``.csv`` file, a directory written by
            ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``, or a hub dataset name.
        split: the split to read. A single file or a saved ``Dataset`` has no splits and is returned whole.
        digest: the content digest of a local file, when the caller has it already (else it is computed).
        on_bad_row: what an unreadable line of a JSON-lines file does
            (:func:`~lit_prunedpo.data.readable.readable_copy`).

    Raises:
        FileNotFoundError: ``path`` looks like a local path but does not exist, or the hub load failed.
        HubUnreachable: ``path`` is a hub name, the hub does not answer and the cache does not hold it
            (:mod:`lit_prunedpo.hub`).
        ValueError: the file ending is unknown, empty or unreadable (naming the line), or the split is not in a
            saved ``DatasetDict``.
    """
    local = Path(path).expanduser()
    if local.is_file():
        builder = _builder_for(local)
        if builder is None:
            raise ValueError(
                f"{path}: unknown file type; expected one of {sorted(FILE_BUILDERS)} or a save_to_disk directory"
            )
        digest = digest or content_digest(local)
        readable = readable_copy(local, on_bad_row, digest)
        cache_dir = Path(datasets.config.HF_DATASETS_CACHE) / "lit_prunedpo" / f"content-{digest}"
        try:
            return datasets.load_dataset(
                builder, data_files=str(readable.resolve()), split="train", cache_dir=str(cache_dir)
            )
        except Exception as err:  # datasets wraps Arrow/parse errors in many types; name the file once.
            raise ValueError(f"{path}: could not read it as {builder}: {err}") from err
    if local.is_dir():
        try:
            loaded = datasets.load_from_disk(str(local))
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"{path}: a directory, but not one written by Dataset.save_to_disk or DatasetDict.save_to_disk"
            ) from err
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"{path}: no split {split!r}; the splits are {sorted(loaded)}")
            return loaded[split]
        return loaded
    if _looks_local(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    # A hub that does not answer is said at once (HubUnreachable), not after datasets' retries.
    hub_or_cache(path, "data.init_args.path", cached=lambda: _dataset_in_cache(path))
    try:
        return datasets.load_dataset(path, split=split)
    except Exception as err:  # offline, unknown name, unknown split: all end here with the name in front.
        raise FileNotFoundError(
            f"{path}: no local file or directory has this path, and loading it as a hub dataset "
            f"(split {split!r}) failed: {err}{offline_hint(path)}"
        ) from err


def _dataset_in_cache(name: str) -> bool:
    """Whether a hub dataset's files (``HF_HUB_CACHE``) or its prepared Arrow tables (``HF_DATASETS_CACHE``, the
    folder ``datasets`` falls back to without the hub) are cached."""
    parts = name.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    return in_hub_cache(name, "dataset") or (Path(datasets.config.HF_DATASETS_CACHE) / "___".join(parts)).is_dir()
