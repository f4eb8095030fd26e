"""A memory-efficient :class:`~lit_prunedpo.scoring.TokenScorer`: exact log-probs without the ``K x V`` logits.

The plain scorer projects all ``K`` gathered hidden states at once: the ``[K, V]`` logits, their log-softmax
(kept for backward) and, in backward, their gradient all live together, which dominates peak memory for
large vocabularies. :class:`ChunkedScorer` walks over ``chunk_size`` rows at a time:

* forward keeps only the hidden states, the targets and one log-sum-exp per row;
* backward recomputes each chunk's logits and forms ``d logp / d logits = onehot(target) - softmax``
  scaled by the incoming gradient, then ``grad_hidden = G @ W``, ``grad_W += G^T @ h`` (``grad_b += sum G``).

Peak memory of the head is then ``O(chunk_size * V)`` instead of ``O(K * V)``, at the price of one more head
forward (the recomputation) in backward. Values and gradients equal the plain scorer's up to float rounding.

Select it for any mode in a config::

    model:
      scorer:
        class_path: lit_prunedpo.chunked_scorer.ChunkedScorer
        init_args: {chunk_size: 256}

For a control-variate step (:mod:`lit_prunedpo.samplers.control_variates`) the log-sum-exps of the drawn positions
are computed the same way (:meth:`ChunkedScorer.log_sum_exp`: forward keeps one number per row, backward recomputes
``softmax`` per chunk), the target logits one row of the head each, as in the plain scorer.

The model's element-wise logit transform (:mod:`lit_prunedpo.head`: a scale, a soft-cap) is fused: backward
multiplies by its derivative. Heads that are not an ``nn.Linear`` with such a transform (a model whose own
forward tail computes the logits) fall back to ``torch.utils.checkpoint`` per chunk (same memory bound,
autograd does the recomputation).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.checkpoint import checkpoint

from lit_prunedpo.head import LogitTransform, OutputHead, plain_linear
from lit_prunedpo.scoring import TokenScorer, token_stats
from lit_prunedpo.token_terms import linear_head_parts

__all__ = ["ChunkedScorer"]


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None,
                  transform: LogitTransform | None = None) -> Tensor:
    # Same numerics as the plain scorer: the head and the model's transform in its own dtype, then upcast.
    logits = F.linear(hidden, weight, bias)
    return (logits if transform is None else transform(logits)).float()


def _chunked_forward(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, chunk_size: int,
    stats: list[Tensor] | None = None, transform: LogitTransform | None = None,
) -> tuple[Tensor, Tensor]:
    """``(log_probs [K], logsumexp [K])`` in float32, one chunk of rows at a time; with ``stats``, appends each
    chunk's :func:`~lit_prunedpo.scoring.token_stats` (from the chunk's logits, before they are overwritten)."""
    K = hidden.shape[0]
    logps = torch.empty(K, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(K, dtype=torch.float32, device=hidden.device)
    for start in range(0, K, chunk_size):
        stop = min(start + chunk_size, K)
        logits = _chunk_logits(hidden[start:stop], weight, bias, transform)
        target_logit = logits.gather(-1, targets[start:stop, None]).squeeze(-1)
        if stats is not None:
            stats.append(token_stats(logits, targets[start:stop]))
        # logsumexp in place on the chunk's logits (torch.logsumexp would allocate a second chunk-sized tensor).
        peak = logits.amax(-1)
        chunk_lse = logits.sub_(peak[:, None]).exp_().sum(-1).log_().add_(peak)
        del logits
        lse[start:stop] = chunk_lse
        logps[start:stop] = target_logit - chunk_lse
    return logps, lse


class _ChunkedLinearLogProb(torch.autograd.Function):
    """``log_softmax(f(hidden @ W^T + b))[k, targets[k]]`` (``f`` the model's element-wise logit transform, identity
    by default) with the logits recomputed chunk by chunk in backward; with ``lse_only``, the log-sum-exp
    ``logsumexp(f(hidden @ W^T + b))[k]`` instead (the term a control-variate step samples; ``targets`` then only
    feed the statistics)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, chunk_size: int,
        stats: list[Tensor] | None = None, transform: LogitTransform | None = None, lse_only: bool = False,
    ) -> Tensor:
        logps, lse = _chunked_forward(hidden, weight, bias, targets, chunk_size, stats, transform)
        ctx.chunk_size = chunk_size
        ctx.transform = transform
        ctx.has_bias = bias is not None
        ctx.lse_only = lse_only
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        # a copy: a caller changing the output in place must not change the lse that backward reads
        return lse.clone() if lse_only else logps

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = (ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                                  ctx.has_bias and ctx.needs_input_grad[2])
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulate over chunks in float32 (bf16 weights would lose low bits chunk after chunk).
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        K, chunk_size = hidden.shape[0], ctx.chunk_size
        grad_out = grad_out.float()
        for start in range(0, K, chunk_size):
            stop = min(start + chunk_size, K)
            h, g = hidden[start:stop], grad_out[start:stop]
            # d logp_k / d z_k = onehot(target_k) - softmax(z_k), z = f(l); built in place on the recomputed logits,
            # then times f'(l) for the head's own output l. d lse_k / d z_k = softmax(z_k): no one-hot, the other sign.
            raw = F.linear(h, weight, bias) if ctx.transform is not None else None
            z = _chunk_logits(h, weight, bias) if raw is None else ctx.transform(raw).float()
            grad_logits = z.sub_(lse[start:stop, None]).exp_().mul_(g[:, None] if ctx.lse_only else -g[:, None])
            if not ctx.lse_only:
                grad_logits.scatter_add_(-1, targets[start:stop, None], g[:, None])
            if raw is not None:
                grad_logits.mul_(ctx.transform.derivative(raw).float())
                del raw
            grad_logits = grad_logits.to(weight.dtype)
            if grad_h is not None:
                grad_h[start:stop] = grad_logits @ weight
            if grad_w is not None:
                grad_w.addmm_(grad_logits.t().float(), h.float())  # .float() is free for float32
            if grad_b is not None:
                grad_b += grad_logits.float().sum(0)
            del grad_logits
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(weight.dtype) if grad_b is not None else None,
            None,
            None,
            None,
            None,
            None,
        )


class ChunkedScorer(TokenScorer):
    """Exact per-token log-probs with the LM head applied ``chunk_size`` rows at a time, recomputed in backward.

    When it helps: only when one forward scores more than ``chunk_size`` positions (``K``, e.g. 2 x batch x
    response length without position pruning). With ``K <= chunk_size`` the head runs in one chunk, saves
    nothing and still pays the recomputation, so the default sizes the chunk from each forward instead:
    ``ceil(K / num_chunks)`` rows, i.e. ``num_chunks`` times less head memory whatever the batch. A fixed
    ``chunk_size`` that covers a whole gradient forward is reported once (``rank_zero_warn``).

    Args:
        chunk_size: rows of gathered hidden states projected at once; peak head memory is about
            ``3 * chunk_size * V`` floats instead of ``3 * K * V``. ``None`` (default): from ``num_chunks``.
        num_chunks: with ``chunk_size=None``, how many chunks each forward's ``K`` rows are split into.

    Raises:
        ValueError: if ``chunk_size`` or ``num_chunks`` is < 1.
    """

    def __init__(self, chunk_size: int | None = None, num_chunks: int = 8) -> None:
        if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
            raise ValueError(f"chunk_size must be None or an integer >= 1, got {chunk_size!r}")
        if int(num_chunks) != num_chunks or num_chunks < 1:
            raise ValueError(f"num_chunks must be an integer >= 1, got {num_chunks!r}")
        self.fixed_chunk_size = None if chunk_size is None else int(chunk_size)
        self.num_chunks = int(num_chunks)
        self._warned = False

    @property
    def chunk_size(self) -> int | None:
        """The fixed chunk size, or ``None`` when sized from each forward."""
        return self.fixed_chunk_size

    def rows_per_chunk(self, num_rows: int) -> int:
        """The chunk size used for a forward scoring ``num_rows`` positions."""
        if self.fixed_chunk_size is None:
            return max(1, -(-num_rows // self.num_chunks))
        if num_rows <= self.fixed_chunk_size and torch.is_grad_enabled() and num_rows > 1 and not self._warned:
            self._warned = True
            rank_zero_warn(
                f"ChunkedScorer(chunk_size={self.fixed_chunk_size}) scores {num_rows} positions in one chunk: no head "
                "memory is saved and backward recomputes the head; use a smaller chunk_size or chunk_size=null"
            )
        return self.fixed_chunk_size

    def log_probs(self, head: OutputHead | nn.Module, hidden: Tensor, targets: Tensor,
                  stats: list[Tensor] | None = None) -> Tensor:
        """``[K]`` float32 log-probabilities of ``targets`` from gathered hidden states ``[K, d]``; with ``stats``,
        appends each chunk's token statistics, computed on the chunk's logits in the forward (never in the
        backward's recomputation)."""
        chunk = self.rows_per_chunk(hidden.shape[0])
        fused = (head, None) if plain_linear(head) else (
            (head.linear, head.transform) if isinstance(head, OutputHead) and head.fusable else None)
        if fused is not None:
            linear, transform = fused
            if torch.is_grad_enabled() and (hidden.requires_grad or linear.weight.requires_grad or (
                linear.bias is not None and linear.bias.requires_grad
            )):
                return _ChunkedLinearLogProb.apply(hidden, linear.weight, linear.bias, targets, chunk, stats, transform)
            return _chunked_forward(hidden, linear.weight, linear.bias, targets, chunk, stats, transform)[0]
        return self._checkpointed(head, hidden, targets, chunk, stats)

    def log_sum_exp(self, head: OutputHead | nn.Module, hidden: Tensor, targets: Tensor,
                    stats: list[Tensor] | None = None) -> Tensor:
        """``[K]`` float32 log-sum-exps of the model's logits at gathered hidden states ``[K, d]``, ``chunk_size``
        rows at a time and recomputed in backward, as :meth:`log_probs`; with ``stats``, appends each chunk's token
        statistics. A head that is not a fused linear one (which the control variates refuse; only a cache build
        asks) gets the plain scorer's."""
        parts = linear_head_parts(head)
        if parts is None:
            return super().log_sum_exp(head, hidden, targets, stats)
        linear, transform = parts
        chunk = self.rows_per_chunk(hidden.shape[0])
        if torch.is_grad_enabled() and (hidden.requires_grad or linear.weight.requires_grad or (
            linear.bias is not None and linear.bias.requires_grad
        )):
            return _ChunkedLinearLogProb.apply(hidden, linear.weight, linear.bias, targets, chunk, stats, transform,
                                               True)
        return _chunked_forward(hidden, linear.weight, linear.bias, targets, chunk, stats, transform)[1]

    def _checkpointed(
        self, head: OutputHead | nn.Module, hidden: Tensor, targets: Tensor, chunk: int,
        stats: list[Tensor] | None = None
    ) -> Tensor:
        """Any head module: plain log-softmax per chunk, activations recomputed by ``torch.utils.checkpoint``."""
        parent = super()

        def scorer(sink: list[Tensor] | None):
            calls = []

            def score(h: Tensor, t: Tensor) -> Tensor:
                calls.append(None)  # backward's recomputation calls it again: statistics from the first call only
                return parent.log_probs(head, h, t, sink if len(calls) == 1 else None)

            return score

        parts = []
        for start in range(0, hidden.shape[0], chunk):
            h, t = hidden[start : start + chunk], targets[start : start + chunk]
            score = scorer(stats)
            parts.append(checkpoint(score, h, t, use_reentrant=False) if torch.is_grad_enabled() else score(h, t))
        if not parts:
            return hidden.new_empty(0, dtype=torch.float32)
        return torch.cat(parts)

    def __repr__(self) -> str:
        if self.fixed_chunk_size is None:
            return f"{type(self).__name__}(num_chunks={self.num_chunks})"
        return f"{type(self).__name__}(chunk_size={self.fixed_chunk_size})"
