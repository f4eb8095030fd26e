"""Your own model in the benchmark: ``--model NAME_OR_PATH`` loaded by :class:`~lit_prunedpo.models.Pretrained`, and
what a report records of the model it measured.

``--model`` takes what training's ``model.policy`` takes: a hub name, a local ``save_pretrained`` folder or a local
``.gguf`` file; :func:`pretrained_source` only checks that a path given as a path exists, and loads nothing itself.
Its parameters are in ``--dtype`` (float32 by default, as for the presets: a checkpoint's own dtype is not kept
unless named), for the policy, its frozen reference and the TRL peer alike.

What ``bench.json`` keeps under ``model``: for a preset (:func:`preset_identity`), its random model's type, sizes and
seed; for ``--model`` (:func:`model_identity`), the name or path, the file's SHA-256 (a ``.gguf`` or other single
file), the revision asked for (a hub name), the model's class, type, sizes and parameter dtype, and a SHA-256 of the
loaded weights (every state-dict tensor's name, dtype, shape and bytes, as measured): a published figure names the
weights it measured, whatever file they came from.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_prunedpo.models import ModelSource, Pretrained

BLOCK = 1 << 20
#: Config fields a report shows (those a model has).
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "max_position_embeddings", "tie_word_embeddings")


def written_as_path(name_or_path: str) -> bool:
    """Whether ``name_or_path`` reads as a local path, not a hub name (``org/name`` has a slash too)."""
    return name_or_path.startswith(("/", "./", "../", "~")) or name_or_path.endswith(".gguf")


def pretrained_source(name_or_path: str, dtype: str | None = None) -> Pretrained:
    """The :class:`~lit_prunedpo.models.Pretrained` source of ``--model``, parameters in ``dtype`` (float32 when
    ``None``).

    Raises:
        FileNotFoundError: ``name_or_path`` is written as a path (or ends in ``.gguf``) and does not exist.
    """
    if not name_or_path.strip():
        raise ValueError("--model is empty: give a hub name, a save_pretrained folder or a .gguf file")
    local = Path(name_or_path).expanduser()
    if written_as_path(name_or_path) and not local.exists():
        raise FileNotFoundError(f"--model {name_or_path}: no such file or folder (give a hub name, a save_pretrained "
                                "folder or a .gguf file)")
    return Pretrained(name_or_path, dtype=dtype or "float32")


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes, what ``sha256sum`` prints."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def weights_sha256(model: nn.Module) -> str:
    """SHA-256 (hex) of every state-dict tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def model_shape(model: nn.Module) -> dict[str, Any]:
    """The model's class, ``model_type``, parameter count and dtype, and the config's sizes it has."""
    config = model.config
    params = list(model.parameters())  # tied parameters are listed once
    shape = {"class": type(model).__name__, "model_type": getattr(config, "model_type", None),
             "parameters": sum(p.numel() for p in params), "dtype": str(params[0].dtype).removeprefix("torch.")}
    shape.update({k: getattr(config, k) for k in SHAPE_FIELDS if isinstance(getattr(config, k, None), (int, bool))})
    return shape


def preset_identity(preset: str, seed: int, policy: nn.Module) -> dict[str, Any]:
    """What a report records of a preset's random model: the preset, the seed of its weights, its shape."""
    return {"kind": "preset", "preset": preset, "seed": seed, "weights": "random", **model_shape(policy)}


def model_identity(source: ModelSource, policy: nn.Module) -> dict[str, Any]:
    """What a report records of ``--model`` (see the module docstring); ``policy`` as built, before any step."""
    if not isinstance(source, Pretrained):
        return {"kind": type(source).__name__, **model_shape(policy), "weights_sha256": weights_sha256(policy)}
    local = Path(source.name_or_path).expanduser()
    identity: dict[str, Any] = {"name_or_path": source.name_or_path}
    if local.is_file():
        identity.update(kind="gguf" if local.suffix == ".gguf" else "file", file_sha256=file_sha256(local))
    elif local.is_dir():
        identity.update(kind="folder", path=str(local.resolve()))
    else:
        identity.update(kind="hub", revision=source.revision)
    return {**identity, **model_shape(policy), "weights_sha256": weights_sha256(policy)}


def model_label(identity: dict[str, Any] | None) -> str | None:
    """A short name of a ``--model`` identity for report titles (its file or folder name, or its hub name)."""
    if not identity or identity.get("kind") == "preset":
        return None
    name = str(identity.get("name_or_path", identity.get("kind")))
    return Path(name).name if identity.get("kind") in ("gguf", "file", "folder") else name
