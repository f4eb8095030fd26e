"""The trained policy in a training checkpoint: what is recorded of it, how the checkpoint is read, how the policy is
rebuilt.

``PrunedDPO.on_save_checkpoint`` records under ``"policy"`` what rebuilding needs besides the weights
(:func:`policy_metadata`): the model's ``transformers`` config, and for a LoRA policy the adapter config, the base
model's source and a digest of its weights (LoRA checkpoints hold the adapters only; the frozen base is rebuilt
from its source, and refused when its weights are not the ones trained on), with the base folder's absolute path,
so that a base recorded by a relative path is found from another working folder too (``"base_folder"``).

:func:`read_checkpoint` reads a single-file Lightning checkpoint or an FSDP2 folder of shards
(``torch.distributed.checkpoint``, read in one process without a process group: only the policy's tensors are
loaded, not the optimizer's); :func:`load_policy` builds the policy from it as a ``transformers`` model (a peft
model for LoRA), where ``base_model`` may replace a LoRA base folder that is gone since training (its weights still
checked against the digest). ``lit-prunedpo export`` (:mod:`lit_prunedpo.export`) writes what it loads.

torch, ``transformers`` and the package's modules that import them are imported where they are used: importing
this module (``lit-prunedpo export --help`` does) costs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = ["check_resumed_policy", "load_policy", "policy_metadata", "read_checkpoint"]

_POLICY_PREFIX = "policy."


def policy_metadata(policy: nn.Module, source: Any = None) -> dict[str, Any]:
    """What an export needs besides the weights: the ``transformers`` config, and for a peft policy its adapter
    config and the base model's source spec (``source``: the policy's ``ModelSource``)."""
    from lit_prunedpo.lora import is_peft_model

    if is_peft_model(policy):
        spec = source.base_spec() if hasattr(source, "base_spec") else None
        info = {"config": policy.get_base_model().config.to_dict(), "peft": policy.peft_config["default"].to_dict(),
                "base": spec, "base_digest": getattr(source, "base_digest", None), "base_folder": _folder_of(spec)}
    else:
        info = {"config": policy.config.to_dict(), "peft": None, "base": None, "base_digest": None}
    # plain JSON types only (peft's enums and sets would make torch.load(weights_only=True) refuse the checkpoint)
    return json.loads(json.dumps(info, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def _folder_of(spec: dict[str, Any] | None) -> str | None:
    """The absolute path of the folder (or GGUF file) a base's spec loads from, when it is one now (at training
    time): an export then knows a relative name for it, and finds it from another working folder."""
    from lit_prunedpo.lora import base_folder_name

    name = base_folder_name(spec)
    if name is None or not Path(name).expanduser().exists():
        return None
    return str(Path(name).expanduser().resolve())


def read_checkpoint(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The policy's tensors (``policy.`` prefix removed) and the rest of a checkpoint (hyperparameters, the
    ``"policy"`` metadata), from a ``.ckpt`` file or an FSDP2 folder of shards.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        ValueError: when it is not a readable Lightning checkpoint (not one at all, truncated, a folder without
            shards), or holds no policy weights or no ``"policy"`` metadata; the message names ``path``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.is_dir():
        meta, state = _read_sharded(path)
    else:
        meta = _load(path, path)
        if not isinstance(meta.get("state_dict"), dict):
            raise ValueError(f"cannot load checkpoint {path}: not a Lightning checkpoint (no 'state_dict' in it)")
        state = meta.pop("state_dict")
    policy = {k[len(_POLICY_PREFIX):]: v for k, v in state.items() if k.startswith(_POLICY_PREFIX)}
    if not policy:
        raise ValueError(f"checkpoint {path} holds no policy weights (no 'policy.*' keys in its state_dict)")
    if "policy" not in meta:
        raise ValueError(
            f"checkpoint {path} has no 'policy' metadata (written by PrunedDPO.on_save_checkpoint since the export "
            "command exists): cannot tell which model to build"
        )
    return policy, meta


def _unreadable(path: Path, err: BaseException) -> ValueError:
    # worded as lit_prunedpo.checkpoint.VerifiedCheckpointIO words a failed load; the cause's first line only, so
    # that this message stays the output's last line
    reason = (str(err).strip().splitlines() or [""])[0]
    return ValueError(f"cannot load checkpoint {path}: not a readable Lightning checkpoint (truncated or corrupt?): "
                      f"{type(err).__name__}: {reason}")


def _load(file: Path, path: Path) -> dict[str, Any]:
    """``torch.load`` of a checkpoint's pickle, any failure (not a pickle, cut short, not a dict) naming ``path``."""
    import torch

    try:
        loaded = torch.load(file, map_location="cpu", weights_only=False)
    except Exception as err:
        raise _unreadable(path, err) from err
    if not isinstance(loaded, dict):
        raise ValueError(f"cannot load checkpoint {path}: not a Lightning checkpoint (it holds a "
                         f"{type(loaded).__name__}, not a dict)")
    return loaded


def _read_sharded(path: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta_file = path / "meta.pt"
    if not meta_file.is_file():
        raise ValueError(f"cannot load checkpoint {path}: not a sharded Lightning checkpoint (a folder without "
                         "meta.pt)")
    meta = _load(meta_file, path)
    try:
        reader = dcp.FileSystemReader(str(path))
        prefix = "state_dict." + _POLICY_PREFIX
        state = {
            k[len("state_dict."):]: torch.empty(m.size, dtype=m.properties.dtype)
            for k, m in reader.read_metadata().state_dict_metadata.items()
            if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)
        }
        wrapped = {"state_dict": state}
        dcp.load(wrapped, storage_reader=reader, no_dist=True)  # fills the tensors in place: policy only
    except Exception as err:  # no .metadata file, a shard missing or cut short
        raise _unreadable(path, err) from err
    return meta, wrapped["state_dict"]


def load_policy(path: str | Path, base_model: str | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """The trained policy of a checkpoint as a ``transformers`` model (a peft model for LoRA), in eval mode,
    and the checkpoint's other contents.

    Args:
        path: the checkpoint.
        base_model: LoRA checkpoints only: a folder (or hub name) that replaces the base model the checkpoint
            names (moved or deleted since); its weights must still be the ones the adapters were trained on.

    Raises:
        FileNotFoundError: the LoRA base folder the checkpoint names does not exist (and no ``base_model``), or
            ``base_model`` is written as a path that does not exist.
        ValueError: ``base_model`` for a checkpoint without LoRA adapters; a base whose weights are not the ones
            trained on (see :func:`lit_prunedpo.lora.check_base`).
    """
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING

    state, meta = read_checkpoint(path)
    info = meta["policy"]
    if info["peft"] is None and base_model is not None:
        raise ValueError(f"--base_model {base_model}: checkpoint {path} is no LoRA run (it holds the full weights, "
                         "no base model is loaded): leave --base_model out")
    if info["peft"] is None:
        config_dict = dict(info["config"])
        config = CONFIG_MAPPING[config_dict.pop("model_type")].from_dict(config_dict)
        model = AutoModelForCausalLM.from_config(config)
        dtype = next((t.dtype for t in state.values() if t.is_floating_point()), None)
        if dtype is not None:
            model.to(dtype)
        model.load_state_dict(state, strict=True)
        return model.eval(), meta
    from lit_prunedpo.lora import load_adapter_state
    from lit_prunedpo.models import source_from_spec

    spec = _base_spec(info, base_model, path)
    # the digest check's messages name the base actually loaded
    model = load_adapter_state(source_from_spec(spec).build(), info["peft"], state, where=f"checkpoint {path}",
                               policy_info={**info, "base": spec})
    return model.eval(), meta


def _base_spec(info: dict[str, Any], base_model: str | None, path: str | Path) -> dict[str, Any]:
    """The spec to build a LoRA checkpoint's base from: ``base_model`` when given, else the recorded one (a relative
    folder name that does not resolve from here taken from its recorded absolute path).

    Raises:
        FileNotFoundError: the recorded folder is gone, or ``base_model`` is written as a path that does not exist.
        ValueError: no recorded spec and no ``base_model``.
    """
    from lit_prunedpo.lora import base_folder_name, check_base_folder

    spec = info.get("base")
    if base_model is not None:
        return _replace_base(spec, base_model)
    if spec is None:
        raise ValueError(f"checkpoint {path} is a LoRA run whose base model source cannot be rebuilt (no spec): pass "
                         "--base_model <folder of the base model>")
    name, recorded = base_folder_name(spec), info.get("base_folder")
    if name is not None and not Path(name).expanduser().exists() and recorded and Path(recorded).exists():
        return {**spec, "init_args": {**spec["init_args"], "name_or_path": recorded}}  # relative to training's folder
    check_base_folder(spec, f"checkpoint {path}", "pass --base_model <new path>", recorded=recorded)
    return spec


def _replace_base(spec: dict[str, Any] | None, base_model: str) -> dict[str, Any]:
    """``spec`` loading from ``base_model`` instead: its ``name_or_path`` replaced, or a ``Pretrained`` source (with
    the recorded dtype) for a base that had none (``FromConfig``)."""
    from lit_prunedpo.hub import written_as_path

    if written_as_path(base_model) and not Path(base_model).expanduser().exists():
        raise FileNotFoundError(f"--base_model {base_model}: no such folder; give the folder the LoRA base model was "
                                "moved to (written by save_pretrained), or its hub name")
    args = dict((spec or {}).get("init_args") or {})
    if spec is not None and "name_or_path" in args:
        return {**spec, "init_args": {**args, "name_or_path": base_model}}
    return {"class_path": "lit_prunedpo.models.Pretrained",
            "init_args": {"name_or_path": base_model, "dtype": args.get("dtype")}}


# transformers config fields that describe no weight: left out of the fields a refused resume names
_NOT_WEIGHTS = {"transformers_version", "torch_dtype", "dtype", "architectures", "use_cache", "output_attentions",
                "output_hidden_states", "return_dict", "id2label", "label2id"}


def check_resumed_policy(checkpoint: dict[str, Any], policy: nn.Module, path: str | None) -> None:
    """Refuse, before Lightning loads its weights, a checkpoint (read from ``path``) whose policy is not the one
    this run built: LoRA adapters into a full model or the reverse, another ``model_type``, or weights of other names
    or shapes (another size), where Lightning would print torch's lists of missing and unexpected keys. A checkpoint
    without the ``"policy"`` record, or without a ``state_dict`` (FSDP2's shards, checked by their loader), is left
    to Lightning.

    Raises:
        ValueError: one line naming the checkpoint, what differs and what to do.
    """
    from lit_prunedpo.lora import is_peft_model

    saved, where = checkpoint.get("policy"), f"checkpoint {path}" if path else "the checkpoint resumed"
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
        return
    lora, fix = is_peft_model(policy), ("resume with the config it was trained with (config.yaml in its run folder), "
                                        "or leave --ckpt_path out to start afresh")
    if bool(saved.get("peft")) != lora:
        held = "LoRA adapters" if saved.get("peft") else "a full model's weights (trained without LoRA)"
        export = f"lit-prunedpo export --ckpt_path {path or 'CKPT'} --out DIR"
        base = f"; to train adapters on the model it holds, export it ({export}) and give DIR as the LoRA's base"
        raise ValueError(f"{where} holds {held}, but this run's model.policy is "
                         f"{'a LoRA' if lora else 'a full model (no LoRA)'}: {fix}{base if lora else ''}")
    now = (policy.get_base_model() if lora else policy).config.to_dict()
    if saved["config"].get("model_type") != now.get("model_type"):
        raise ValueError(f"{where} holds a {saved['config'].get('model_type')} model, but this run's model.policy is "
                         f"a {now.get('model_type')} model: {fix}")
    mismatch = _weights_mismatch(checkpoint.get("state_dict"), policy, lora)
    if mismatch is not None:
        fields = [f"{k} {saved['config'].get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved["config"]) | set(now))
                  if not k.startswith("_") and k not in _NOT_WEIGHTS and saved["config"].get(k) != now.get(k)]
        said = f"; config fields that differ: {', '.join(fields[:6])}" if fields else ""
        raise ValueError(f"{where}: its policy's weights do not fit this run's model.policy ({mismatch}{said}): {fix}")


def _weights_mismatch(state_dict: Any, policy: nn.Module, lora: bool) -> str | None:
    """How the policy's weights in a checkpoint's ``state_dict`` differ from ``policy``'s (names, shapes), or None.
    A LoRA checkpoint leaves out the frozen base: its keys are not missing."""
    from lit_prunedpo.lora import frozen_keys

    if not isinstance(state_dict, dict):
        return None
    saved = {k[len(_POLICY_PREFIX):]: v for k, v in state_dict.items() if k.startswith(_POLICY_PREFIX)}
    current = policy.state_dict()
    missing = sorted(set(current) - set(saved) - (frozen_keys(policy, "") if lora else set()))
    extra = sorted(set(saved) - set(current))
    shapes = sorted(k for k in set(saved) & set(current) if tuple(saved[k].shape) != tuple(current[k].shape))
    said = []
    if shapes:
        said.append(f"{len(shapes)} of other shapes, e.g. {shapes[0]} {tuple(saved[shapes[0]].shape)} in the "
                    f"checkpoint, {tuple(current[shapes[0]].shape)} now")
    if missing:
        said.append(f"{len(missing)} of this run's weights not in it, e.g. {missing[0]}")
    if extra:
        said.append(f"{len(extra)} of its weights not in this run's model, e.g. {extra[0]}")
    return "; ".join(said) or None
