"""Refusals at the edges of a run: data whose tokenizer has more tokens than the model's embedding, data longer
than the model's position table, weights that are not finite, a sampler of the wrong kind, and a control-variate
position sampler that cannot run with the run's model or reference.

Each would otherwise fail far from its cause: a token id past the embedding or a sequence past a learned position
table is an ``IndexError: index out of range in self`` inside the embedding; a checkpoint of NaN weights is a file
that looks like any other until someone resumes or evaluates from it; a sampler of the wrong kind fails inside the
first step's plan. :class:`~lit_prunedpo.module.PrunedDPO` calls :func:`check_setup` at set-up (the data
against the model, and a warning when a 16-bit precision would run slowly on this CPU),
:func:`refuse_nonfinite_weights` in ``on_save_checkpoint``, so every save (``ModelCheckpoint``, the preemption
checkpoint, ``trainer.save_checkpoint``) is covered, and
:func:`check_sampler_kinds` in ``use_samplers``. :func:`check_log_softmax_split` runs at set-up too, so that a run
that cannot work stops before its first step, and whenever ``use_samplers`` brings in a position sampler after it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from lit_prunedpo.cpu_16bit import warn_if_slow_16bit
from lit_prunedpo.samplers import BranchSampler, LogSoftmaxSplit, PositionSampler, PrefixSampler
from lit_prunedpo.samplers.control_variates import described
from lit_prunedpo.scoring import model_head
from lit_prunedpo.token_terms import fused_linear_head, why_not_fusable


def check_setup(policy: nn.Module, datamodule: Any, trainer: Any) -> None:
    """What set-up checks before a run: the data's vocabulary and lengths against the policy (refusals), and a
    16-bit precision on a CPU that runs it slowly (:func:`~lit_prunedpo.cpu_16bit.warn_if_slow_16bit`)."""
    check_data_vocabulary(policy, datamodule)
    check_positions(policy, datamodule)
    warn_if_slow_16bit(trainer)


def check_data_vocabulary(policy: nn.Module, datamodule: Any) -> None:
    """Refuse a data module whose tokenizer (``vocab_size``) has more tokens than the policy's input embedding.

    Raises:
        ValueError: naming both numbers and the config field to change.
    """
    data_vocab = getattr(datamodule, "vocab_size", None)
    model_vocab = policy.get_input_embeddings().num_embeddings
    if data_vocab is not None and data_vocab > model_vocab:
        raise ValueError(
            f"the data's tokenizer has {data_vocab} tokens but the policy's embedding has {model_vocab}: "
            "set the model config's vocab_size to at least the tokenizer's"
        )


def check_positions(policy: nn.Module, datamodule: Any) -> None:
    """Refuse a data module whose ``max_length`` is beyond the policy's ``max_position_embeddings``.

    Raises:
        ValueError: naming both numbers and the argument to change.
    """
    max_length = getattr(datamodule, "max_length", None)
    positions = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    if isinstance(max_length, int) and isinstance(positions, int) and max_length > positions:
        raise ValueError(
            f"data.init_args.max_length is {max_length} but the policy has {positions} positions "
            f"(config.max_position_embeddings): a prompt plus response of up to {max_length} tokens would run past "
            f"them. Set data.init_args.max_length to at most {positions}, or use a model with a longer context"
        )


def refuse_nonfinite_weights(checkpoint: dict[str, Any], step: int) -> None:
    """Raise instead of letting a checkpoint with NaN/Inf weights be written.

    Under a sharded strategy each rank checks its own shards (``DTensor.to_local``).

    Raises:
        FloatingPointError: naming the step and the first tensors at fault.
    """
    bad = []
    for name, tensor in checkpoint.get("state_dict", {}).items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if not bool(torch.isfinite(local).all()):
            bad.append(name)
    if bad:
        raise FloatingPointError(
            f"refusing to save a checkpoint at step {step}: {len(bad)} weight tensors hold NaN or Inf (e.g. "
            f"{', '.join(bad[:3])}). The run diverged; resume from an earlier checkpoint with a lower learning rate"
        )


#: a step's samplers, in the order its plan takes them: the argument that names each, and the class it must be
SAMPLER_KINDS = (("prefix", PrefixSampler), ("position", PositionSampler), ("branch", BranchSampler))


def check_sampler_kinds(where: str, prefix: Any, position: Any, branch: Any) -> None:
    """Refuse a sampler of the wrong kind given to ``where`` (``None``: that sampler is not given).

    Raises:
        TypeError: naming ``where``, the argument, the class it must be and the class it is.
    """
    for (name, kind), sampler in zip(SAMPLER_KINDS, (prefix, position, branch)):
        if sampler is None or isinstance(sampler, kind):
            continue
        if isinstance(sampler, type):  # the class, not a sampler: type(...) would name its metaclass, ABCMeta
            fix = f": pass an instance, {sampler.__name__}(...)" if issubclass(sampler, kind) else ""
            raise TypeError(f"{where}: {name} must be a {kind.__name__}, got the class {sampler.__name__} itself{fix}")
        raise TypeError(f"{where}: {name} must be a {kind.__name__}, got {type(sampler).__name__}")


def refusing_setter(name: str) -> Callable[[object, object], None]:
    """The setter of ``PrunedDPO.<name>_sampler``: refuses, pointing at ``use_samplers``, the one way to change a
    sampler (it checks it); ``prefix_sampler = prefix_sampler.setter(refusing_setter("prefix"))``."""
    def refuse(module: object, sampler: object) -> None:
        raise AttributeError(f"{type(module).__name__}.{name}_sampler cannot be assigned: call "
                             f"use_samplers({name}=...), which checks the sampler and changes it for the next steps")
    return refuse


def check_log_softmax_split(position: PositionSampler, policy: nn.Module, reference: Any) -> None:
    """Refuse a position sampler that splits the log-softmax (:mod:`lit_prunedpo.samplers.control_variates`) where
    it cannot run: a policy whose head is not a plain linear one, and, for ``ReferenceLogSumExp``, a reference source
    without the reference's log-sum-exps (``reference.check_token_lse()``: anything but a cache that stores them).
    Any other sampler passes.

    Raises:
        ValueError: naming the model and why, or the reference and the fix.
    """
    if not isinstance(position, LogSoftmaxSplit):
        return
    fused_linear_head(policy, model_head(policy))
    if position.uses_reference_lse:
        reference.check_token_lse()


def usable_position_sampler(position: PositionSampler, policy: nn.Module, reference: Any) -> PositionSampler:
    """The position sampler a run can use: ``position`` itself once :func:`check_log_softmax_split` passes it, or,
    for a sampler that splits the log-softmax with ``fallback`` set, on a head that cannot give one row (its forward
    computes the logits, a head sharded by FSDP2), the sampler it wraps, with a warning naming the model and why:
    the drawn positions scored whole, unbiased, with the wrapped sampler's gradient noise.

    Raises:
        ValueError: as :func:`check_log_softmax_split`, for a sampler without ``fallback``.
    """
    if isinstance(position, LogSoftmaxSplit) and position.fallback:
        why = why_not_fusable(model_head(policy))
        if why is not None:
            rank_zero_warn(
                f"{type(policy).__name__}: its LM head {why}, so {type(position).__name__} cannot compute each "
                f"target's logit as one row; with fallback=True it scores the drawn positions whole instead "
                f"({described(position.positions)}: unbiased, the same head saving, more gradient noise)"
            )
            return position.positions
    check_log_softmax_split(position, policy, reference)
    return position
