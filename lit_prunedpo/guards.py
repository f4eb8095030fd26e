"""Refusals at the edges of a run: data longer than the model's position table, weights that are not finite, and a
control-variate position sampler that cannot run with the run's model or reference.

The first two would otherwise fail far from their cause: a sequence past a learned position table is an
``IndexError: index out of range in self`` inside the embedding; a checkpoint of NaN weights is a file that
looks like any other until someone resumes or evaluates from it. :class:`~lit_prunedpo.module.PrunedDPO`
calls :func:`check_positions` at set-up and :func:`refuse_nonfinite_weights` in ``on_save_checkpoint``, so
every save (``ModelCheckpoint``, the preemption checkpoint, ``trainer.save_checkpoint``) is covered. The third,
:func:`check_log_softmax_split`, runs at set-up too, so that a run that cannot work stops before its first step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lit_prunedpo.samplers import LogSoftmaxSplit, PositionSampler
from lit_prunedpo.scoring import model_head
from lit_prunedpo.token_terms import fused_linear_head


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
