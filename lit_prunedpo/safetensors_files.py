"""A model's safetensors file that cannot be read, named: what ``from_pretrained`` does not say.

A download or ``save_pretrained`` that was interrupted leaves ``model.safetensors`` (or one shard of several) cut
short; ``transformers`` then fails with safetensors' own "Error while deserializing header: incomplete metadata, file
not fully covered", naming neither the file nor the folder. :func:`broken_safetensors` opens each safetensors file
of the model's folder (or of its hub cache snapshots) and names the ones that do not open, with what to do.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["broken_safetensors", "unreadable_safetensors"]


def unreadable_safetensors(folder: Path) -> list[Path]:
    """The ``*.safetensors`` files under ``folder`` (not in subfolders) that safetensors cannot open: cut short,
    corrupt, or no safetensors file at all. Only each file's header is read."""
    from safetensors import safe_open

    bad = []
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception:  # SafetensorError for a cut header or data, OSError for an unreadable file
            bad.append(file)
    return bad


def _hub_snapshots(name: str) -> list[Path]:
    """The hub cache's snapshot folders of the model ``name`` (none when the cache does not hold it)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    snapshots = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model") / "snapshots"
    return sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []


def broken_safetensors(source: str, local: bool, err: BaseException) -> ValueError:
    """The one-line error for a model whose safetensors weights ``from_pretrained`` could not read (``err``): the
    files that do not open named, and that they are incomplete or corrupt.

    Args:
        source: the model's local folder, or its hub name.
        local: whether ``source`` is a local folder.
        err: safetensors' error (its first line is kept).
    """
    folders = [Path(source)] if local else _hub_snapshots(source)
    bad = [str(file) for folder in folders for file in unreadable_safetensors(folder)]
    reason = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
    fix = ("save the model again with save_pretrained, or copy or download it again" if local else
           "download it again (from_pretrained(..., force_download=True), or delete it from the hub cache)")
    if bad:
        listed = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        what = "is" if len(bad) == 1 else "are"
        return ValueError(f"model file{'s' if len(bad) > 1 else ''} {listed} {what} incomplete or corrupt "
                          f"({reason}): {fix}")
    where = f"folder {source}" if local else f"hub model {source!r}"
    return ValueError(f"a safetensors weight file of the model {where} is incomplete or corrupt ({reason}): {fix}")
