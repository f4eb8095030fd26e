"""GGUF files (llama.cpp's one-file format: weights, config and tokenizer) as a model and tokenizer source.

``transformers`` loads a GGUF file as a folder plus a file name (``from_pretrained(folder, gguf_file=name)``); here
a path ending in ``.gguf`` is enough (:func:`split_gguf_path`), for the model (``lit_prunedpo.models.Pretrained``)
and for the data's tokenizer (``lit_prunedpo.data.tokenize.load_tokenizer``) alike. The weights are dequantized at
load time into a plain dense model (:func:`dense_load_kwargs`), and the quantizer's markers are taken off it
(:func:`plain_model`): a model that trains like any other, and whose ``save_pretrained`` (the export) does not
refuse it as "quantized with gguf". A missing file, a file that is no GGUF and a missing ``gguf`` package are each
said in one line naming the file and what to do, before ``transformers`` reads anything.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["GGUF_MAGIC", "INSTALL_GGUF", "check_gguf_file", "dense_load_kwargs", "gguf_has_tokenizer",
           "is_gguf_path", "load_gguf_tokenizer", "plain_model", "require_gguf", "split_gguf_path",
           "unreadable_gguf"]

#: The first four bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"
#: What to run when the ``gguf`` package is missing (``transformers`` reads GGUF files with it).
INSTALL_GGUF = "pip install 'gguf>=0.10' (or pip install 'lit-prunedpo[gguf]')"
_MIN_VERSION = (0, 10)


def is_gguf_path(name: str | None) -> bool:
    """Whether ``name`` names a GGUF file (ends in ``.gguf``, any case): never a hub repository name."""
    return isinstance(name, str) and name.lower().endswith(".gguf")


def require_gguf(file: str | Path) -> None:
    """Refuse, naming ``file``, when the ``gguf`` package (at least 0.10) is not installed.

    Raises:
        ImportError: one line naming the file and the install command.
    """
    try:
        module = importlib.import_module("gguf")
    except ImportError:
        raise ImportError(f"{file} is a GGUF file, which needs the gguf package to load: {INSTALL_GGUF}") from None
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("gguf")
    except PackageNotFoundError:  # importable but not installed as a distribution: trust it
        found = getattr(module, "__version__", None)
    numbers = tuple(int(p) for p in str(found).split(".")[:2] if p.isdigit()) if found else None
    if numbers and len(numbers) == 2 and numbers < _MIN_VERSION:
        raise ImportError(f"{file} is a GGUF file, which needs gguf >= 0.10 to load (installed: {found}): "
                          f"{INSTALL_GGUF}")


def check_gguf_file(file: str | Path, argument: str) -> None:
    """Refuse a GGUF file that does not exist, is no file, or does not start with the GGUF magic bytes, and a
    missing ``gguf`` package; ``argument`` is the option that named the file, for the message.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a folder, or a file that is no GGUF (another format renamed, an HTML error page).
        ImportError: the ``gguf`` package is missing (:func:`require_gguf`).
    """
    path = Path(file).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"GGUF file {file} ({argument}) does not exist (moved or deleted?): give the path "
                                "of an existing .gguf file")
    if not path.is_file():
        raise ValueError(f"GGUF file {file} ({argument}) is a folder, not a file: give the path of a .gguf file")
    with path.open("rb") as handle:
        head = handle.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise ValueError(f"{file} ({argument}) is not a GGUF file (it does not start with the bytes 'GGUF' but "
                         f"{head!r}): re-download it, or give the model's folder written by save_pretrained")
    require_gguf(file)


def split_gguf_path(file: str, argument: str) -> tuple[str, str]:
    """``(folder, file name)`` of a local GGUF file, as ``from_pretrained(folder, gguf_file=name)`` takes them,
    after :func:`check_gguf_file`."""
    check_gguf_file(file, argument)
    path = Path(file).expanduser()
    return str(path.parent), path.name


def unreadable_gguf(file: str, argument: str, err: BaseException) -> ValueError:
    """The one-line error for a GGUF file ``transformers`` failed to read (cut short, corrupt, an architecture it
    does not convert), naming the file: the cause's first line only."""
    reason = (str(err).strip().splitlines() or [""])[0]
    return ValueError(f"could not load GGUF file {file} ({argument}): {type(err).__name__}: {reason}; if the file is "
                      "truncated or corrupt, re-download it")


def dense_load_kwargs() -> dict[str, Any]:
    """``from_pretrained`` keywords that unpack every GGUF weight into a dense tensor at load time.

    Where the ``kernels`` package has a GGUF matmul for the device, ``transformers`` (5.x) otherwise keeps the weights
    packed in ``GgufLinear`` modules, which cannot be trained or saved. Older versions always dequantize and have no
    such option: nothing to ask for there.
    """
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    if "dequantize" not in inspect.signature(GgufConfig).parameters:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def plain_model(model: nn.Module, file: str) -> nn.Module:
    """``model`` without the GGUF quantizer's markers (``hf_quantizer``, ``config.quantization_config``,
    ``is_quantized``), which would make ``save_pretrained`` refuse it and an export rebuild it as quantized, and
    without the folder name ``from_pretrained`` gave it (no loadable model is there, only the file).

    Raises:
        ValueError: a weight left packed (not floating point), naming ``file``.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for name in ("hf_quantizer", "quantization_method"):
        if name in vars(model):
            delattr(model, name)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if vars(model).get("is_quantized"):
        model.is_quantized = False
    if "name_or_path" in vars(model):
        # the file's folder, which holds no model from_pretrained loads: a LoRA adapter's export would name it as
        # its base (peft reads this name), where without a name it writes the base beside the adapter
        model.name_or_path = ""
    packed = [name for name, p in model.named_parameters() if not p.is_floating_point()]
    if packed:
        raise ValueError(f"GGUF file {file}: transformers left {len(packed)} weights packed ({packed[0]}, ...), which "
                         "cannot be trained: update transformers, or convert the file with save_pretrained first")
    return model


def gguf_has_tokenizer(file: str | Path) -> bool:
    """Whether a GGUF file carries a tokenizer (its ``tokenizer.ggml.tokens`` field), read from its header."""
    from gguf import GGUFReader

    return "tokenizer.ggml.tokens" in GGUFReader(str(file)).fields


def load_gguf_tokenizer(file: str, argument: str) -> Any:
    """The tokenizer (with its chat template) a local GGUF file carries, as ``AutoTokenizer`` builds it.

    Raises:
        FileNotFoundError, ValueError, ImportError: as :func:`check_gguf_file`; ``ValueError`` also for a file
            ``transformers`` cannot read a tokenizer from, naming it.
    """
    from transformers import AutoTokenizer

    folder, name = split_gguf_path(file, argument)
    try:
        return AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as err:  # a truncated header raises struct.error, a cut tensor table ValueError...
        raise unreadable_gguf(file, argument, err) from err
