"""Model sources: where a policy or reference model comes from, chosen by ``class_path`` in a config.

``Pretrained`` loads a ``transformers`` causal LM by hub name, local path or ``.gguf`` file (real loading code;
this project's tests run it on local copies and a real GGUF file). ``FromConfig`` builds a randomly initialised
model from a config, which is what the tests and the quickstart use.
"""

from __future__ import annotations

import difflib
import inspect
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_prunedpo.gguf_files import (
    check_gguf_file, dense_load_kwargs, is_gguf_path, plain_model, require_gguf, split_gguf_path, unreadable_gguf,
)
from lit_prunedpo.hub import hub_or_cache, in_hub_cache, offline_hint, written_as_path
from lit_prunedpo.safetensors_files import broken_safetensors

__all__ = [
    "FromConfig", "ModelSource", "Pretrained", "check_config_keys", "config_class", "config_keys",
    "fill_vocab_size", "source_behind_lora", "source_from_spec"
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or null, got {name!r}")
    return _DTYPES[name]


class ModelSource(ABC):
    """Builds an ``nn.Module`` causal LM (a ``transformers`` ``*ForCausalLM``)."""

    @abstractmethod
    def build(self) -> nn.Module:
        """Return a new model."""

    def spec(self) -> dict[str, Any] | None:
        """``{"class_path", "init_args"}`` that rebuild this source (stored in checkpoints so that an export can
        rebuild frozen weights a checkpoint leaves out); ``None`` when the source cannot say."""
        init_args = getattr(self, "init_args", None)
        if init_args is None:
            return None
        return {"class_path": f"{type(self).__module__}.{type(self).__qualname__}", "init_args": dict(init_args)}


def source_from_spec(spec: dict[str, Any]) -> ModelSource:
    """The :class:`ModelSource` that :meth:`ModelSource.spec` described."""
    import importlib

    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**spec["init_args"])


class Pretrained(ModelSource):
    """A pretrained causal LM from the hub or a local directory, via ``AutoModelForCausalLM.from_pretrained``.

    A GGUF file (llama.cpp's format) loads as well, given as a local path ending in ``.gguf`` or as a hub name with
    ``gguf_file``: its weights are dequantized into a plain dense model (float32 unless ``dtype`` says otherwise),
    which trains and exports like any other (:mod:`lit_prunedpo.gguf_files`; needs the ``gguf`` package).

    Args:
        name_or_path: hub model id (e.g. ``gpt2``), a local directory saved with ``save_pretrained``, or the path of
            a local ``.gguf`` file.
        dtype: parameter dtype (``float32``, ``bfloat16``, ``float16``); ``None`` keeps the checkpoint's.
        revision: hub revision (branch, tag or commit).
        attn_implementation: e.g. ``sdpa``, ``eager``, ``flash_attention_2``; ``None`` lets transformers pick.
        trust_remote_code: allow model code from the hub repository.
        gguf_file: the name of a GGUF file inside the hub repository (or local directory) ``name_or_path``.

    Raises:
        ValueError: ``gguf_file`` given with a ``name_or_path`` that is itself a ``.gguf`` file.
    """

    def __init__(
        self,
        name_or_path: str,
        dtype: str | None = None,
        revision: str | None = None,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        gguf_file: str | None = None,
    ) -> None:
        if gguf_file is not None and is_gguf_path(name_or_path):
            raise ValueError(f"Pretrained: name_or_path {name_or_path!r} is a .gguf file and gguf_file {gguf_file!r} "
                             "names another: give the file's path as name_or_path and leave gguf_file out")
        self.init_args = {"name_or_path": name_or_path, "dtype": dtype, "revision": revision,
                          "attn_implementation": attn_implementation, "trust_remote_code": trust_remote_code,
                          "gguf_file": gguf_file}
        self.name_or_path = name_or_path
        self.dtype = _dtype(dtype)
        self.revision = revision
        self.attn_implementation = attn_implementation
        self.trust_remote_code = trust_remote_code
        self.gguf_file = gguf_file

    def _kwargs(self) -> dict[str, Any]:
        """``from_pretrained``'s keywords from this source's arguments (where the model is read from aside)."""
        kwargs: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if self.revision is not None:
            kwargs["revision"] = self.revision
        if self.attn_implementation is not None:
            kwargs["attn_implementation"] = self.attn_implementation
        if self.dtype is not None:
            kwargs["dtype"] = self.dtype
        return kwargs

    def _where(self, kwargs: dict[str, Any]) -> tuple[str, bool]:
        """``(source, is local)`` to hand ``from_pretrained``; a GGUF file's name goes into ``kwargs``. A local path
        that is gone, a GGUF file that is missing or no GGUF, and a hub name the hub cannot give are refused here."""
        if is_gguf_path(self.name_or_path):  # a local file: never a hub name
            folder, kwargs["gguf_file"] = split_gguf_path(self.name_or_path, "Pretrained name_or_path")
            return folder, True
        looks_local = Path(self.name_or_path).expanduser().exists()
        if not looks_local and written_as_path(self.name_or_path):
            # a folder that is gone (moved or deleted): the hub client would call it a malformed repo id
            raise FileNotFoundError(f"model folder {self.name_or_path} does not exist (moved or deleted?): give the "
                                    "folder's new path, or a hub name")
        if looks_local:
            check_adapter_base(Path(self.name_or_path).expanduser())
        if self.gguf_file is not None:
            if looks_local:
                check_gguf_file(Path(self.name_or_path).expanduser() / self.gguf_file, "Pretrained gguf_file")
            else:
                require_gguf(f"{self.name_or_path}/{self.gguf_file}")
            kwargs["gguf_file"] = self.gguf_file
        if not looks_local:
            # a hub name: one request says at once whether the hub answers, instead of a minute of retries
            kwargs["local_files_only"] = hub_or_cache(
                self.name_or_path, "model.policy.init_args.name_or_path", cached=lambda: in_hub_cache(self.name_or_path)
            )
        return (str(Path(self.name_or_path).expanduser()) if looks_local else self.name_or_path), looks_local

    def build(self) -> nn.Module:
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM

        kwargs = self._kwargs()
        source, looks_local = self._where(kwargs)
        gguf = kwargs.get("gguf_file")
        shown = self.name_or_path if gguf is None or is_gguf_path(self.name_or_path) else f"{source}/{gguf}"
        try:
            model = AutoModelForCausalLM.from_pretrained(source, **kwargs, **(dense_load_kwargs() if gguf else {}))
        except SafetensorError as err:  # a file cut short by an interrupted download or save
            raise broken_safetensors(source, looks_local, err) from err
        except OSError as err:
            where = "local directory" if looks_local else "hub model id"
            raise OSError(f"could not load a causal LM from {self.name_or_path!r} as a {where}: {err}"
                          f"{'' if looks_local else offline_hint(self.name_or_path)}") from err
        except Exception as err:
            if gguf is None:
                raise
            raise unreadable_gguf(shown, "Pretrained name_or_path", err) from err
        return plain_model(model, shown) if gguf else model


# Keys ``PretrainedConfig`` takes and converts instead of storing them under their own name, so that neither a
# config class's signature nor its ``to_dict()`` lists them: ``dtype``'s former name, the label count (stored as
# ``id2label``), the attention backend (stored privately).
_CONVERTED_KEYS = frozenset({"torch_dtype", "num_labels", "attn_implementation"})
# The rotary-embedding keys that transformers 5 folds into ``rope_parameters``; known only to models with RoPE.
_ROPE_KEYS = frozenset({"rope_scaling", "rope_theta", "partial_rotary_factor"})


def config_class(model_type: str) -> type:
    """The ``transformers`` config class of ``model_type`` (what ``AutoConfig.for_model`` builds).

    Raises:
        ValueError: an unknown model type, naming the closest known ones.
    """
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=5)
        hint = f"closest model types: {', '.join(close)}" if close else "e.g. llama, gpt2, qwen2"
        raise ValueError(f"FromConfig: unknown model_type {model_type!r} (not a transformers model type); {hint}")
    return CONFIG_MAPPING[model_type]


def config_keys(cls: type) -> set[str]:
    """Every key a ``transformers`` config class knows: its ``__init__`` parameters, what a default instance
    serialises, its ``attribute_map`` aliases (GPT-2's ``hidden_size`` for ``n_embd``) and the keys
    ``PretrainedConfig`` converts (``torch_dtype``, ``rope_scaling``, ...)."""
    params = inspect.signature(cls.__init__).parameters.values()
    keys = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)} - {"self"}
    keys |= set(cls().to_dict()) | set(getattr(cls, "attribute_map", {})) | _CONVERTED_KEYS
    if keys & {"rope_parameters", "rope_theta", "rope_scaling"}:
        keys |= _ROPE_KEYS
    return keys - {"model_type"}  # FromConfig's own argument: a config's would contradict it


def check_config_keys(model_type: str, config: dict[str, Any]) -> type:
    """The config class of ``model_type``, after checking that it knows every key of ``config``: transformers
    config classes store any keyword as an attribute, so a misspelt size would otherwise leave the default in
    place and carry the typo into ``config.yaml`` and the checkpoint.

    Raises:
        ValueError: naming each unknown key, the model type and the closest valid names.
    """
    cls = config_class(model_type)
    unknown = [key for key in config if key not in (known := config_keys(cls))] if config else []
    if not unknown:
        return cls
    public = sorted(k for k in known if not k.startswith("_"))
    parts, all_close = [], True
    for key in unknown:
        if key == "model_type":
            parts.append("'model_type' (give it as FromConfig's model_type, not inside config)")
        elif key in _ROPE_KEYS:
            parts.append(f"{key!r} (this model has no rotary position embeddings)")
        else:
            close = difflib.get_close_matches(str(key), public, n=3)
            all_close &= bool(close)
            parts.append(f"{key!r} (closest valid names: {', '.join(close)})" if close
                         else f"{key!r} (no close valid name)")
    listing = "" if all_close else f"; its keys are: {', '.join(public)}"
    raise ValueError(
        f"FromConfig: unknown config key{'s' if len(unknown) > 1 else ''} {'; '.join(parts)} for model_type "
        f"{model_type!r} ({cls.__name__}){listing}"
    )


class FromConfig(ModelSource):
    """A randomly initialised causal LM built from a ``transformers`` config.

    Args:
        model_type: a ``transformers`` model type, e.g. ``llama``, ``gpt2``, ``qwen2``.
        config: keyword arguments of that model type's config (sizes, vocabulary, ...); every key must be one the
            config class knows.
        seed: seed of the weight initialisation; the global RNG is left untouched.
        dtype: parameter dtype; ``None`` is float32.

    Raises:
        ValueError: an unknown ``model_type`` or a ``config`` key its config class does not know (each named,
            with the closest valid names).
    """

    def __init__(self, model_type: str = "llama", config: dict[str, Any] | None = None, seed: int = 0,
                 dtype: str | None = None) -> None:
        self.init_args = {"model_type": model_type, "config": dict(config or {}), "seed": seed, "dtype": dtype}
        self.model_type = model_type
        self.config = dict(config or {})
        self.seed = int(seed)
        self.dtype = _dtype(dtype)
        self.config_class = check_config_keys(model_type, self.config)

    def build(self) -> nn.Module:
        from transformers import AutoModelForCausalLM

        config = self.config_class(**self.config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = AutoModelForCausalLM.from_config(config)
        return model.to(self.dtype) if self.dtype is not None else model


# What a config holds for "not set": YAML's null, and the string jsonargparse makes of ``--...vocab_size null``
# inside a free-form dict.
_UNSET = (None, "None", "null", "")


def source_behind_lora(policy: Any) -> tuple[Any, str]:
    """The source that builds the model in a parsed CLI config's ``model.policy`` (a ``LoRA``'s base, however deep),
    and where it is in the config (``model.policy.init_args.base`` for a LoRA base)."""
    where = "model.policy"
    while policy is not None and str(policy.get("class_path", "")).endswith(".LoRA"):
        policy = policy.get("init_args", {}).get("base")
        where += ".init_args.base"
    return policy, where


def fill_vocab_size(policy: Any, data: Any) -> str | None:
    """Fit a ``FromConfig`` policy's (also a ``LoRA`` base's) ``vocab_size`` to the data's vocabulary, in a parsed
    CLI config (jsonargparse ``Namespace`` objects), before anything is built.

    The data's size is ``len(tokenizer)`` for a data module with a ``tokenizer`` argument (loaded here, as the data
    module will load it) or its ``vocab_size`` argument (``SyntheticPreferenceData``). Without ``vocab_size`` (or with
    ``null``) the model takes the data's size; a given size larger than the data's is kept (rows no token uses); a
    smaller one is refused, since token ids past it would index outside the embedding. The shipped configs leave
    ``vocab_size`` out, so changing the tokenizer changes the model with it.

    Returns:
        a line to log when the config was filled in or differs from the data's, else ``None`` (a ``vocab_size``
        equal to the data's, another source, no data vocabulary).

    Raises:
        ValueError: a given ``vocab_size`` smaller than the data's vocabulary, naming both sizes and the tokenizer.
    """
    policy, where = source_behind_lora(policy)
    if policy is None or not str(policy.get("class_path", "")).endswith("models.FromConfig") or data is None:
        return None
    data_args = data.get("init_args") or {}
    if data_args.get("tokenizer") is not None:
        from lit_prunedpo.data.tokenize import load_tokenizer

        size, origin = len(load_tokenizer(data_args["tokenizer"])), f"the tokenizer {data_args['tokenizer']!r}"
    elif data_args.get("vocab_size") is not None:
        size, origin = int(data_args["vocab_size"]), "data.vocab_size"
    else:
        return None
    args = policy.get("init_args")
    config = dict(args.get("config") or {})
    given = config.get("vocab_size")
    if given in _UNSET:
        config["vocab_size"] = size
        args["config"] = config
        return f"{where}: vocab_size not set, using the data's: {size} ({origin})"
    try:
        given = int(given)
    except (TypeError, ValueError):
        raise ValueError(f"{where}.init_args.config.vocab_size must be an integer or null, got {given!r}") from None
    config["vocab_size"] = given
    args["config"] = config
    if given < size:
        raise ValueError(
            f"{where}.init_args.config.vocab_size is {given} but {origin} has {size} tokens: ids from {given} up "
            f"would index past the embedding; leave vocab_size out (or null) to take {size}, or give at least {size}"
        )
    if given > size:
        return f"{where}: vocab_size {given} kept, larger than the data's {size} ({origin}): {given - size} unused rows"
    return None


def check_adapter_base(folder: Path) -> None:
    """Refuse a peft adapter folder (``adapter_config.json``) whose base model, named by a path, is gone: transformers
    would hand the path to the hub client ("Repo id must be in the form ..."). An adapter export moved with its
    ``base/`` folder (``lit-prunedpo export --adapter adapter`` of a base without a hub name) says where its base is.

    Raises:
        FileNotFoundError: naming the adapter folder, the recorded base and what to set.
    """
    import json

    from lit_prunedpo.hub import written_as_path

    config = folder / "adapter_config.json"
    if not config.is_file():
        return
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return  # not readable here: the loader says why
    if not isinstance(base, str) or not written_as_path(base) or Path(base).expanduser().exists():
        return
    beside = folder / "base"
    fix = (f"the folder was moved with its base: set it to {beside.resolve()}" if (beside / "config.json").is_file()
           else "set it to the base model's new folder, or its hub name")
    raise FileNotFoundError(f"LoRA adapter folder {folder}: its base model {base} (base_model_name_or_path in "
                            f"{config}) does not exist (moved or deleted?): {fix}")
