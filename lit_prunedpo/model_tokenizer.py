"""Refuse data tokenized for another model: a pretrained policy trained on ids its own tokenizer did not make.

A config that swaps the quickstart's random model for a ``Pretrained`` one and keeps the data's tokenizer (ByT5's
bytes) trains for minutes on ids the model reads as other tokens, and nothing fails: the ids all fit its larger
embedding. In TRL the model's tokenizer is the processing class, so this cannot happen there. Here the data module
names its tokenizer separately (``data.init_args.tokenizer``), so :func:`check_model_tokenizer` compares, in the CLI's
config pass and before anything is built, the data's tokenizer with the one the policy's folder or file carries (a
``LoRA`` base's too): different vocabularies (``get_vocab()``, not names: the same tokenizer given by another path is
the same) are refused in one line naming both and the flag to set. A model without a tokenizer of its own is not
checked; a hub name is looked up only as its loader would (``lit_prunedpo.hub``: no retries against a hub that does
not answer), and a model tokenizer that cannot be read is left to the model's own loading to report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

__all__ = ["check_model_tokenizer", "model_tokenizer", "vocabulary_difference"]


def _folder_has_tokenizer(folder: Path) -> bool:
    from lit_prunedpo.data.tokenize import is_vocabulary_file

    return any(f.is_file() and (is_vocabulary_file(f.name) or f.name == "tokenizer_config.json")
               for f in folder.iterdir())


def _gguf_tokenizer(file: Path, where: str) -> tuple[Any, str] | None:
    """A local GGUF file's tokenizer and its path, or ``None`` (no tokenizer in it, or no readable GGUF: the
    model's loading says why)."""
    from lit_prunedpo.gguf_files import check_gguf_file, gguf_has_tokenizer, load_gguf_tokenizer

    try:
        check_gguf_file(file, f"{where}.init_args.name_or_path")
        if not gguf_has_tokenizer(file):
            return None
        return load_gguf_tokenizer(str(file), f"{where}.init_args.name_or_path"), str(file)
    except (OSError, ValueError, ImportError):
        return None


def _hub_tokenizer(args: Mapping[str, Any], where: str) -> tuple[Any, str] | None:
    """A hub model's tokenizer and the value that names it for the data module, or ``None`` (the hub does not
    answer and the cache lacks it, or the repository has no tokenizer)."""
    from huggingface_hub import try_to_load_from_cache
    from transformers import AutoTokenizer

    from lit_prunedpo.hub import hub_or_cache, in_hub_cache

    name, gguf_file, revision = args["name_or_path"], args.get("gguf_file"), args.get("revision")
    try:
        cache_only = hub_or_cache(name, f"{where}.init_args.name_or_path", cached=lambda: in_hub_cache(name))
        tokenizer = AutoTokenizer.from_pretrained(
            name, revision=revision, local_files_only=cache_only, trust_remote_code=bool(args.get("trust_remote_code")),
            **({"gguf_file": gguf_file} if gguf_file else {}))
    except Exception:  # HubUnreachable, no tokenizer in the repository, nothing cached: the model's build says
        return None
    if gguf_file is None:
        return tokenizer, name
    cached = try_to_load_from_cache(name, gguf_file, revision=revision)  # the data module takes a GGUF by its path
    return (tokenizer, cached) if isinstance(cached, str) else None


def model_tokenizer(args: Mapping[str, Any], where: str) -> tuple[Any, str] | None:
    """The tokenizer a ``Pretrained`` source's model comes with (``args``: its ``init_args``) and the value of
    ``--data.init_args.tokenizer`` that loads it, or ``None`` when the model has none (or it cannot be read)."""
    from transformers import AutoTokenizer

    from lit_prunedpo.gguf_files import is_gguf_path
    from lit_prunedpo.hub import written_as_path

    name = str(args.get("name_or_path") or "")
    path = Path(name).expanduser()
    if is_gguf_path(name):
        return _gguf_tokenizer(path, where)
    if path.is_dir() and args.get("gguf_file"):
        return _gguf_tokenizer(path / args["gguf_file"], where)
    if path.is_dir():
        if not _folder_has_tokenizer(path):
            return None
        try:
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=bool(args.get("trust_remote_code"))), name
        except Exception:  # a folder whose tokenizer does not load: the model's build (or the data module) says why
            return None
    if not name or path.exists() or written_as_path(name):
        return None  # a folder that is gone: Pretrained.build names it
    return _hub_tokenizer(args, where)


def vocabulary_difference(model: Any, data: Any) -> str | None:
    """How the vocabularies of two tokenizers differ (sizes, or how many tokens have another id), ``None`` when
    they are the same (token by token, with the same ids)."""
    ours, theirs = data.get_vocab(), model.get_vocab()
    if ours == theirs:
        return None
    if len(ours) != len(theirs):
        return f"{len(ours)} tokens against the model's {len(theirs)}"
    moved = sum(1 for token, i in theirs.items() if ours.get(token) != i)
    return f"both have {len(ours)} tokens, but {moved} of the model's have another id or are missing"


def _same_path(a: str, b: str) -> bool:
    return Path(a).expanduser().exists() and Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def check_model_tokenizer(policy: Any, data: Any) -> None:
    """Refuse a ``Pretrained`` policy (or ``LoRA`` base) whose own tokenizer is not the data's, in a parsed CLI config
    (jsonargparse ``Namespace`` objects), before anything is built.

    Raises:
        ValueError: one line naming the data's tokenizer, the model, how the vocabularies differ and the flag to set
            (``--data.init_args.tokenizer <the model's tokenizer>``).
    """
    from lit_prunedpo.models import source_behind_lora

    source, where = source_behind_lora(policy)
    if source is None or not str(source.get("class_path", "")).endswith("models.Pretrained") or data is None:
        return
    data_name = (data.get("init_args") or {}).get("tokenizer")
    args = source.get("init_args") or {}
    if data_name is None or not args.get("name_or_path"):
        return  # data without a tokenizer (SyntheticPreferenceData's ids), or no model named
    if _same_path(str(data_name), str(args["name_or_path"])) and not args.get("gguf_file"):
        return
    found = model_tokenizer(args, where)
    if found is None:
        return
    from lit_prunedpo.data.tokenize import load_tokenizer

    tokenizer, value = found
    difference = vocabulary_difference(tokenizer, load_tokenizer(str(data_name)))
    if difference is None:
        return
    model = args["name_or_path"] + (f" (gguf_file {args['gguf_file']})" if args.get("gguf_file") else "")
    raise ValueError(
        f"the data's tokenizer {data_name!r} (data.init_args.tokenizer) is not the tokenizer of the model {model} "
        f"({where}.init_args.name_or_path): their vocabularies differ ({difference}), so the model would read the "
        f"data's token ids as other tokens; tokenize with the model's own: --data.init_args.tokenizer {value}"
    )
