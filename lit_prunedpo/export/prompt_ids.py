"""The prompt ids an exported tokenizer gives, held to the ones training gave the model.

Training puts the tokenizer's BOS before every prompt unless the data module had ``add_bos=False`` (read from the
checkpoint's data-module hyperparameters) and adds no EOS. :func:`match_plain_call` sets the tokenizer's own
``add_bos_token`` / ``add_eos_token`` switches to match, where it has them; :func:`prompt_inputs` checks the saved
and reloaded tokenizer's plain call ``tok(prompt)`` against the training function on sample prompts and, where no
switch can make them agree (ByT5's tokenizer always appends EOS), says how to build the ids instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["PROBE_PROMPTS", "match_plain_call", "prompt_inputs", "trained_with_bos", "training_prompt_ids"]


def trained_with_bos(meta: dict[str, Any]) -> bool:
    """Whether training put BOS before every prompt: the data module's ``add_bos`` as the checkpoint saved it
    (``PreferenceDataModule``'s default, ``True``, for a checkpoint without it)."""
    return bool((meta.get("datamodule_hyper_parameters") or {}).get("add_bos", True))


#: Prompts the exported tokenizer's plain call is checked on: plain text, and an HH-RLHF style turn.
PROBE_PROMPTS = ("Hello, world", "\n\nHuman: What is 2 + 2?\n\nAssistant:")


def training_prompt_ids(tokenizer: Any, text: str, add_bos: bool) -> list[int]:
    """The ids training gives the prompt ``text`` (short of truncation): the data module's own tokenization
    (``add_special_tokens=False``) and layout (:func:`lit_prunedpo.data.tokenize.build_pair_ids`)."""
    from lit_prunedpo.data.tokenize import build_pair_ids, prompt_fallback_id

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    room = len(ids) + 2  # nothing cut: the prompt, its BOS, one response token
    return build_pair_ids(ids, [0], [1], max_length=room + 1, max_prompt_length=room, bos_id=tokenizer.bos_token_id,
                          eos_id=None, fallback_id=prompt_fallback_id(tokenizer), add_bos=add_bos).prompt_ids


def match_plain_call(tokenizer: Any, add_bos: bool) -> list[str]:
    """Set the tokenizer's own switches (``add_bos_token``, ``add_eos_token``, where its class has them) so that
    its plain call adds BOS exactly when training did and never EOS (GPT-2's adds no BOS, Llama's does); returns
    one ``"name: old -> new"`` per switch changed. Whether the saved tokenizer obeys is :func:`prompt_inputs`'s
    question."""
    changes = []
    for name, wanted in (("add_bos_token", add_bos and tokenizer.bos_token_id is not None), ("add_eos_token", False)):
        old = getattr(tokenizer, name, None)
        if old is None or bool(old) == wanted:
            continue
        try:
            setattr(tokenizer, name, wanted)
        except (AttributeError, TypeError, ValueError):  # a read-only or unsupported switch: prompt_inputs says so
            continue
        changes.append(f"{name}: {old} -> {wanted}")
    return changes


def prompt_inputs(tokenizer: Any, folder: Path, add_bos: bool) -> dict[str, Any]:
    """How to build prompt ids from the tokenizer saved in ``folder`` so that they are the ones training made:
    ``{"add_bos", "bos_token_id", "plain_call", "build"}``, where ``plain_call`` says whether the reloaded
    tokenizer's ``tok(prompt)`` gives them (checked on :data:`PROBE_PROMPTS` against :func:`training_prompt_ids`
    of ``tokenizer``, the one training used) and ``build`` is the expression that does."""
    from transformers import AutoTokenizer

    expected = {text: training_prompt_ids(tokenizer, text, add_bos) for text in PROBE_PROMPTS}
    try:
        reloaded = AutoTokenizer.from_pretrained(folder)
        got = {text: reloaded(text)["input_ids"] for text in PROBE_PROMPTS}
    except Exception as err:  # noqa: BLE001 - any failure means the plain call cannot be vouched for
        got = {text: f"{type(err).__name__}: {err}" for text in PROBE_PROMPTS}
    bos = tokenizer.bos_token_id if add_bos else None
    plain = got == expected
    if plain:
        build = "tok(prompt).input_ids"
    else:
        build = (f"[{bos}] + " if bos is not None else "") + "tok(prompt, add_special_tokens=False).input_ids"
    text = PROBE_PROMPTS[0]
    return {"add_bos": add_bos, "bos_token_id": bos, "plain_call": plain, "build": build,
            "example": {"prompt": text, "training": expected[text], "plain_call": got[text]}}
