"""``lit-prunedpo export``: a Hugging Face folder from a training checkpoint.

The folder holds the policy (``save_pretrained``, safetensors) and the data's tokenizer (with its chat
template), so ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)`` load
it in any inference stack; the tokenizer's BOS, EOS and PAD ids are written into ``config.json`` and
``generation_config.json`` (a randomly initialised model's config carries its class's defaults). Reads a single-file Lightning checkpoint or an FSDP2 folder of shards
(``torch.distributed.checkpoint``, read in one process without a process group: only the policy's tensors
are loaded, not the optimizer's).

What a checkpoint must carry besides the weights is written by ``PrunedDPO.on_save_checkpoint`` under
``"policy"`` (:func:`policy_metadata`): the model's ``transformers`` config, and for a LoRA policy the
adapter config, the base model's source and a digest of its weights (LoRA checkpoints hold the adapters only;
the frozen base is rebuilt from its source, and refused when its weights are not the ones trained on). A LoRA policy is exported merged (full weights, ``merge_and_unload``) or as peft's
adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``, plus ``base/`` when the base is no hub
model or folder, so that ``AutoPeftModelForCausalLM`` finds it), as asked. A LoRA base folder that is gone since
training (moved or deleted) is refused in one line naming it and the checkpoint
(:func:`lit_prunedpo.lora.check_base_folder`); ``--base_model PATH`` replaces the recorded base (its weights are
still checked against the checkpoint's digest). A base recorded by a relative path is found from another working
folder too: the checkpoint records the folder's absolute path as well (``"base_folder"``).

The tokenizer is written so that its plain call ``tok(prompt)`` gives the prompt ids training gave the model: training
puts the tokenizer's BOS before every prompt unless the data module had ``add_bos=False`` (read from the checkpoint's
data-module hyperparameters) and adds no EOS, so the saved tokenizer's own ``add_bos_token`` / ``add_eos_token``
switches are set to match, where it has them, and the saved-and-reloaded tokenizer is checked against the training
function on sample prompts. Where no switch can make them agree (ByT5's tokenizer always appends EOS), the export
records how to build prompt ids (``lit_prunedpo_export.json``, ``"prompt_ids"``) and prints one line saying so.

Nothing half-written is ever left under ``out``: the export is written into the sibling ``<out>.partial-<pid>`` and
renamed into place once complete, its marker ``lit_prunedpo_export.json`` last (a folder without the marker is no
finished export; in an existing folder the marker is taken out first and put back last). A disk that fills
(``ENOSPC``, or ``EFBIG``) removes the partial folder and raises :class:`~lit_prunedpo.reference.store.DiskFull`, one
line naming the file being written; a partial folder a killed export left is never read, and the next export names
it for deletion.

    lit-prunedpo export --ckpt_path runs/quickstart/checkpoints/last.ckpt --out model/
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_type_hints

# torch, and lit_prunedpo.hub / .models (which import torch and lightning), are imported where they are used:
# `lit-prunedpo export --help` reads only the signature of `export` (tests/test_startup.py)
from lit_prunedpo.full_disk import DiskFull, describe_full, disk_full_errno
from lit_prunedpo.prompt_ids import match_plain_call, prompt_inputs, trained_with_bos
from lit_prunedpo.whole_folder import MARKER, WriteTracker, move_into_place, remove

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = ["align_special_tokens", "check_vocabulary", "export", "load_policy", "main", "policy_metadata",
           "read_checkpoint"]

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
    """The absolute path of the folder a base's spec loads from, when it is one now (at training time): an export
    then knows a relative name for a folder, and finds it from another working folder."""
    from lit_prunedpo.lora import base_folder_name

    name = base_folder_name(spec)
    if name is None or not Path(name).expanduser().is_dir():
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
    # worded as lit_prunedpo.distributed.VerifiedCheckpointIO words a failed load; the cause's first line only, so
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
        raise ValueError(f"cannot load checkpoint {path}: not a sharded Lightning checkpoint (a folder without meta.pt)")
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
    if name is not None and not Path(name).expanduser().exists() and recorded and Path(recorded).is_dir():
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


def _tokenizer(meta: dict[str, Any], tokenizer: str | None, chat_template: str | None) -> Any:
    from lit_prunedpo.data.tokenize import load_tokenizer, read_chat_template

    data = meta.get("datamodule_hyper_parameters") or {}
    name = tokenizer if tokenizer is not None else data.get("tokenizer")
    if name is None:
        return None
    tok = load_tokenizer(name)
    template = chat_template if chat_template is not None else data.get("chat_template")
    if template is not None:
        tok.chat_template = read_chat_template(template)
    return tok


def check_vocabulary(model: nn.Module, tokenizer: Any, ckpt_path: str | Path) -> None:
    """Refuse a tokenizer with more tokens than the model has embedding rows: its ids past the embedding would
    fail (or, on some devices, read garbage) at the first generate. A larger model vocabulary is fine.

    Raises:
        ValueError: naming both sizes, the tokenizer and the checkpoint.
    """
    if tokenizer is None:
        return
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        name = tokenizer.name_or_path or type(tokenizer).__name__
        raise ValueError(
            f"the tokenizer {name!r} has {len(tokenizer)} tokens but the model in {ckpt_path} has {rows} embedding "
            f"rows: ids from {rows} up would index past the embedding; export with the tokenizer the run trained "
            "with (leave --tokenizer out) or one of at most that size"
        )


_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def align_special_tokens(model: nn.Module, tokenizer: Any) -> list[str]:
    """Give ``model``'s config and generation config the tokenizer's BOS, EOS and PAD ids, where the tokenizer
    has them: a randomly initialised model carries its config class's defaults (Llama's BOS 1, EOS 2), which
    mean other tokens in the tokenizer, so ``generate`` would stop on the wrong id. An EOS list (several stop
    ids) that holds the tokenizer's EOS is kept. Returns one ``"where name: old -> new"`` per changed value."""
    targets = [("config.json", getattr(model, "config", None)),
               ("generation_config.json", getattr(model, "generation_config", None))]
    changes = []
    for name in _SPECIAL_IDS:
        wanted = getattr(tokenizer, name, None)
        if wanted is None:
            continue
        for where, config in targets:
            if config is None:
                continue
            old = getattr(config, name, None)
            if old == wanted or (isinstance(old, (list, tuple)) and wanted in old):
                continue
            setattr(config, name, wanted)
            changes.append(f"{where} {name}: {old} -> {wanted}")
    return changes


def export(
    ckpt_path: str,
    out: str,
    adapter: Literal["merged", "adapter"] = "merged",
    tokenizer: str | None = None,
    chat_template: str | None = None,
    base_model: str | None = None,
) -> Path:
    """Write a Hugging Face folder from a training checkpoint.

    Args:
        ckpt_path: a ``.ckpt`` file or an FSDP2 checkpoint folder written by ``lit-prunedpo fit``.
        out: the folder to write (created; existing files of the same names are replaced, and those an earlier
            export wrote that this one does not are removed). Written as ``<out>.partial-<pid>`` beside it and
            renamed into place once complete: ``out`` never holds half an export.
        adapter: LoRA runs only: ``merged`` writes full weights with the adapters merged in, ``adapter`` writes
            peft's adapter folder (load it with ``peft.AutoPeftModelForCausalLM.from_pretrained(out)``); a base that
            is no hub model or folder (``FromConfig``) is written to ``out/base`` and named in ``adapter_config.json``
            by its absolute path.
        tokenizer: tokenizer name or path; default: the one the run's data module used.
        chat_template: a Jinja template or a file holding one; default: the data module's, else the tokenizer's.
        base_model: LoRA runs only: the folder (or hub name) of the base model, replacing the one the checkpoint
            names (moved or deleted since training); its weights must be the ones the adapters were trained on.

    Returns:
        the folder written.

    Raises:
        DiskFull: the disk filled (or a file grew too large for it) while the export was written; the message names
            the file, ``out`` is left as it was.
        FileNotFoundError: the LoRA base folder named in the checkpoint is gone (pass ``base_model``).
    """
    from lit_prunedpo.lora import is_peft_model

    if adapter not in ("merged", "adapter"):
        raise ValueError(f"adapter must be 'merged' or 'adapter', got {adapter!r}")
    out_dir = Path(out).expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out}: a file, not a folder: give a folder to write the export into")
    model, meta = load_policy(ckpt_path, base_model=base_model)
    tok = _tokenizer(meta, tokenizer, chat_template)
    check_vocabulary(model, tok, ckpt_path)
    if meta["policy"]["peft"] is not None and adapter == "merged":
        model = model.merge_and_unload()
    if tok is not None and not is_peft_model(model):  # peft's adapter folder has no config.json of its own
        changes = align_special_tokens(model, tok)
        if changes:
            print(f"special-token ids set to the tokenizer's ({type(tok).__name__}): {'; '.join(changes)}")
    final = out_dir.resolve()  # absolute: peft resolves a base's name from the caller's working folder
    partial = final.parent / f"{final.name}.partial-{os.getpid()}"
    leftovers = sorted(p.name for p in final.parent.glob(f"{glob.escape(final.name)}.partial-*") if p != partial)
    remove(partial)  # one of an earlier process that had this pid (pids are reused): never ours
    writes = WriteTracker(partial)
    try:
        written, switches = _write_export(model, tok, meta, ckpt_path, adapter, partial, final, writes)
    except BaseException as err:
        remove(partial)
        code = disk_full_errno(err)
        if code is None:
            raise
        raise DiskFull(
            f"{describe_full(code)} while writing {out_dir / writes.failed}, exporting {ckpt_path}: {out_dir} is as "
            f"it was (the partial export {partial.name} beside it was removed): free space on that disk, or pass "
            "another --out", code,
        ) from None
    move_into_place(partial, final)
    _report(written, switches, out_dir, leftovers, final.parent)
    return out_dir


# jsonargparse (`main`) would resolve the string annotations (`from __future__ import annotations`) by running this
# module's `if TYPE_CHECKING:` block, which imports torch; resolved here, `lit-prunedpo export --help` imports no torch
export.__annotations__ = get_type_hints(export)


def _write_export(
    model: nn.Module, tok: Any, meta: dict[str, Any], ckpt_path: str, adapter: str, partial: Path, final: Path,
    writes: WriteTracker,
) -> tuple[dict[str, Any], list[str]]:
    """Everything of the export into ``partial`` (named as ``final`` where a file names the folder), the marker
    last; returns the marker's contents and the tokenizer switches changed (:func:`match_plain_call`)."""
    from lit_prunedpo.lora import is_peft_model

    with writes.step("."):
        partial.mkdir(parents=True)
    base_dir = None
    if is_peft_model(model) and not model.peft_config["default"].base_model_name_or_path:
        # A base that no hub name or folder holds (FromConfig's random weights): written beside the adapter and named
        # in adapter_config.json, so that AutoPeftModelForCausalLM.from_pretrained(out) finds it. An absolute path
        # (peft resolves the name from the caller's working folder, not from the adapter's), and the final one.
        base_dir = final / "base"
        model.peft_config["default"].base_model_name_or_path = str(base_dir)
    with writes.step("adapter_model.safetensors" if is_peft_model(model) else "model.safetensors"):
        model.save_pretrained(partial, safe_serialization=True)
    if base_dir is not None:
        base = model.unload()  # the frozen base as trained on, adapters removed (after they were saved)
        if tok is not None:
            align_special_tokens(base, tok)
        with writes.step("base/model.safetensors"):
            base.save_pretrained(partial / "base", safe_serialization=True)
    inputs, switches = None, []
    if tok is not None:
        add_bos = trained_with_bos(meta)
        switches = match_plain_call(tok, add_bos)
        with writes.step("tokenizer_config.json"):
            tok.save_pretrained(partial)
        inputs = prompt_inputs(tok, partial, add_bos)
    written = {
        "checkpoint": str(ckpt_path),
        "global_step": meta.get("global_step"),
        "lora": None if meta["policy"]["peft"] is None else adapter,
        "tokenizer": None if tok is None else (tok.name_or_path or type(tok).__name__),
        "base": None if base_dir is None else str(base_dir),
        "prompt_ids": inputs,
        "files": sorted([p.name for p in partial.iterdir()] + [MARKER]),
    }
    with writes.step(MARKER):
        (partial / MARKER).write_text(json.dumps(written, indent=2) + "\n")
    return written, switches


def _report(written: dict[str, Any], switches: list[str], out_dir: Path, leftovers: list[str], parent: Path) -> None:
    """The export's closing lines: the base written beside an adapter, how prompts are to be tokenized, partial
    exports that interrupted runs left, and what was exported."""
    if written["base"] is not None:
        print(f"the LoRA base has no hub name or folder: written to {written['base']} (adapter_config.json names it)")
    inputs = written["prompt_ids"]
    if inputs is not None and inputs["plain_call"]:
        if switches:
            print(f"tokenizer: {'; '.join(switches)}, so that tok(prompt) gives the prompt ids training "
                  f"did (data add_bos={inputs['add_bos']})")
    elif inputs is not None:
        example = inputs["example"]
        print(f"the exported tokenizer's plain call tok(prompt) does not give the prompt ids training did (for "
              f"{example['prompt']!r}: {example['plain_call']}, training {example['training']}): build prompt ids as "
              f"{inputs['build']} (recorded in {out_dir / MARKER}, \"prompt_ids\")")
    for name in leftovers:
        print(f"{parent / name}: left by an interrupted export (never read as one): delete it")
    if written["tokenizer"] is None:
        print(f"exported the policy to {out_dir} (no tokenizer: the run's data module had none; pass --tokenizer)")
    else:
        print(f"exported the policy and tokenizer to {out_dir}")


def main(args: list[str] | None = None) -> None:
    """``lit-prunedpo export --ckpt_path PATH --out DIR [--adapter merged|adapter] [--tokenizer NAME]
    [--base_model PATH]``."""
    from jsonargparse import CLI

    CLI(export, args=args, as_positional=False, prog="lit-prunedpo export")
