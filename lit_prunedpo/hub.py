"""Say at once when a hub name cannot be loaded because the Hugging Face Hub is out of reach.

``transformers`` and ``datasets`` retry a hub they cannot reach before they fail: 54 s for a tokenizer, 25 s for a
dataset on a machine without a route to it, ending in a message about the internet connection. Before a name that
is not a local path is loaded, :func:`hub_or_cache` sends one request to the hub's endpoint (``HF_ENDPOINT``, a
timeout of :data:`PROBE_TIMEOUT_S`): when nothing answers and the local cache does not hold the name, it fails in
one line naming the name, the argument and what to do; when the cache holds it, it is read from there.

A name that can only be a local path (:func:`written_as_path`: absolute, ``./``, ``~``, more than one ``/``) is never
a hub name, so a folder of that name that is gone (moved or deleted) is to be reported as such, not handed to the hub
client, whose "Repo id must be in the form 'repo_name' or 'namespace/repo_name'" says nothing about the folder.

Under ``HF_HUB_OFFLINE=1`` nothing is probed: the libraries read their caches, and :func:`offline_hint` explains
their failure when the cache lacks the name. The model loaders (``lit_prunedpo.models``) can use the same two calls.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from huggingface_hub import constants
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import get_session
from lightning.pytorch.utilities import rank_zero_info

#: Seconds the probe waits for the hub's answer: a reachable hub answers well within it.
PROBE_TIMEOUT_S = 3.0


def written_as_path(name: str) -> bool:
    """Whether ``name`` can only be a local path, never a hub name: absolute, starting with ``.`` or ``~``, holding
    this system's separator where that is not ``/``, or more than one ``/``. A hub name is ``name`` or
    ``owner/name``, each part starting with a letter, digit or ``_``, so it is none of these."""
    return (name.startswith((".", "~")) or os.path.isabs(name) or (os.sep != "/" and os.sep in name)
            or name.count("/") > 1)


class HubUnreachable(ConnectionError):
    """A hub name was given, the hub does not answer and the local cache does not hold the name."""


def offline_mode() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as ``huggingface_hub`` read it: what the loaders obey."""
    return constants.is_offline_mode()


def probe_hub(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the hub's endpoint answers (with any HTTP status), else why not (the error's type and text)."""
    try:
        # huggingface_hub's own client: the proxies, certificates and endpoint the loaders would use.
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as err:  # httpx2's ConnectError/TimeoutException, OSError: any failure means no answer
        return f"{type(err).__name__}: {err}"
    return None


def in_hub_cache(name: str, repo_type: str = "model") -> bool:
    """Whether ``huggingface_hub``'s cache (``HF_HUB_CACHE``) holds files of the repository ``name``."""
    folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type=repo_type)
    return (folder / "snapshots").is_dir()


def hub_or_cache(name: str, argument: str, cached: Callable[[], bool]) -> bool:
    """Check that the hub name ``name`` can be loaded, before a loader spends a minute finding out.

    Args:
        name: the hub name (not a local path).
        argument: the option that gave it, for the message (e.g. ``data.init_args.tokenizer``).
        cached: whether the local cache holds ``name`` (asked only when the hub does not answer).

    Returns:
        True when ``name`` is to be read from the local cache only (``HF_HUB_OFFLINE=1``, or the hub does not answer
        and the cache holds it: said in a logged line), False when the hub answers.

    Raises:
        HubUnreachable: the hub does not answer and the cache does not hold ``name``.
    """
    if offline_mode():
        return True
    reason = probe_hub()
    if reason is None:
        return False
    if cached():
        rank_zero_info(f"the Hugging Face Hub ({constants.ENDPOINT}) does not answer ({reason}): {name!r} "
                       f"({argument}) is read from the local cache; set HF_HUB_OFFLINE=1 to skip the hub")
        return True
    raise HubUnreachable(
        f"{name!r} ({argument}) is not a local path, so it is a Hugging Face Hub name, but the hub "
        f"({constants.ENDPOINT}) does not answer ({reason}) and the local cache ({constants.HF_HUB_CACHE}) does not "
        "hold it: give a local path (a folder written by save_pretrained, or a data file), or set HF_HUB_OFFLINE=1 "
        "with a cache that holds it (filled on a machine that reaches the hub)"
    )


def offline_hint(name: str) -> str:
    """Why a hub name failed to load under ``HF_HUB_OFFLINE=1`` ("" when not offline), to append to the error."""
    if not offline_mode():
        return ""
    return (f"; HF_HUB_OFFLINE=1 is set, so {name!r} was looked up only in the local cache ({constants.HF_HUB_CACHE}), "
            "which does not hold it: give a local path, or load it once without HF_HUB_OFFLINE on a machine that "
            "reaches the hub")
