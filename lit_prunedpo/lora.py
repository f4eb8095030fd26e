"""LoRA through ``peft``: a policy source that wraps any other source with adapters, and the helpers that let
the rest of the package treat the base model as the reference.

With a LoRA policy the reference is the policy with its adapters switched off (what TRL, OpenRLHF and
torchtune do): ``OnlineReference`` with no model of its own scores ``policy`` under
:func:`adapters_off` instead of copying it, so the weights exist once. The reference holds the policy outside
its module tree (no duplicate parameters in ``state_dict``, the optimizer or FSDP). The cached reference
computes its log-probs under :func:`adapters_off` too.

Only the adapters train (peft freezes the base), so only they reach the optimizer; ``PrunedDPO`` leaves the
frozen base weights out of single-file checkpoints (:func:`drop_frozen`) and puts them back from the freshly
built base on resume (:func:`restore_base`). Under FSDP2 the sharded checkpoint keeps them: Lightning's
sharded loader asks the files for every key of the model. Since a single-file checkpoint names its base only by
its source (a path, a seed), :meth:`LoRA.build` takes a digest of the base's weights, the checkpoint stores it,
and a resume or an export that takes the base from its source refuses one with other weights (a base folder
replaced by another model of the same architecture would otherwise be used silently). A base folder that is gone
(moved or deleted since training) is refused by :func:`check_base_folder` before anything is loaded, naming the
folder, where it was named (the config's argument, or the checkpoint) and the option that names the new place:
:meth:`LoRA.build` checks it (so a fresh ``fit`` and a resume with ``fit --ckpt_path`` refuse it at model
construction), and so does ``lit-prunedpo export`` (whose ``--base_model`` replaces the recorded base).

Requires the ``lora`` extra: ``pip install "lit-prunedpo[lora]"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Iterator, Mapping

from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from lit_prunedpo.fingerprint import tensors_digest
from lit_prunedpo.hub import written_as_path
from lit_prunedpo.models import ModelSource

__all__ = ["LoRA", "adapters_off", "base_folder_name", "base_weights_digest", "check_base", "check_base_folder",
           "drop_frozen", "is_peft_model", "load_adapter_state", "restore_base", "restore_frozen"]

#: Where a LoRA config names its base's folder, and how to name another one, for the messages of a gone folder.
BASE_ARGUMENT = "model.policy.init_args.base.init_args.name_or_path"


def _peft() -> Any:
    try:
        import peft
    except ImportError as err:  # pragma: no cover - the test extra installs peft
        raise ImportError("LoRA needs peft: pip install 'lit-prunedpo[lora]'") from err
    return peft


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (without importing peft when it is not installed)."""
    return any(cls.__name__ == "PeftModel" and cls.__module__.startswith("peft") for cls in type(model).__mro__)


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` as its base model: peft's ``disable_adapter()`` for a peft model, nothing otherwise.

    The model is also put in eval mode for the duration (the reference never uses dropout), then restored.
    """
    if not is_peft_model(model):
        yield model
        return
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with model.disable_adapter():
            yield model
    finally:
        for module, mode in modes.items():
            module.training = mode


class LoRA(ModelSource):
    """A policy with LoRA adapters (``peft.LoraConfig``) on a base model from any other source.

    Args:
        base: where the base model comes from (``Pretrained`` for a real model, ``FromConfig`` in tests).
        r: adapter rank.
        alpha: scaling numerator (``lora_alpha``; the update is scaled by ``alpha / r``).
        dropout: dropout on the adapter input (``lora_dropout``); note ``PrunedDPO(disable_dropout=True)``, the
            default, sets every dropout of the policy to 0, this one included.
        target_modules: module names (or ``all-linear``) that get adapters; ``None``: peft's default for the
            model type (the attention projections for Llama).
        options: any other ``peft.LoraConfig`` field, e.g. ``{use_rslora: true, modules_to_save: [lm_head]}``.

    Raises:
        ValueError: on a non-positive ``r`` or ``alpha`` or a ``dropout`` outside [0, 1).
    """

    def __init__(
        self,
        base: ModelSource,
        r: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: list[str] | str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if not (isinstance(r, int) and r >= 1):
            raise ValueError(f"LoRA: r must be an int >= 1, got {r!r}")
        if not alpha > 0:
            raise ValueError(f"LoRA: alpha must be > 0, got {alpha!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"LoRA: dropout must be in [0, 1), got {dropout!r}")
        self.base = base
        self.r, self.alpha, self.dropout = r, float(alpha), float(dropout)
        self.target_modules = target_modules
        self.options = dict(options or {})
        self.base_digest: str | None = None  # of the last base built (see base_weights_digest)

    def lora_config(self) -> Any:
        peft = _peft()
        known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
        unknown = sorted(set(self.options) - known)
        if unknown:
            raise ValueError(f"LoRA: options {unknown} are not peft.LoraConfig fields")
        return peft.LoraConfig(
            task_type="CAUSAL_LM", r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=self.target_modules, **self.options,
        )

    def build(self) -> nn.Module:
        # Before the base's own loader, which would take a gone folder's path for a malformed hub name.
        check_base_folder(self.base_spec(), f"the config ({BASE_ARGUMENT})", f"pass --{BASE_ARGUMENT}=<new path>")
        base = self.base.build()
        self.base_digest = base_weights_digest(base, self.base_spec())
        return _peft().get_peft_model(base, self.lora_config())

    def base_spec(self) -> dict[str, Any] | None:
        """The base source's spec (see :meth:`ModelSource.spec`): an export rebuilds the frozen base from it."""
        return self.base.spec()


def describe_base(spec: Mapping[str, Any] | None) -> str:
    """A base model's source in a few words: its path or hub name, else its class and arguments."""
    if spec is None:
        return "(source unknown)"
    args = dict(spec.get("init_args") or {})
    if "name_or_path" in args:
        return repr(args["name_or_path"])
    shown = ", ".join(f"{k}={v!r}" for k, v in args.items() if k != "config")
    return f"{str(spec.get('class_path', '?')).rpartition('.')[2]}({shown})"


def base_folder_name(spec: Mapping[str, Any] | None) -> str | None:
    """The folder or hub name a base's source spec loads from (``Pretrained``'s ``name_or_path``), else ``None``."""
    name = dict((spec or {}).get("init_args") or {}).get("name_or_path")
    return name if isinstance(name, str) else None


def check_base_folder(spec: Mapping[str, Any] | None, named_in: str, fix: str, recorded: str | None = None) -> None:
    """Refuse a base whose source names a local folder that does not exist (moved or deleted since training).

    A name counts as a folder when it is written as a path (:func:`lit_prunedpo.hub.written_as_path`) or when
    ``recorded`` (the folder's absolute path at training time, :func:`lit_prunedpo.export.policy_metadata`) says
    it was one; any other missing name is left to the loader as a hub name.

    Args:
        spec: the base source's spec (``{"class_path", "init_args"}``).
        named_in: where the name comes from, for the message (``checkpoint PATH``, the config's argument).
        fix: what to do, for the message (the option that names the new place).
        recorded: the folder's absolute path when the checkpoint was written, if known.

    Raises:
        FileNotFoundError: ``the LoRA base model folder NAME named in NAMED_IN does not exist (moved or deleted?):
            FIX``, on one line.
    """
    name = base_folder_name(spec)
    if name is None or Path(name).expanduser().exists() or not (recorded or written_as_path(name)):
        return
    shown = name if recorded in (None, name) else f"{name} ({recorded} when trained)"
    raise FileNotFoundError(f"the LoRA base model folder {shown} named in {named_in} does not exist (moved or "
                            f"deleted?): {fix}")


def base_weights_digest(base: nn.Module, spec: Mapping[str, Any] | None) -> str:
    """SHA-256 of a base model's weights as its source built them (before peft wraps it), logged with its cost."""
    return tensors_digest(base.state_dict(), f"the LoRA base {describe_base(spec)}")


def check_base(policy_info: Mapping[str, Any], digest: str | None, where: str) -> None:
    """Refuse a base model whose weights' digest is not the one a LoRA checkpoint recorded (``policy_info``: the
    checkpoint's ``"policy"`` metadata); warn when either digest is unknown (a checkpoint written before digests
    were stored).

    Raises:
        ValueError: naming ``where``, the base's source and both digests.
    """
    base = describe_base(policy_info.get("base"))
    saved = policy_info.get("base_digest")
    if saved is None or digest is None:
        rank_zero_warn(f"{where}: cannot check that the LoRA base {base} is the model its adapters were trained on "
                       f"(no digest of the base's weights {'in the checkpoint' if saved is None else 'for the base'})")
        return
    if saved != digest:
        raise ValueError(
            f"{where}: the LoRA base {base} is not the model the adapters were trained on: its weights' sha256 is "
            f"{digest}, the checkpoint was trained on {saved} (was the base replaced or changed?): restore the "
            "original base, or train new adapters on this one"
        )


def load_adapter_state(
    base: nn.Module, peft_config: Mapping[str, Any], state: Mapping[str, Tensor], where: str,
    policy_info: Mapping[str, Any] | None = None,
) -> nn.Module:
    """``base`` wrapped with the adapters described by ``peft_config`` (a ``LoraConfig.to_dict()``), loaded from
    ``state`` (keys as in the policy's ``state_dict``). Every trainable key must be in ``state``; keys it lacks
    may only be frozen base weights (which ``base`` already holds). When it lacks them and ``policy_info`` (the
    checkpoint's ``"policy"`` metadata) is given, ``base`` must have the weights the checkpoint recorded.

    Raises:
        ValueError: naming ``where`` when adapter weights are missing, ``state`` has keys the model lacks, or
            ``base`` is not the base the adapters were trained on.
    """
    peft = _peft()
    digest = None if policy_info is None else base_weights_digest(base, policy_info.get("base"))
    known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    # base_model_name_or_path left out: get_peft_model sets it from ``base`` itself (warning when a moved base's new
    # folder differs from the recorded one, which is the point of loading it from there)
    config = peft.LoraConfig(**{k: v for k, v in peft_config.items() if k in known and k != "base_model_name_or_path"})
    model = peft.get_peft_model(base, config)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    result = model.load_state_dict(dict(state), strict=False)
    missing = sorted(set(result.missing_keys) & trainable)
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{where}: the LoRA state does not match the model: missing adapter weights {missing[:4]}, "
            f"unexpected keys {list(result.unexpected_keys)[:4]}"
        )
    if policy_info is not None and set(result.missing_keys) - trainable:  # the base weights come from ``base``
        check_base(policy_info, digest, where)
    return model


def frozen_keys(module: nn.Module, prefix: str) -> set[str]:
    """``state_dict`` keys of ``module``'s frozen parameters and buffers, with ``prefix`` in front."""
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    return {prefix + k for k in module.state_dict() if k not in trainable}


def drop_frozen(state_dict: dict[str, Any], policy: nn.Module, prefix: str = "policy.") -> list[str]:
    """Remove the frozen base weights of a peft ``policy`` from a module ``state_dict``; returns the keys removed."""
    keys = sorted(frozen_keys(policy, prefix) & set(state_dict))
    for key in keys:
        del state_dict[key]
    return keys


def restore_base(checkpoint: dict[str, Any], policy: nn.Module, source: Any, where: str | None = None) -> list[str]:
    """On resume: put back the frozen base weights a single-file LoRA checkpoint leaves out (:func:`restore_frozen`),
    after checking that ``source`` (the policy's ``LoRA`` source) built the base the checkpoint was trained on;
    returns the keys put back. Does nothing for a policy without adapters or a checkpoint without
    ``state_dict`` (FSDP2's sharded load fills the model itself).

    Raises:
        ValueError: naming the checkpoint (``where``), the base's source and both digests, on another base.
    """
    if not is_peft_model(policy) or "state_dict" not in checkpoint:
        return []
    if frozen_keys(policy, "policy.") - set(checkpoint["state_dict"]):
        where = f"checkpoint {where}" if where else "the checkpoint resumed"
        check_base(checkpoint.get("policy") or {}, getattr(source, "base_digest", None), where)
    return restore_frozen(checkpoint["state_dict"], policy)


def restore_frozen(state_dict: dict[str, Any], policy: nn.Module, prefix: str = "policy.") -> list[str]:
    """Put back the frozen base weights :func:`drop_frozen` removed, from ``policy`` as built (the base source's
    weights); returns the keys put back."""
    current = policy.state_dict()
    missing = sorted(k for k in frozen_keys(policy, prefix) if k not in state_dict)
    for key in missing:
        state_dict[key] = current[key[len(prefix):]]
    return missing
