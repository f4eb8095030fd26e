"""``lit-prunedpo export``: a Hugging Face folder from a training checkpoint.

The folder holds the policy (``save_pretrained``, safetensors) and the data's tokenizer (with its chat
template), so ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)`` load
it in any inference stack; the tokenizer's BOS, EOS and PAD ids are written into ``config.json`` and
``generation_config.json`` (a randomly initialised model's config carries its class's defaults). The checkpoint
(a single-file Lightning checkpoint or an FSDP2 folder of shards) is read, and the policy rebuilt from what
``PrunedDPO.on_save_checkpoint`` recorded of it, by :mod:`lit_prunedpo.export.policy`. A LoRA policy is
exported merged (full weights, ``merge_and_unload``) or as peft's adapter folder (``adapter_config.json`` +
``adapter_model.safetensors``, plus ``base/`` when the base is no hub model or folder, so that
``AutoPeftModelForCausalLM`` finds it), as asked. A LoRA base folder that is gone since training (moved or deleted)
is refused in one line naming it and the checkpoint (:func:`lit_prunedpo.lora.check_base_folder`); ``--base_model
PATH`` replaces the recorded base (its weights are still checked against the checkpoint's digest).

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
from lit_prunedpo.export.policy import load_policy, policy_metadata, read_checkpoint
from lit_prunedpo.export.prompt_ids import match_plain_call, prompt_inputs, trained_with_bos
from lit_prunedpo.export.whole_folder import MARKER, WriteTracker, move_into_place, remove
from lit_prunedpo.full_disk import DiskFull, describe_full, disk_full_errno

if TYPE_CHECKING:
    from torch import nn

# load_policy, policy_metadata and read_checkpoint (lit_prunedpo.export.policy) are public here too
__all__ = ["align_special_tokens", "check_vocabulary", "export", "load_policy", "main", "policy_metadata",
           "read_checkpoint"]


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
    _write_whole(model, tok, meta, ckpt_path, adapter, out_dir)
    return out_dir


def _write_whole(model: nn.Module, tok: Any, meta: dict[str, Any], ckpt_path: str, adapter: str,
                 out_dir: Path) -> None:
    """Write the export into ``<out>.partial-<pid>`` beside ``out_dir`` and rename it into place once complete, then
    say what was written (:func:`_report`).

    Raises:
        DiskFull: the disk filled; the partial folder is removed and ``out_dir`` is left as it was.
    """
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
        print(f"the LoRA base has no hub name or folder: written to {written['base']} (adapter_config.json names it by "
              "this path: after moving the export, set base_model_name_or_path there to its new base/ folder)")
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
