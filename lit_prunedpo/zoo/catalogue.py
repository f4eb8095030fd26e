"""The architectures transformers knows: every ``model_type`` of its causal-LM auto mapping, the classes and config
of each, and why a type is not a decoder-only text model (:class:`Unbuildable`, with a one-line reason).

Everything here reads transformers' classes only: no model is built (:mod:`lit_prunedpo.zoo.build` builds them).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Unbuildable:
    """Why a model type is left out of the zoo."""

    model_type: str
    reason: str  # one line


class UnbuildableError(Exception):
    """A model type that cannot be built tiny; ``.unbuildable`` says why."""

    def __init__(self, unbuildable: Unbuildable) -> None:
        super().__init__(f"{unbuildable.model_type}: {unbuildable.reason}")
        self.unbuildable = unbuildable


#: Forward arguments that mark a multimodal causal-LM class (image, video or audio inputs).
MEDIA_INPUTS = ("pixel_values", "image_patches", "image_pixel_values", "pixel_values_videos", "input_features",
                "audio_input_features", "input_values")


def causal_lm_types() -> list[str]:
    """Every ``model_type`` of transformers' causal-LM auto mapping, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def causal_lm_class_name(model_type: str) -> str:
    """The name of ``model_type``'s causal-LM class (``LlamaForCausalLM``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]


def config_class(model_type: str) -> type:
    """``model_type``'s config class."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence transformers' logger and Python warnings while configs and models are built."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


def static_reason(model_type: str) -> str | None:
    """Why ``model_type`` is not decoder-only text, from its classes alone (``None``: nothing found)."""
    import transformers

    name = causal_lm_class_name(model_type)
    model_cls = getattr(transformers, name, None)
    if model_cls is None:
        return f"transformers has no class {name}"
    params = inspect.signature(model_cls.forward).parameters
    media = [p for p in MEDIA_INPUTS if p in params]
    if media:
        return f"multimodal: {name} takes {media[0]}"
    if "shared_kv_states" in params:
        return f"speculative-decoding assistant: {name} needs its main model's shared_kv_states"
    with quiet():
        try:
            default = config_class(model_type)()
        except Exception as err:  # noqa: BLE001 - reported as the reason
            return exception_reason("its default config", err)
    if getattr(default, "is_encoder_decoder", False):
        return f"encoder-decoder: {name} is its decoder half"
    return None


def exception_reason(what: str, err: BaseException) -> str:
    """An exception transformers raised building ``what``, as an :class:`Unbuildable` reason (one line, 300
    characters at most)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if first.endswith(":") and len(lines) > 1:  # a validation error names the validator, then the error
        first = f"{first} {lines[1]}"
    return f"transformers raised {type(err).__name__} building {what}: {first}"[:300]
