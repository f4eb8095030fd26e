"""Computing a reference cache: one no-grad pass of the reference over the pairs, every response token's log-prob
(and log-sum-exp) kept (:func:`compute_reference_logps`).

Each batch runs through the same :func:`~lit_prunedpo.step.plan.exact_plan` (full prefixes, all positions, both
branches) and :class:`~lit_prunedpo.scoring.TokenScorer` as :class:`~lit_prunedpo.reference.OnlineReference`, each
response in its own right-padded row (:class:`~lit_prunedpo.layout.RightPaddedLayout`, exact for any causal LM), so
the values are what the model's plain forward of each response alone computes. The LM head and its log-softmax run
on :data:`LOGITS_PER_CHUNK` logits at a time (:func:`score_in_chunks`), never on a whole batch's ``[tokens,
vocabulary]``: at GPT-2's vocabulary those are gigabytes while the body needs megabytes. A build of minutes says how
far it is (:class:`BuildProgress`). :class:`~lit_prunedpo.reference.CachedReference` runs it and stores the result.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, ContextManager, Iterable

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.head import OutputHead
from lit_prunedpo.layout import PairLengths, RightPaddedLayout
from lit_prunedpo.step.plan import exact_plan
from lit_prunedpo.reference.store import ReferenceLogpStore
from lit_prunedpo.scoring import GroupInputs, TokenScorer, model_head, split_causal_lm
from lit_prunedpo.token_terms import linear_head_parts, target_logits

#: Logits a build computes at once (:func:`score_in_chunks`): 16 MiB of float32 (the plain scorer holds them and their
#: log-softmax: 32 MiB), i.e. 83 positions of GPT-2's 50,257-token vocabulary, whatever the batch. Kept under glibc's
#: 32 MiB mmap threshold so that on CPU each chunk reuses the last one's freed heap: 64 MiB chunks were mapped and
#: page-faulted afresh every time (about a third of the build's time in the kernel), at no gain in matmul speed.
LOGITS_PER_CHUNK = 1 << 22


class BuildProgress:
    """Logs how far a cache build is, so that a build of minutes is not silent: a line when another tenth of the
    pairs is done, at most one every ``min_interval_s`` seconds, and the last one, each with the time spent, the
    pairs per second and the time left at the pace so far (pairs come shortest first, so the estimate errs low).

    Args:
        total_pairs: pairs the whole build scores (all ranks).
        world_size: ranks sharing the build; each logs from rank 0 only (``rank_zero_info``), on its own share.
        what: the cache's path, for the lines.
        min_interval_s: the least time between two lines but the last.
        clock: seconds (``time.perf_counter``); a test passes its own.
    """

    def __init__(self, total_pairs: int, world_size: int, what: str, min_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.total = max(1, -(-total_pairs // max(1, world_size)))  # this rank's share, rounded up
        self.what, self.min_interval_s, self.clock = what, min_interval_s, clock
        self.start = self.last_time = clock()
        self.next_share = 0.1
        self.lines: list[str] = []

    def __call__(self, done: int) -> None:
        now, share = self.clock(), min(1.0, done / self.total)
        last = done >= self.total
        if not last and (share < self.next_share or now - self.last_time < self.min_interval_s):
            return
        spent = now - self.start
        left = spent * (1 - share) / share if share > 0 else float("nan")
        rate = f", {done / spent:.1f} pairs/s" if spent > 0 else ""
        line = (f"reference cache {self.what}: {done} of {self.total} pairs ({share:.0%}) in {spent:.0f} s{rate}"
                + ("" if last else f", about {left:.0f} s left"))
        self.lines.append(line)
        rank_zero_info(line)
        self.last_time = now
        while self.next_share <= share:
            self.next_share += 0.1


def head_rows(head: OutputHead, logits_per_chunk: int) -> int:
    """Positions the head projects at once so that their logits number about ``logits_per_chunk``: the vocabulary is
    the LM head's output rows (a head without a 2-D weight is taken to have ``2**16``, a large vocabulary)."""
    weight = getattr(head.linear, "weight", None)
    vocab = weight.shape[0] if isinstance(weight, Tensor) and weight.ndim == 2 else 1 << 16
    return max(1, logits_per_chunk // max(1, vocab))


def score_in_chunks(scorer: TokenScorer, model: nn.Module, inputs: GroupInputs, logits_per_chunk: int,
                    with_lse: bool = False) -> tuple[Tensor, Tensor | None]:
    """``([K] log-probs, [K] log-sum-exps or None)``: ``scorer(model, inputs)`` with ``scorer.log_probs`` applied to
    :func:`head_rows` gathered positions at a time, and, ``with_lse``, the log-sum-exp over the vocabulary at each
    position.

    Why: a build scores every response token of a whole batch in one forward (``K`` in the thousands), and the
    plain scorer's ``[K, V]`` logits and their log-softmax are gigabytes at a 50k vocabulary, where the model body
    needs megabytes. Each position's log-softmax is its own row's, so the values are the scorer's own, up to the
    round-off of a matmul over fewer rows. The body still runs once per batch, so a scorer's own ``__call__`` is not
    used: :meth:`~lit_prunedpo.scoring.TokenScorer.log_probs` is where a scorer changes how log-probs are computed.
    The log-sum-exps come from the same chunks (:func:`chunk_lse`): no ``[K, V]`` tensor either.
    """
    body, linear = split_causal_lm(model)
    head = model_head(model, linear)
    # [K, d]; the body's [n, W, d] output is freed right away
    gathered = scorer.hidden_states(body, inputs)[inputs.gather_row, inputs.gather_col]
    rows = head_rows(head, logits_per_chunk)
    logps, lse = [gathered.new_empty(0, dtype=torch.float32)], [gathered.new_empty(0, dtype=torch.float32)]
    for start in range(0, gathered.shape[0], rows):
        hidden, targets = gathered[start : start + rows], inputs.targets[start : start + rows]
        logps.append(scorer.log_probs(head, hidden, targets))
        if with_lse:
            lse.append(chunk_lse(scorer, head, hidden, targets, logps[-1]))
    return torch.cat(logps), torch.cat(lse) if with_lse else None


def chunk_lse(scorer: TokenScorer, head: OutputHead, hidden: Tensor, targets: Tensor, logps: Tensor) -> Tensor:
    """``[k]`` log-sum-exps of a chunk whose log-probs ``logps`` the scorer computed: ``z_t - logp_t``, the target
    logit one row of a linear head (``2d`` FLOPs, not a second ``2dV`` pass); a head that is not a plain linear one
    runs again (:meth:`~lit_prunedpo.scoring.TokenScorer.log_sum_exp`)."""
    parts = linear_head_parts(head)
    if parts is None:
        return scorer.log_sum_exp(head, hidden, targets).float()
    return target_logits(*parts, hidden, targets) - logps.float()


def model_device(model: nn.Module) -> torch.device:
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


@torch.no_grad()
def compute_reference_logps(
    model: nn.Module,
    batches: Iterable[PreferenceBatch],
    scorer: TokenScorer | None = None,
    forward_context: Callable[[], ContextManager] | None = None,
    progress: Callable[[int], None] | None = None,
    logits_per_chunk: int = LOGITS_PER_CHUNK,
    with_lse: bool = False,
) -> ReferenceLogpStore:
    """One no-grad pass of ``model`` over ``batches``: the log-prob of every response token of every pair (and, with
    ``with_lse``, the log-sum-exp of the logits there, :func:`score_in_chunks`).

    Each batch is planned with full prefixes, all positions and both branches and scored in right-padded rows
    (exact for any causal LM) with ``scorer``, as the online reference scores an unpruned step, except that the LM
    head runs on a chunk of positions at a time (:func:`score_in_chunks`): the build's peak memory is the body's
    and one chunk's logits, not ``[batch tokens, vocabulary]``. The model runs in eval mode (dropout off) on its
    own device and gets its mode back.

    Args:
        model: a ``transformers`` causal LM.
        batches: the pairs to cache; their ``index`` values must be unique.
        scorer: how log-probs are computed; ``None`` is :class:`~lit_prunedpo.scoring.TokenScorer`.
        forward_context: a context factory every forward runs under (e.g. the trainer's autocast).
        progress: called after each batch with the number of pairs scored so far (e.g. :class:`BuildProgress`).
        logits_per_chunk: how many logits (positions x vocabulary) exist at once (:func:`score_in_chunks`).
        with_lse: also store the log-sum-exps (as :class:`~lit_prunedpo.reference.CachedReference` does; 4 more bytes
            a token).

    Raises:
        ValueError: a batch is invalid, an index repeats, or ``logits_per_chunk < 1``.
    """
    if logits_per_chunk < 1:
        raise ValueError(f"compute_reference_logps: logits_per_chunk must be >= 1, got {logits_per_chunk!r}")
    scorer = scorer if scorer is not None else TokenScorer()
    context = forward_context if forward_context is not None else contextlib.nullcontext
    device = model_device(model)
    was_training = model.training
    model.eval()
    keys: list[int] = []
    lengths: list[tuple[int, int]] = []
    values: list[Tensor] = []
    lse: list[Tensor] = []  # the log-sum-exps, laid out as values
    try:
        for batch in batches:
            batch.validate()
            batch = batch.to(device)
            logps, batch_lse = _score_batch(model, batch, scorer, context, logits_per_chunk, with_lse)
            # scored positions come row-major (row 2i + b, then t), so each pair's chosen and rejected
            # tokens are consecutive in `logps`.
            per_pair = batch.response_lengths.cpu()
            keys.extend(batch.index.cpu().tolist())
            lengths.extend(tuple(x) for x in per_pair.tolist())
            values.extend(logps.float().cpu().split(per_pair.sum(-1).tolist()))
            if batch_lse is not None:
                lse.extend(batch_lse.float().cpu().split(per_pair.sum(-1).tolist()))
            if progress is not None:
                progress(len(keys))
    finally:
        model.train(was_training)
    return ReferenceLogpStore.from_rows(keys, lengths, values, lse=lse if with_lse else None)


def _score_batch(model: nn.Module, batch: PreferenceBatch, scorer: TokenScorer, context: Callable[[], ContextManager],
                 logits_per_chunk: int, with_lse: bool) -> tuple[Tensor, Tensor | None]:
    """The log-probs (and, ``with_lse``, log-sum-exps) of every response token of ``batch``, as an unpruned step
    scores them in right-padded rows, under ``context``: row ``2i + b`` (pair ``i``, branch ``b``), then ``t``."""
    plan = exact_plan(batch)
    (group,) = plan.groups  # both branches of every pair get a "gradient": one group, rows 2i + b
    with context():
        inputs = RightPaddedLayout().arrange(group, PairLengths.of(batch)).inputs(batch)
        return score_in_chunks(scorer, model, inputs, logits_per_chunk, with_lse)
