"""The policy a ``PrunedDPO`` trains: built in training mode, its training-time noise off, gradient checkpointing
on when asked; and, at fit start, a warning naming its modules left in eval mode.

``from_pretrained`` returns a model in eval mode, and Lightning keeps modules' modes: a policy left in eval mode
would silently skip gradient checkpointing, which ``transformers`` applies only in training. With
``disable_dropout`` the policy's noise is off (:mod:`lit_prunedpo.dropout`): its dropout fields zeroed, and
every module but the decoder layers kept in eval mode, which is how noise no field controls stays off.

Lightning warns about every module in eval mode at the start of fit; the frozen reference always is, by design.
:class:`EvalModeWarning` replaces that warning with the one that matters: policy modules left in eval mode.
"""

from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from lit_prunedpo.dropout import dropout_free_training, training_switches, turn_off_dropout
from lit_prunedpo.models import ModelSource
from lit_prunedpo.warning_scope import IgnoredWarning


def build_policy(source: ModelSource, disable_dropout: bool, gradient_checkpointing: bool) -> nn.Module:
    """Build the policy from ``source`` in training mode, with its noise off (``disable_dropout``) and its
    activations recomputed in backward (``gradient_checkpointing``, non-reentrant)."""
    policy = source.build().train()
    if disable_dropout:
        turn_off_dropout(policy)
        dropout_free_training(policy)
    if gradient_checkpointing:
        # transformers 5 renamed it (the old name warns at every run); transformers 4 has only the old one
        enable = getattr(policy, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return policy


def modules_in_eval_mode(policy: nn.Module, disable_dropout: bool) -> list[str]:
    """The policy's modules in eval mode at the start of training (``"policy"`` for the policy itself), leaving
    out those ``disable_dropout`` keeps in eval mode on purpose (their noise stays off that way); the policy's
    noise is first turned off again, whatever changed its modes since it was built."""
    modules = policy.named_modules()
    if disable_dropout:
        dropout_free_training(policy)
        modules = training_switches(policy)
    return [name or "policy" for name, m in modules if not m.training]


class EvalModeWarning:
    """Lightning's warning about modules in eval mode, replaced by one about the policy's: :meth:`open` at fit start
    warns about the policy's and ignores Lightning's, which comes just before ``on_train_start``, where
    :meth:`close` ends the scope (``teardown`` closes it too, for a fit that stops before)."""

    def __init__(self) -> None:
        self._lightning = IgnoredWarning(r"Found \d+ module\(s\) in eval mode at the start of training")

    def open(self, policy: nn.Module, disable_dropout: bool) -> None:
        self._lightning.open()
        frozen = modules_in_eval_mode(policy, disable_dropout)
        if frozen:
            rank_zero_warn(f"{len(frozen)} policy module(s) are in eval mode at the start of training, "
                           f"e.g. {frozen[:3]}")

    def close(self) -> None:
        self._lightning.close()
