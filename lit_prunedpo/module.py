"""``PrunedDPO``: the LightningModule that wires samplers, scorer, reference and loss into a DPO step.

A training step (:meth:`PrunedDPO.step`, the one step of the code base: ``training_step``, the benchmark and the
study all run it) reads in the order data flows:

    plan      samplers draw branches, prefixes and positions (``plan.plan_step``), before any compute
    execute   the executor lays the row groups out and runs them: the gradient rows, then the no-grad rows,
              then the reference on the same truncated inputs (``execute.StepExecutor``)
    estimate  IPW sums, margin and the single-branch surrogate (``estimate.estimate``)
    backward  Lightning back-propagates the returned objective

With every sampler at "no pruning" this is concatenated DPO: one forward of the ``2B`` rows with a graph and
one reference forward. Around the step, each in its module: validation and test, always the exact objective
(``validation``); the training logs (``training_logs``); the gradient check (``gradient_check``); the optimizer
(``optimizer_setup``); what checkpoints carry (``run_state``); the policy's build (``policy_setup``).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.conformance import AutoLayout, LayoutChoice, choose_layout, unchecked_layout
from lit_prunedpo.distributed import agree_on_forwards
from lit_prunedpo.dropout import dropout_free_training
from lit_prunedpo.guards import check_sampler_kinds, check_setup, refuse_nonfinite_weights, refusing_setter
from lit_prunedpo.layout import Layout, SharedPromptLayout
from lit_prunedpo.losses import PreferenceLoss, SigmoidLoss, trl_loss
from lit_prunedpo.metrics import StepStats, pair_metrics
from lit_prunedpo.models import ModelSource
from lit_prunedpo.policy_setup import EvalModeWarning, build_policy
from lit_prunedpo.reference import ReferenceRuntime, ReferenceSource, reference_for
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo.run.gradient_check import GradientCheck
from lit_prunedpo.run.nonfinite import NonFiniteGuard
from lit_prunedpo.run.state import RunState, load_policy_state, save_policy_state
from lit_prunedpo.run.training_logs import (TrainingLog, log_optimizer_step, log_skipped, logs_this_step,
                                            tokens_over_ranks)
from lit_prunedpo.run.validation import epoch_means, exact_step, log_exact_metrics
from lit_prunedpo.sampler_set import SamplerSet
from lit_prunedpo.samplers import BranchSampler, PositionSampler, PrefixSampler
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.step.estimate import Estimate, estimate
from lit_prunedpo.step.execute import StepExecutor, StepLogps, keeps_keys_values, layout_for
from lit_prunedpo.step.io import StepOutput, StepParts
from lit_prunedpo.step.plan import StepPlan, exact_samplers, plan_step


class PrunedDPO(L.LightningModule):
    """DPO with random pruning of positions, prefixes and branches, re-weighted to stay unbiased.

    Args:
        policy: where the trainable policy comes from (``lit_prunedpo.models.FromConfig`` or ``Pretrained``).
        reference: source of reference log-probs; ``None`` is a frozen copy of the initial policy, run online,
            or no reference at all (``NoReference``) for a loss that needs none.
        loss: the loss (``lit_prunedpo.losses``); ``None`` is DPO's sigmoid loss; a TRL ``loss_type`` name (``"ipo"``)
            or a list of them is that loss (``lit_prunedpo.losses.trl_loss``).
        beta: DPO's inverse temperature (> 0).
        prefix_sampler: which response prefixes run; ``None`` keeps them whole.
        position_sampler: which kept positions are scored; ``None`` scores all.
        branch_sampler: which branches get a gradient; ``None`` back-propagates both.
        scorer: how per-token log-probs are computed from the model; ``None`` is ``TokenScorer``.
        optimizer: optimizer factory over the policy's trainable parameters; ``None`` is ``torch.optim.AdamW``
            with its defaults.
        scheduler: learning-rate scheduler factory, stepped every optimizer step; ``None`` keeps the rate.
        sampler_seed: seed of the samplers' dedicated generator; ``None`` uses the run's ``seed_everything``
            seed (``PL_GLOBAL_SEED``), or 0.
        gradient_checkpointing: recompute the policy's activations in backward (less memory, more time).
        disable_dropout: turn off every training-time noise source of the policy (TRL's default for DPO: noise
            would make the policy's and the reference's log-probs disagree even at identical weights): every
            dropout module, the dropout and jitter fields layers copy from the config, and code that samples in
            training mode (:mod:`lit_prunedpo.dropout`); the conformance check then also compares the
            policy's training-mode log-probs with its plain eval-mode forward.
        on_nonfinite: ``raise`` stops at a non-finite loss or gradient naming the step and its parts; ``skip``
            skips the step's update (on every rank together), counts, warns and logs it; the step's own (non-finite)
            values are logged either way (``lit_prunedpo.run.nonfinite``).
        max_consecutive_skips: with ``on_nonfinite="skip"``, more than this many non-finite steps in a row stop
            the run with an error (a diverged run, whose weights are likely non-finite, is not a run to finish).
        layout: how a step's rows become forwards (``lit_prunedpo.layout``); ``None`` is the automatic choice
            (``lit_prunedpo.conformance.AutoLayout``): packed blocks that run each pair's prompt, and the common
            start of its two responses, once per forward (``SharedPromptLayout``) where the model runs them exactly,
            else one right-padded row per response (``RightPaddedLayout``, exact for any causal LM), said in one
            line at the first step. With packed blocks and a margin loss, training steps
            also score the common start once, in one row, and count it in both branches (its log-ratios cancel in
            the margin; ``train/logps/*`` are the whole responses', as TRL's), and with branch pruning the no-grad
            rows read their prompts from the gradient forward's keys and values (not under gradient checkpointing).
        shared_prompt: shorthand kept for configs written before ``layout``: ``true`` is ``SharedPromptLayout``,
            ``false`` is ``LeftPaddedLayout``; give ``layout`` or this, not both.
        check_layout: before the first step, compare the layout's per-token log-probs on a small probe batch
            with the model's own plain forward (``lit_prunedpo.conformance``); a layout that differs is replaced by
            the exact right-padded one, with one line that names the difference.
        strict_layout: stop instead of replacing a layout that differs.

    Raises:
        ValueError: on a non-positive ``beta``, an unknown ``on_nonfinite``, a negative ``max_consecutive_skips``,
            or a reference given to a loss that uses none.
    """

    def __init__(
        self,
        policy: ModelSource,
        reference: ReferenceSource | None = None,
        loss: PreferenceLoss | str | list[str] | None = None,
        beta: float = 0.1,
        prefix_sampler: PrefixSampler | None = None,
        position_sampler: PositionSampler | None = None,
        branch_sampler: BranchSampler | None = None,
        scorer: TokenScorer | None = None,
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        sampler_seed: int | None = None,
        gradient_checkpointing: bool = False,
        disable_dropout: bool = True,
        on_nonfinite: Literal["raise", "skip"] = "raise",
        max_consecutive_skips: int = 10,
        layout: Layout | None = None,
        shared_prompt: bool | None = None,
        check_layout: bool = True,
        strict_layout: bool = False,
    ) -> None:
        super().__init__()
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta!r}")
        if layout is not None and shared_prompt is not None:
            raise ValueError("give model.layout or model.shared_prompt (its older shorthand), not both")
        # the samplers' stream, the failure policy's counts, TRL's num_tokens, the optimizer's record: checkpointed
        self.run_state = RunState(NonFiniteGuard(on_nonfinite, max_consecutive_skips))
        self.beta = float(beta)
        # a TRL loss_type name, or a list of them, as a TRL user writes it
        self.loss = trl_loss(loss) if isinstance(loss, (str, list)) else (loss if loss is not None else SigmoidLoss())
        given = (prefix_sampler, position_sampler, branch_sampler)
        check_sampler_kinds(type(self).__name__, *given)  # a sampler's class, or another kind, refused at once
        self.sampler_set = SamplerSet(*(s if s is not None else exact for s, exact in zip(given, exact_samplers())))
        self.scorer = scorer if scorer is not None else TokenScorer()
        self.optimizer_factory = optimizer if optimizer is not None else torch.optim.AdamW
        self.scheduler_factory = scheduler
        self.sampler_seed = sampler_seed

        self.policy = build_policy(policy, disable_dropout, gradient_checkpointing)
        self.policy_source = policy  # its spec goes into checkpoints, for lit_prunedpo.export
        self.disable_dropout = bool(disable_dropout)
        self.reference = reference_for(self.loss, reference)
        self.reference.configure(self.policy, self.scorer)
        self.layout = layout_for(shared_prompt) if shared_prompt is not None else (layout or AutoLayout())
        self.check_layout = bool(check_layout)
        self.strict_layout = bool(strict_layout)
        self._layout_choice: LayoutChoice | None = None

        self._eval_mode_warning = EvalModeWarning()  # opened at fit start, closed at train start
        self.step_stats: StepStats | None = None
        self.training_log = TrainingLog()
        self.gradient_check = GradientCheck(self.nonfinite, self._log_skipped)  # before each update
        self._sharded = False  # set by configure_model under FSDP2
        self.val_metrics, self.test_metrics = epoch_means(), epoch_means()

    # ---------------------------------------------------------------------------------- the run's state
    sampler_rng = property(lambda self: self.run_state.sampler_rng, doc="The samplers' generator (one per rank).")
    nonfinite = property(lambda self: self.run_state.nonfinite, doc="The failure policy and its counts.")
    num_tokens = property(lambda self: self.run_state.num_tokens, doc="TRL's count of every rank's input tokens.")

    # ------------------------------------------------------------------------------------- the samplers
    @property
    def prefix_sampler(self) -> PrefixSampler:
        """Which response prefixes run; changed with :meth:`use_samplers`."""
        return self.sampler_set.samplers[0]

    prefix_sampler = prefix_sampler.setter(refusing_setter("prefix"))

    @property
    def position_sampler(self) -> PositionSampler:
        """Which kept positions are scored; changed with :meth:`use_samplers`."""
        return self.sampler_set.samplers[1]

    position_sampler = position_sampler.setter(refusing_setter("position"))

    @property
    def branch_sampler(self) -> BranchSampler:
        """Which branches get a gradient; changed with :meth:`use_samplers`."""
        return self.sampler_set.samplers[2]

    branch_sampler = branch_sampler.setter(refusing_setter("branch"))

    def use_samplers(self, prefix: PrefixSampler | None = None, position: PositionSampler | None = None,
                     branch: BranchSampler | None = None) -> None:
        """Draw the next steps with these samplers, ``None`` keeping the current one: the one way to change them
        (``PruneEarly``, ``AutoPruning``, the study's switch to exact steps). A refused sampler changes nothing.

        Raises:
            TypeError: on a sampler of the wrong kind, naming the argument and the class it must be.
            ValueError: once set up, on a position sampler that splits the log-softmax where the policy's head or
                the reference cannot run it (``guards.usable_position_sampler``, which puts the sampler it wraps in
                its place, with a warning, when it has ``fallback``; before set-up, :meth:`setup` checks).
        """
        self.sampler_set.use(prefix, position, branch)  # admitted there (lit_prunedpo.sampler_set)

    # ----------------------------------------------------------------------------------------- set-up
    def on_fit_start(self) -> None:
        # the frozen reference is in eval mode by design: only the policy's modules are worth a warning
        self._eval_mode_warning.open(self.policy, self.disable_dropout)

    def on_train_start(self) -> None:
        self.training_log.restart()  # a resumed run's window starts with its first step
        self._eval_mode_warning.close()
        self.run_state.optimizer.apply_resumed(self.trainer.optimizers, self.trainer.lr_scheduler_configs)

    def teardown(self, stage: str) -> None:
        self._eval_mode_warning.close()

    def setup(self, stage: str) -> None:
        seed = self.sampler_seed if self.sampler_seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))
        self.run_state.sampler_rng = SamplerRNG(seed=seed, rank=self.global_rank)
        datamodule = getattr(self._trainer, "datamodule", None)
        check_setup(self.policy, datamodule, self._trainer)
        self.reference.prepare(self.policy, datamodule, ReferenceRuntime.of(self._trainer))
        self.sampler_set.set_up(self.policy, self.reference)  # checked, or its fallback put in its place

    def configure_model(self) -> None:
        """Shard the policy, and an online reference's frozen model, with FSDP2 per decoder layer when the
        strategy provides a device mesh (``lit_prunedpo.distributed.FSDP2Strategy`` or Lightning's
        ``ModelParallelStrategy``); a no-op for every other strategy. See ``lit_prunedpo.distributed``."""
        if self.device_mesh is None or self._sharded:
            return
        from lit_prunedpo.distributed import shard_pruned_dpo

        shard_pruned_dpo(self.policy, self.reference, self.device_mesh)
        self._sharded = True
        self.sampler_set.set_up(self.policy, self.reference)  # again: a sharded head gives no row (fallback or refusal)

    def configure_optimizers(self) -> Any:
        trainable = (p for p in self.policy.parameters() if p.requires_grad)
        # recorded for checkpoints and resumes (lit_prunedpo.run.optimizer_setup)
        return self.run_state.optimizer.build(trainable, self.optimizer_factory, self.scheduler_factory,
                                              lambda: self.trainer.estimated_stepping_batches)

    def train(self, mode: bool = True) -> "PrunedDPO":
        super().train(mode)
        if mode and getattr(self, "disable_dropout", False):
            dropout_free_training(self.policy)  # whatever turned training mode on, the policy's noise stays off
        return self

    # ---------------------------------------------------------------------------------- the layout
    def resolved_layout(self) -> Layout:
        """The layout this module's steps run: ``layout`` as given, checked against the model's plain forward
        (``check_layout``) or, for the automatic layout, the one it chose; decided once, at the first call, and
        said in one line."""
        if self._layout_choice is None:
            models = [self.policy, *self.reference.models()]
            if self.check_layout:
                choice = choose_layout(self.layout, models, self.scorer, strict=self.strict_layout,
                                       dropout_check=self.disable_dropout)
            else:
                choice = unchecked_layout(self.layout, models)
            self._layout_choice = choice
            rank_zero_info(choice.line)
        return self._layout_choice.layout

    @property
    def shared_prompt(self) -> bool:
        """Whether the steps run packed blocks (each pair's prompt once per forward)."""
        return isinstance(self.resolved_layout(), SharedPromptLayout)

    # ------------------------------------------------------------------------------------ the step
    @property
    def parts(self) -> StepParts:
        """This module's samplers, scorer, reference and layout, as a step takes them. Read at every step, so that
        samplers replaced by :meth:`use_samplers` (``PruneEarly``) take effect at the next one."""
        return self.parts_with()

    def parts_with(self, prefix: PrefixSampler | None = None, position: PositionSampler | None = None,
                   branch: BranchSampler | None = None) -> StepParts:
        """The step's parts with these samplers in place of this module's (``None``: its own), a position sampler
        admitted as training admits it: what a measurement of this module's step (``AutoPruning``'s calibration,
        ``lit_prunedpo.testing``'s unbiasedness check) must run. Every path that builds step parts comes here."""
        return StepParts(*self.sampler_set.chosen(prefix, position, branch), self.scorer, self.reference,
                         self.resolved_layout())

    def step(
        self, batch: PreferenceBatch, parts: StepParts | None = None, generator: torch.Generator | None = None,
        token_stats: bool = False,
    ) -> StepOutput:
        """One training step up to its backward: plan, execute, estimate.

        Args:
            batch: the step's pairs.
            parts: what the step runs with; ``None`` is this module's own (:attr:`parts`). The module itself is
                not changed: the benchmark passes each configuration's own parts to one shared module.
            generator: the samplers' generator for this step; ``None`` draws the next one of this module's
                stream (``sampler_rng``, checkpointed).
            token_stats: also collect the policy's token statistics at the scored positions
                (``out.logps.policy_token_stats``, for TRL's ``logits/*``, ``entropy``, ``mean_token_accuracy``).
        """
        parts = self.parts if parts is None else parts
        batch.validate()
        plan = self.plan(batch, parts, generator)
        logps = self.execute(batch, plan, parts, token_stats)
        return StepOutput(plan, logps, self.estimate(batch, plan, logps), parts.reference)

    def plan(
        self, batch: PreferenceBatch, parts: StepParts | None = None, generator: torch.Generator | None = None
    ) -> StepPlan:
        """Stage 1: all samplers draw from this step's generator (see :meth:`step` for the arguments)."""
        parts = self.parts if parts is None else parts
        return plan_step(
            batch, parts.prefix_sampler, parts.position_sampler, parts.branch_sampler,
            generator if generator is not None else self.sampler_rng.next(),
            # the common prefix's log-ratios cancel exactly in a margin: a margin loss scores them once, for both
            score_common_prefix=not (parts.layout.runs_common_start_once and self.loss.margin_only),
        )

    def executor(self, parts: StepParts | None = None, token_stats: bool = False) -> StepExecutor:
        """What runs a step's forwards: the parts' layout; keys and values reused unless the policy recomputes its
        activations (gradient checkpointing keeps none); under FSDP, the same forwards on every rank; with
        ``token_stats``, the policy's token statistics collected too."""
        parts = self.parts if parts is None else parts
        agree = agree_on_forwards(self.trainer.strategy) if self._sharded else None
        return StepExecutor(parts.layout, keeps_keys_values(self.policy), agree, token_stats)

    def execute(self, batch: PreferenceBatch, plan: StepPlan, parts: StepParts | None = None,
                token_stats: bool = False) -> StepLogps:
        """Stage 2: the policy's forwards, then the reference's."""
        parts = self.parts if parts is None else parts
        return self.executor(parts, token_stats)(self.policy, parts.scorer, parts.reference, batch, plan)

    def estimate(self, batch: PreferenceBatch, plan: StepPlan, logps: StepLogps) -> Estimate:
        """Stage 3: the IPW estimate of the loss and its single-branch surrogate."""
        return estimate(plan, logps.policy, logps.reference, self.loss, self.beta, batch.response_lengths,
                        logps.reference_lse)

    def execute_and_estimate(self, batch: PreferenceBatch, plan: StepPlan, parts: StepParts | None = None) -> Estimate:
        """Stages 2 and 3: policy and reference forwards, then the IPW estimate."""
        return self.estimate(batch, plan, self.execute(batch, plan, parts))

    def training_step(self, batch: PreferenceBatch, batch_idx: int) -> Tensor | None:
        # TRL's token metrics take one more pass over the scored logits: only on the steps whose logs are written
        logged = logs_this_step(self._trainer)
        out = self.step(batch, token_stats=logged)
        self.step_stats = out.stats
        self.run_state.num_tokens += tokens_over_ranks(batch, self._trainer)
        strategy = self._trainer and self.trainer.strategy
        finite = self.nonfinite.loss_ok(out.estimate, batch, batch_idx, self.global_step, strategy)
        self.training_log.add(out, self.beta)  # a skipped step too, with its own (non-finite) values
        if not finite:
            self._log_skipped()
        if logged:  # what Lightning writes: lit_prunedpo.run.training_logs
            self.training_log.write(self, out, batch.num_pairs, self.num_tokens)
        return out.estimate.objective if finite else None

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        if optimizer_closure is None:
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        # the step and its backward, then the gradient's check, before the update (lit_prunedpo.run.gradient_check)
        scaled = getattr(self.trainer.precision_plugin, "scaler", None) is not None  # a GradScaler's business
        optimizer.step(closure=self.gradient_check.closure(optimizer, optimizer_closure, scaled, self.global_step,
                                                           batch_idx))

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        log_optimizer_step(self, optimizer, self.gradient_check.take_norm())  # the check's norm, this step's only

    def _log_skipped(self) -> None:
        log_skipped(self, self.nonfinite.skipped_steps)

    # ---------------------------------------------------------------------------- validation and test
    def validation_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        log_exact_metrics(self, batch, self.val_metrics, "val")  # the unpruned objective (lit_prunedpo.run.validation)

    def test_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        log_exact_metrics(self, batch, self.test_metrics, "test")

    def exact_pair_metrics(self, batch: PreferenceBatch) -> dict[str, Tensor]:
        """Per-pair metrics (``loss``, ``rewards/accuracies``, ...) of the unpruned objective, whatever the samplers:
        what validation and test log, and the study's harness evaluates with (``study.runner.exact_eval``)."""
        return pair_metrics(exact_step(self, batch)[2], self.beta)

    # ---------------------------------------------------------------------------- failure policy
    skipped_steps = property(lambda self: self.nonfinite.skipped_steps,
                             doc="Steps skipped for a non-finite loss or gradient, in the whole run (resumes too).")
    skipped_in_a_row = property(lambda self: self.nonfinite.skipped_in_a_row, doc="Skipped steps in a row, now.")

    # ------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from lit_prunedpo.checkpoint import install_atomic_io

        refuse_nonfinite_weights(checkpoint, self.global_step)
        if self._trainer is not None:  # a plain Trainer's atomic writes: the strategy writes after this hook
            install_atomic_io(self._trainer)
        checkpoint.update(self.run_state.state_dict())  # the samplers' stream, counters, optimizer set-up
        save_policy_state(checkpoint, self.policy, self.policy_source, self._sharded)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        load_policy_state(checkpoint, self.policy, self.policy_source, getattr(self._trainer, "ckpt_path", None))
        self.run_state.load_state_dict(checkpoint, self.sampler_seed)  # the optimizer's, applied at train start
