"""A token's log-prob as its two terms, computed apart: ``logp_t = z_t - lse_t``.

``z_t`` is the target's logit, one row of the LM head: ``f(h_t . W[y_t] + b[y_t])`` with ``f`` the model's
element-wise logit transform (:mod:`lit_prunedpo.head`: a scale, a soft-cap), ``2d`` FLOPs. ``lse_t`` is the
log-sum-exp of all ``V`` logits, the whole head (``2dV``). The control-variate position samplers
(:mod:`lit_prunedpo.samplers.control_variates`) need ``z_t`` at every executed position and ``lse_t`` at the drawn
ones only; a scorer returns the two as :class:`TokenTerms` and :func:`lit_prunedpo.step.estimate.ipw_sums` weighs them.

Only a head whose logits are a known element-wise map of a plain ``nn.Linear`` has a cheap ``z_t``:
:func:`fused_linear_head` refuses any other (a model whose own forward tail computes the logits, a head module
that transforms its weight, a head sharded by FSDP2), naming the model and why, rather than computing full logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from lit_prunedpo.head import LogitTransform, OutputHead, plain_linear


@dataclass(frozen=True)
class TokenTerms:
    """The two terms of the log-probs of a group's scored positions.

    Attributes:
        target: ``[K]`` float32, ``z_t`` at every scored position (a graph where the forward has one).
        lse: ``[K_s]`` float32, ``lse_t`` at the scored positions the group's ``lse_index`` selects (the drawn ones).
    """

    target: Tensor
    lse: Tensor

    def detach(self) -> "TokenTerms":
        return TokenTerms(self.target.detach(), self.lse.detach())

    def log_probs(self, lse_index: Tensor) -> Tensor:
        """``[K_s]`` the whole log-probs ``z_t - lse_t`` at the positions where both are known."""
        return self.target[lse_index.to(self.target.device)] - self.lse

    def split(self, sizes: Sequence[int], lse_sizes: Sequence[int]) -> list["TokenTerms"]:
        """The terms of consecutive groups: ``sizes[g]`` targets and ``lse_sizes[g]`` log-sum-exps each."""
        return [TokenTerms(t, s) for t, s in zip(self.target.split(list(sizes)), self.lse.split(list(lse_sizes)),
                                                  strict=True)]

    def with_appended(self, extra: Sequence[Tensor]) -> "TokenTerms":
        """The same terms with (empty) tensors appended to the targets: a placeholder forward's output kept in the
        graph that backward runs through (see :meth:`lit_prunedpo.step.execute.StepExecutor.run_policy`)."""
        return TokenTerms(torch.cat([self.target, *extra]), self.lse)


def why_not_fusable(head: OutputHead | nn.Module) -> str | None:
    """Why ``z_t`` cannot be one row of ``head``'s linear layer, as words that follow "its head" (``None``: it can)."""
    if isinstance(head, OutputHead):
        if head.tail is not None:
            return f"is {head.how}"
        linear = head.linear
    else:
        linear = head
    if not plain_linear(linear):
        return f"is a {type(linear).__name__}, not a plain nn.Linear (its forward may transform the weight)"
    if hasattr(linear.weight, "to_local"):
        return "is sharded by FSDP2 (its weight is whole only inside the head's own forward)"
    return None


def linear_head_parts(head: OutputHead | nn.Module) -> tuple[nn.Linear, LogitTransform | None] | None:
    """``(linear, transform)`` of a head whose target logits :func:`target_logits` computes; ``None`` for any other."""
    if why_not_fusable(head) is not None:
        return None
    return (head.linear, head.transform) if isinstance(head, OutputHead) else (head, None)


def fused_linear_head(model: nn.Module, head: OutputHead | nn.Module) -> tuple[nn.Linear, LogitTransform | None]:
    """``(linear, transform)`` of ``model``'s head, whose target logits :func:`target_logits` computes.

    Raises:
        ValueError: naming the model and why, for a head whose logits are not a known element-wise map of a plain
            ``nn.Linear``.
    """
    why = why_not_fusable(head)
    if why is not None:
        raise ValueError(
            f"{type(model).__name__}: ExactTargetLogits and ReferenceLogSumExp compute each target's logit as one row "
            f"of the LM head (h . W[y] + b, then the model's element-wise logit transform), but its head {why}; "
            "computing its full logits at every position would save nothing: use a position sampler without them "
            "(e.g. CoupledStratifiedPositions), or give the estimator fallback: true to use its wrapped sampler alone"
        )
    return (head.linear, head.transform) if isinstance(head, OutputHead) else (head, None)


def target_logits(linear: nn.Linear, transform: LogitTransform | None, hidden: Tensor, targets: Tensor) -> Tensor:
    """``[K]`` float32 ``z_k = f(hidden_k . W[targets_k] + b[targets_k])``: only the targets' rows of the head.

    Computed in float32 (a 16-bit dot product over ``d`` would round more than the matmul of the full head, which
    accumulates in float32); the gradient reaches ``hidden``, the gathered rows of ``W`` and ``b``."""
    rows = linear.weight[targets]
    logits = (hidden.float() * rows.float()).sum(-1)
    if linear.bias is not None:
        logits = logits + linear.bias[targets].float()
    return logits if transform is None else transform(logits)


class _LogSumExp(torch.autograd.Function):
    """``logsumexp`` over the last dimension through the fused log-softmax kernel: ``lse = x_m - log_softmax(x)_m``
    at each row's arg-max ``m`` (where the log-softmax is near 0, so the difference loses nothing), the gradient
    ``softmax(x) * g``. On the CPU ``torch.logsumexp`` makes four passes over ``[K, V]`` forward and three backward;
    this makes two and two (measured 0.7x the time on ``[288, 32768]``). Saves the log-softmax, as ``logsumexp``
    saves its input; no double backward."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor) -> Tensor:
        log_probs = logits.log_softmax(-1)
        top = logits.argmax(-1, keepdim=True)
        ctx.save_for_backward(log_probs)
        return (logits.gather(-1, top) - log_probs.gather(-1, top)).squeeze(-1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (log_probs,) = ctx.saved_tensors
        return log_probs.exp().mul_(grad.unsqueeze(-1))


def log_sum_exp(logits: Tensor) -> Tensor:
    """``[K]`` log-sum-exp of ``[K, V]`` ``logits`` over the vocabulary (:class:`_LogSumExp`)."""
    return _LogSumExp.apply(logits)
