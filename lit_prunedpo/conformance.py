"""The set-up conformance check, and the automatic layout: scored log-probs against the model's own plain forward.

A layout (:mod:`lit_prunedpo.layout`) is only a faster way to compute what ``model(input_ids).logits`` gives for
each response alone. Whether it does so on a given model is checked, not assumed: on a small probe batch
(:func:`probe_batch`: three pairs with different prompt lengths, a shared response start, and a row longer than
the model's shortest sliding window where that is short enough to probe) every scored log-prob of the step's
executor, with the module's scorer and output head, is compared with the plain forward of each response alone,
unpadded, in eval mode (:func:`plain_logps`). Two plans run: the unpruned one, and one whose rejected rows run
without a gradient after the chosen rows (the path that reads the gradient forward's keys and values).

:class:`AutoLayout`, the default, tries the layouts fastest first (packed blocks, then right padding)
and keeps the first that a model does not refuse (:meth:`~lit_prunedpo.layout.Layout.check_model`) and that
matches the plain forward; :func:`choose_layout` does the same for a layout the user named, falling back to the
right-padded layout (exact for any causal model) with one line that names the difference, or stopping under
``strict``. It is what catches the architecture that next year's transformers adds.

The comparison runs in float32 whatever the step's precision (16-bit weights widened for it), to the float32
tolerance, and then at the step's own 16-bit precision, if it has one, within a multiple of the plain forward's
own rounding there (:mod:`lit_prunedpo.probe_precision`): a fixed tolerance either refuses a real model in
``bf16-mixed`` or lets a real difference pass.

Where the check runs in training mode too (the policy's dropout disabled), a difference that eval mode does not
show is a training-time noise source no layout can fix: it stops the run, naming the size of the difference.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import torch
from torch import Tensor, nn

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.step.execute import StepExecutor, keeps_keys_values
from lit_prunedpo.layout import LaidOutGroup, Layout, PairLengths, RightPaddedLayout, SharedPromptLayout
from lit_prunedpo.layout.attention import AttentionForm
from lit_prunedpo.step.plan import RowGroup, StepPlan, exact_plan
from lit_prunedpo.probe_precision import (FLOAT32_TOLERANCE, ROUNDING_FACTOR, WorkingPrecision, in_float32,
                                         rounding_tolerance)
from lit_prunedpo.scoring import TokenScorer, model_head

#: Longest probe row: a sliding window longer than this is not probed (the data must be longer to meet it).
MAX_PROBE_LENGTH = 256


def shortest_window(model: nn.Module) -> int | None:
    windows = [w for w in AttentionForm.of(model).windows.values() if w is not None]
    return min(windows) if windows else None


def probe_batch(model: nn.Module, max_length: int = MAX_PROBE_LENGTH, seed: int = 0) -> PreferenceBatch:
    """Three pairs of random tokens: prompts of 3, 6 and 2 tokens (left padding), a pair whose responses share
    their first 3 tokens, responses of different lengths, and a last pair longer than the model's shortest sliding
    window (when ``window + 6 <= max_length``) so that the window bites."""
    vocab = model.get_input_embeddings().num_embeddings
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if getattr(head, "weight", None) is not None:  # a token the logits do not cover cannot be a target (Mllama)
        vocab = min(vocab, head.weight.shape[0])
    generator = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(1, max(2, min(vocab, 4096)), (n,), generator=generator)  # noqa: E731
    window = shortest_window(model)
    long = window + 6 - 2 if window is not None and window + 6 <= max_length else 10
    shapes = [(3, 7, 5, 3), (6, 4, 9, 0), (2, long, long - 2, 1)]  # prompt, chosen, rejected, common start
    P, T = max(s[0] for s in shapes), max(max(s[1], s[2]) for s in shapes)
    prompt_ids = torch.zeros(3, P, dtype=torch.long)
    prompt_mask = torch.zeros(3, P, dtype=torch.bool)
    response_ids = torch.zeros(3, 2, T, dtype=torch.long)
    response_mask = torch.zeros(3, 2, T, dtype=torch.bool)
    for i, (p, chosen, rejected, common) in enumerate(shapes):
        prompt_ids[i, P - p:], prompt_mask[i, P - p:] = draw(p), True
        start = draw(common)
        for b, n in enumerate((chosen, rejected)):
            response_ids[i, b, :n] = torch.cat([start, draw(n - common)])
            response_mask[i, b, :n] = True
        if common and chosen > common and rejected > common:  # make sure the responses differ right after it
            response_ids[i, 1, common] = (response_ids[i, 0, common] % (vocab - 1)) + 1
    return PreferenceBatch(prompt_ids, prompt_mask, response_ids, response_mask, torch.arange(3))


@torch.no_grad()
def plain_logps(model: nn.Module, batch: PreferenceBatch) -> Tensor:
    """``[B, 2, T]`` log-prob of every response token (0 past the end) from ``model(input_ids).logits`` of each
    response alone, unpadded: the reference every layout is held to."""
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
    device = batch.prompt_ids.device
    for i in range(batch.num_pairs):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
        for b in range(2):
            n = int(batch.response_mask[i, b].sum())
            response = batch.response_ids[i, b, :n]
            ids = torch.cat([prompt, response])[None].to(device)
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0]
            logps = logits.float().log_softmax(-1)[len(prompt) - 1 : -1].gather(-1, response[:, None].to(device))
            out[i, b, :n] = logps[:, 0].cpu()
    return out


def _split_by_branch(plan: StepPlan) -> StepPlan:
    """The unpruned plan with its rejected rows moved to a no-grad group after the chosen ones (branch pruning's
    shape: the second forward may read the first's keys and values)."""
    (group,) = plan.groups
    groups = []
    for branch, grad in ((0, True), (1, False)):
        rows = (group.branch == branch).nonzero().flatten()
        new_index = torch.full((group.num_rows,), -1, dtype=torch.long)
        new_index[rows] = torch.arange(rows.numel())
        keep = new_index[group.scored_row] >= 0
        groups.append(RowGroup(
            pair=group.pair[rows], branch=group.branch[rows], kept=group.kept[rows],
            scored_row=new_index[group.scored_row[keep]], scored_t=group.scored_t[keep],
            weight=group.weight[keep], requires_grad=grad,
        ))
    return replace(plan, groups=tuple(groups))


@contextlib.contextmanager
def _modes(model: nn.Module, training: bool, dropout_free: bool) -> Iterator[None]:
    """Run with ``model`` in training (noise-free, as a step runs it) or eval mode; restore every module's mode."""
    from lit_prunedpo.dropout import dropout_free_training

    saved = {m: m.training for m in model.modules()}
    model.train(training)
    if training and dropout_free:
        dropout_free_training(model)
    try:
        yield
    finally:
        for m, mode in saved.items():
            m.training = mode


@torch.no_grad()
def layout_error(model: nn.Module, layout: Layout, scorer: TokenScorer, batch: PreferenceBatch,
                 expected: Tensor, training: bool = False, dropout_free: bool = True) -> float:
    """Largest ``|log p|`` difference between ``layout``'s scored log-probs (unpruned plan, then branch-split plan)
    and ``expected`` (:func:`plain_logps`); exceptions of the model's forward propagate."""
    executor = StepExecutor(layout, keeps_keys_values(model))
    plan = exact_plan(batch)
    worst = 0.0
    with _modes(model, training, dropout_free):
        for i, candidate in enumerate((plan, _split_by_branch(plan))):
            forwards = executor.forwards(candidate.groups, PairLengths.of(batch))
            if i and not any(f.laid_out.reads_previous for f in forwards.policy):
                continue  # the split plan only adds the path that reads the previous forward's keys and values
            for group, logps in zip(candidate.groups, executor.run_policy(model, scorer, batch, forwards)):
                truth = expected[group.pair[group.scored_row], group.branch[group.scored_row], group.scored_t]
                diff = (logps.float().cpu() - truth).abs()
                if not bool(torch.isfinite(diff).all()):
                    return float("inf")
                worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst


def _name(layout: Layout) -> str:
    return type(layout).__name__


@dataclass(frozen=True)
class LayoutChoice:
    """What :func:`choose_layout` decided, and the one line that says so."""

    layout: Layout
    line: str
    passed_over: tuple[str, ...] = ()
    """``"Layout: why"`` of each layout tried before the chosen one."""


def _private(scorer: TokenScorer) -> TokenScorer:
    """A copy of ``scorer`` for the probe, so that its forwards leave no trace in the one the steps use (a warning
    issued once, a user's counters)."""
    try:
        return copy.deepcopy(scorer)
    except Exception:  # a scorer that cannot be copied is probed as it is
        return scorer


def _distinct(models: Sequence[nn.Module]) -> list[nn.Module]:
    """``models`` without those of the same class and config as an earlier one (an online reference copied from the
    policy runs a layout exactly when the policy does)."""
    seen, out = set(), []
    for model in models:
        config = getattr(model, "config", None)
        dtype = next(model.parameters()).dtype
        key = (type(model), dtype, getattr(config, "_attn_implementation", None),
               config.to_json_string() if hasattr(config, "to_json_string") else id(model))
        if key not in seen:
            seen.add(key)
            out.append(model)
    return out


@dataclass(frozen=True)
class Probe:
    """A model's probe batch, its plain log-probs in float32 (the truth every layout is held to) and, at a 16-bit
    working precision, how far the plain forward at that precision is from them (its own rounding)."""

    batch: PreferenceBatch
    expected: Tensor
    precision: WorkingPrecision
    rounding: float = 0.0

    @property
    def limit(self) -> float:
        """The tolerance of a layout at the working precision (:func:`rounding_tolerance`)."""
        return rounding_tolerance(self.rounding)


class _Probes:
    """Each model's :class:`Probe`, computed when first asked (a layout a model refuses needs none)."""

    def __init__(self, max_length: int, precisions: dict[int, WorkingPrecision]) -> None:
        self.max_length = max_length
        self.precisions = precisions
        self.done: dict[int, Probe] = {}
        self.unfinite = False  # a model's own forward gave NaN or Inf on the probe: nothing was compared

    def __getitem__(self, model: nn.Module) -> Probe:
        if id(model) not in self.done:
            batch = probe_batch(model, self.max_length).to(next(model.parameters()).device)
            precision = self.precisions[id(model)]
            with _modes(model, False, True):
                with in_float32([model]):
                    expected = plain_logps(model, batch)
                rounding = 0.0 if not precision.reduced else _rounding(model, batch, expected, precision)
            self.done[id(model)] = Probe(batch, expected, precision, rounding)
        return self.done[id(model)]


def _rounding(model: nn.Module, batch: PreferenceBatch, expected: Tensor, precision: WorkingPrecision) -> float:
    """How far the plain forward at ``precision`` is from its float32 log-probs ``expected`` (largest, in nats).

    Raises:
        ValueError: the model's own forward fails at that precision (no layout can do better).
    """
    try:
        logps = plain_logps(model, batch)
    except Exception as err:
        raise ValueError(f"{type(model).__name__}'s own forward fails in {precision.describe()}: {_failure(err)}; "
                         "train it in float32 (--trainer.precision 32-true)") from err
    return float((logps - expected).abs()[batch.response_mask.cpu()].max())


def _failure(err: Exception) -> str:
    first = (str(err).splitlines() or [repr(err)])[0][:160]
    return f"the model's forward failed on its inputs ({type(err).__name__}: {first})"


def _try(layout: Layout, models: Sequence[nn.Module], scorer: TokenScorer, probes: "_Probes", tolerance):
    """``None`` when ``layout`` runs every model exactly on the probe, else why not (one clause): in float32 to the
    float32 tolerance, then, at a 16-bit working precision, within its rounding
    (:mod:`lit_prunedpo.probe_precision`)."""
    for model in models:
        try:
            layout.check_model(model)
        except ValueError as err:
            return str(err).split(": ", 1)[-1].split("; use ")[0]
        probe = probes[model]
        if not bool(torch.isfinite(probe.expected).all()):
            # weights that already hold NaN or Inf (a diverged checkpoint): nothing to compare with; the step's own
            # non-finite handling reports it
            probes.unfinite = True
            continue
        limit = tolerance if tolerance is not None else FLOAT32_TOLERANCE
        try:
            with in_float32([model]):
                error = layout_error(model, layout, scorer, probe.batch, probe.expected)
            if error > limit:
                return f"its log-probs differ from the plain forward by up to {error:.3g} nats (tolerance {limit:g})"
            if probe.precision.reduced:
                error = layout_error(model, layout, scorer, probe.batch, probe.expected)
        except Exception as err:  # a forward that cannot take this layout's inputs is a refusal, not a crash
            return _failure(err)
        if probe.precision.reduced and error > max(limit, probe.limit):
            return (f"in {probe.precision.describe()} its log-probs differ from the float32 plain forward by up to "
                    f"{error:.3g} nats, more than {ROUNDING_FACTOR:g}x the plain forward's own rounding "
                    f"({probe.rounding:.3g})")
    return None


def choose_layout(requested: Layout, models: Sequence[nn.Module], scorer: TokenScorer, *, strict: bool = False,
                  dropout_check: bool = True, tolerance: float | None = None,
                  max_length: int = MAX_PROBE_LENGTH) -> LayoutChoice:
    """The layout to run ``models`` (the policy first, then frozen references) with: ``requested`` if it matches the
    plain forward on the probe, else (an :class:`AutoLayout`'s next candidate, or) the right-padded layout.

    Raises:
        ValueError: under ``strict``, when ``requested`` does not match, naming how; when no layout matches.
        RuntimeError: when the policy's training-mode forward differs from its eval-mode one (``dropout_check``).
    """
    policy = models[0]
    for model in models:
        model_head(model)  # read each model's head now, not in its first step
    models = _distinct(models)
    probes = _Probes(max_length, {id(model): WorkingPrecision.of(model) for model in models})
    scorer = _private(scorer)
    auto = isinstance(requested, AutoLayout)
    candidates = list(requested.candidates) if auto else [requested] + ([] if strict else [RightPaddedLayout()])
    refused: list[str] = []
    chosen = None
    for layout in candidates:
        why = _try(layout, models, scorer, probes, tolerance)
        if why is None:
            chosen = layout
            break
        refused.append(f"{_name(layout)}: {why}")
        if strict and not auto:
            raise ValueError(f"model.layout {_name(requested)} does not run {type(policy).__name__} exactly: {why} "
                             "(model.strict_layout is set; leave model.layout unset to let the automatic layout "
                             "choose)")
    if chosen is None:
        raise ValueError(f"no layout runs {type(policy).__name__} exactly on the conformance "
                         "probe: " + "; ".join(refused))
    if probes.unfinite:
        return LayoutChoice(chosen, f"layout: {_name(chosen)} for {type(policy).__name__}: not checked, the model's "
                                    "own forward is not finite on the conformance probe", tuple(refused))
    if dropout_check:
        probe = probes[policy]
        with in_float32([policy]):
            error = layout_error(policy, chosen, scorer, probe.batch, probe.expected, training=True)
        limit = tolerance if tolerance is not None else FLOAT32_TOLERANCE
        if error > limit:
            raise RuntimeError(
                f"{type(policy).__name__} computes different log-probs in training mode than in eval mode (up to "
                f"{error:.3g} nats on the conformance probe) although its dropout is disabled: a training-time "
                "noise source lit_prunedpo does not know. Set model.disable_dropout=false to train with it anyway "
                "(the reference and validation then differ from the policy's steps)"
            )
    window = shortest_window(policy)
    probed = "" if window is None else (f", sliding window {window} probed" if window + 6 <= max_length
                                        else f", sliding window {window} longer than the probe: not probed")
    head = model_head(policy).how
    head = None if head == "linear head" else f"output head: {head}"
    why = f" ({'; '.join(refused)})" if refused else ""
    line = (f"layout: {_name(chosen)} for {type(policy).__name__}{why}: matches the model's plain forward on the "
            f"conformance probe{probed}{_precision_clause(probes[policy])}")
    return LayoutChoice(chosen, line if head is None else f"{line}; {head}", tuple(refused))


def _precision_clause(probe: Probe) -> str:
    if not probe.precision.reduced:
        return ""
    return (f" (in float32 to {FLOAT32_TOLERANCE:g} nats, and in {probe.precision.describe()} within "
            f"{probe.limit:.3g}: {ROUNDING_FACTOR:g}x the plain forward's own rounding, {probe.rounding:.3g})")


def unchecked_layout(layout: Layout, models: Sequence[nn.Module]) -> LayoutChoice:
    """``layout`` without the conformance probe (``check_layout=False``): an automatic layout takes its first
    candidate that no model refuses."""
    candidates = list(layout.candidates) if isinstance(layout, AutoLayout) else [layout]
    refusals = []
    for candidate in candidates:
        try:
            for model in models:
                candidate.check_model(model)
        except ValueError as err:
            refusals.append(str(err))
            if not isinstance(layout, AutoLayout):
                raise
            continue
        return LayoutChoice(candidate, f"layout: {type(candidate).__name__} (model.check_layout is off: not compared "
                                       "with the model's plain forward)")
    raise ValueError("; ".join(refusals))


class AutoLayout(Layout):
    """The fastest layout a model runs exactly: the first of ``candidates`` (default: :class:`SharedPromptLayout`,
    then :class:`RightPaddedLayout`) that the model does not refuse and that matches its plain forward on the
    conformance probe (:func:`choose_layout`). ``PrunedDPO`` resolves it once, before its first step; arranging rows
    before that is an error.

    :class:`LeftPaddedLayout` is not a default candidate: it costs what the right-padded layout costs (one row per
    response) and is exact on fewer models (a recurrent layer that does not mask its padding reads the left
    padding into its state, which a probe on weights near their initialisation may not show).

    Args:
        candidates: the layouts to try, fastest first.
    """

    def __init__(self, candidates: Sequence[Layout] | None = None) -> None:
        self.candidates = tuple(candidates) if candidates is not None else (SharedPromptLayout(), RightPaddedLayout())
        if not self.candidates:
            raise ValueError("AutoLayout needs at least one candidate layout")

    def arrange(self, group: RowGroup, pairs: PairLengths, previous: LaidOutGroup | None = None) -> LaidOutGroup:
        raise RuntimeError("AutoLayout is resolved to a concrete layout before the first step "
                           "(lit_prunedpo.conformance.choose_layout); it arranges nothing itself")

    def __repr__(self) -> str:
        return f"AutoLayout({', '.join(_name(c) for c in self.candidates)})"
