"""Whether a checkpoint can be read, without loading it: :func:`checkpoint_problem` says why a file or a folder
of shards is not a readable checkpoint (an archive cut short, a folder of shards missing a file or holding a
shard shorter than its index records). A resume uses it to skip torn checkpoints and name them.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

#: Files a complete sharded checkpoint folder holds, written last (``torch.distributed.checkpoint``'s index,
#: then Lightning's non-tensor state).
DCP_METADATA, LIGHTNING_METADATA = ".metadata", "meta.pt"


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a readable checkpoint (``None`` when it is): a truncated or corrupt archive, or a
    torn folder of shards.

    A file: checks the zip archive ``torch.save`` writes (its directory and every member's CRC) without
    unpickling it. A folder (a distributed checkpoint): checks that both files written last by a complete save
    are there, ``torch.distributed.checkpoint``'s ``.metadata`` and Lightning's ``meta.pt`` (itself an archive),
    and that every storage file the ``.metadata`` names is there and holds the bytes it records (a lost shard
    would otherwise fail only when loading, or load part of the state). A non-empty folder with neither of them
    and no ``.distcp`` shard is another format, accepted as is.
    """
    path = Path(path)
    if path.is_dir():
        names = [p.name for p in path.iterdir()]
        if names and not any(n in (DCP_METADATA, LIGHTNING_METADATA) or n.endswith(".distcp") for n in names):
            return None
        missing = [name for name in (DCP_METADATA, LIGHTNING_METADATA) if not (path / name).is_file()]
        if missing:
            return (f"a folder of shards without {' and '.join(missing)}: torn, its save was interrupted "
                    "(or it is not a distributed checkpoint)")
        problem = checkpoint_problem(path / LIGHTNING_METADATA)
        return f"{LIGHTNING_METADATA}: {problem}" if problem is not None else _shards_problem(path)
    try:
        size = path.stat().st_size
        if size == 0:
            return "the file is empty"
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            return f"member {bad} fails its CRC check"
    except zipfile.BadZipFile as err:
        return f"not a complete checkpoint archive ({err}; {size} bytes: truncated, e.g. by a full disk?)"
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None


def _shards_problem(folder: Path) -> str | None:
    """Why the storage files ``folder/.metadata`` names are not all there and whole (``None`` when they are).

    ``.metadata`` is ``torch.distributed.checkpoint``'s pickled ``Metadata`` (what its ``FileSystemReader`` reads):
    ``storage_data`` maps every saved item to a relative file name, an offset and a length.
    """
    try:
        with open(folder / DCP_METADATA, "rb") as f:
            metadata = pickle.load(f)
    except Exception as err:  # a torn or foreign index: whatever unpickling raised
        return f"{DCP_METADATA} cannot be read ({type(err).__name__}: {err})"
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        return f"{DCP_METADATA} names no storage files (not torch.distributed.checkpoint metadata)"
    needed: dict[str, int] = {}
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if name is not None:
            needed[name] = max(needed.get(name, 0), int(info.offset) + int(info.length))
    missing = sorted(name for name in needed if not (folder / name).is_file())
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return f"{len(missing)} of the {len(needed)} shard files its {DCP_METADATA} names are missing: {shown}"
    short = sorted(name for name, end in needed.items() if (folder / name).stat().st_size < end)
    if short:
        return f"shard file {short[0]} is shorter than its {DCP_METADATA} records (truncated)"
    return None
