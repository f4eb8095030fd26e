"""``PrunedDPO``: the LightningModule that wires samplers, scorer, reference and loss into a DPO step.

A training step (:meth:`PrunedDPO.step`, the one step of the code base: ``training_step``, the benchmark and the
study all run it) reads in the order data flows:

    plan      samplers draw branches, prefixes and positions (``plan.plan_step``), before any compute
    execute   the executor lays the row groups out and runs them: the gradient rows, then the no-grad rows,
              then the reference on the same truncated inputs (``execute.StepExecutor``)
    estimate  IPW sums, margin and the single-branch surrogate (``estimate.estimate``)
    backward  Lightning back-propagates the returned objective

With every sampler at "no pruning" this is concatenated DPO: one forward of the ``2B`` rows with a graph and
one reference forward. Validation and test always compute the exact, unpruned objective, so runs with
different samplers compare.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.conformance import AutoLayout, LayoutChoice, choose_layout, unchecked_layout
from lit_prunedpo.estimate import Estimate, estimate
from lit_prunedpo.execute import StepExecutor, StepLogps, keeps_keys_values, layout_for, score_groups
from lit_prunedpo.guards import check_log_softmax_split, check_positions, refuse_nonfinite_weights
from lit_prunedpo.layout import Layout, SharedPromptLayout
from lit_prunedpo.losses import PreferenceLoss, SigmoidLoss, trl_loss
from lit_prunedpo.metrics import (
    PAIR_METRICS, TOKEN_METRICS, MetricWindow, StepStats, gradient_norm, input_tokens, pair_metrics, token_metrics,
    weighted_mean,
)
from lit_prunedpo.models import ModelSource
from lit_prunedpo.nonfinite import NonFiniteGuard
from lit_prunedpo.optim import WarmupCosineLR, apply_changes, describe
from lit_prunedpo.plan import RowGroup, StepPlan, exact_plan, plan_step
from lit_prunedpo.distributed import agree_on_forwards
from lit_prunedpo.reference import ReferenceRuntime, ReferenceSource, reference_for
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo.warning_scope import IgnoredWarning
from lit_prunedpo.samplers import (
    AllPositions,
    BothBranches,
    BranchSampler,
    FullPrefix,
    PositionSampler,
    PrefixSampler,
)
from lit_prunedpo.scoring import TokenScorer
from lit_prunedpo.step import StepOutput, StepParts
from lit_prunedpo.training_noise import disable_training_noise, noise_free_training, training_switches

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
            training mode (:mod:`lit_prunedpo.training_noise`); the conformance check then also compares the
            policy's training-mode log-probs with its plain eval-mode forward.
        on_nonfinite: ``raise`` stops at a non-finite loss or gradient naming the step and its parts; ``skip``
            skips the step's update (on every rank together), counts, warns and logs it; the step's own (non-finite)
            values are logged either way (``lit_prunedpo.nonfinite``).
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
            ``false`` is ``PaddedLayout``; give ``layout`` or this, not both.
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
        self.nonfinite = NonFiniteGuard(on_nonfinite, max_consecutive_skips)
        self.beta = float(beta)
        if isinstance(loss, (str, list)):
            loss = trl_loss(loss)  # TRL's names, as a TRL user writes them
        self.loss = loss if loss is not None else SigmoidLoss()
        self.prefix_sampler = prefix_sampler if prefix_sampler is not None else FullPrefix()
        self.position_sampler = position_sampler if position_sampler is not None else AllPositions()
        self.branch_sampler = branch_sampler if branch_sampler is not None else BothBranches()
        self.scorer = scorer if scorer is not None else TokenScorer()
        self.optimizer_factory = optimizer if optimizer is not None else torch.optim.AdamW
        self.scheduler_factory = scheduler
        self.sampler_seed = sampler_seed

        # from_pretrained returns a model in eval mode, and Lightning keeps modules' modes: a policy left in
        # eval mode would silently skip gradient checkpointing, which transformers applies only in training.
        self.policy = policy.build().train()
        self.policy_source = policy  # its spec goes into checkpoints, for lit_prunedpo.export
        self.disable_dropout = bool(disable_dropout)
        if self.disable_dropout:
            disable_training_noise(self.policy)
            noise_free_training(self.policy)
        if gradient_checkpointing:
            # transformers 5 renamed it (the old name warns at every run); transformers 4 has only the old one
            enable = getattr(self.policy, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.reference = reference_for(self.loss, reference)
        self.reference.configure(self.policy, self.scorer)
        if layout is not None and shared_prompt is not None:
            raise ValueError("give model.layout or model.shared_prompt (its older shorthand), not both")
        self.layout = layout_for(shared_prompt) if shared_prompt is not None else (layout or AutoLayout())
        self.check_layout = bool(check_layout)
        self.strict_layout = bool(strict_layout)
        self._layout_choice: LayoutChoice | None = None

        self.sampler_rng = SamplerRNG()
        self._eval_mode_warning = IgnoredWarning(r"Found \d+ module\(s\) in eval mode at the start of training")
        self.step_stats: StepStats | None = None
        self._window = MetricWindow()
        self._grad_norm: Tensor | None = None  # this optimizer step's, checked before the update, then logged
        self._sharded = False  # set by configure_model under FSDP2
        self.num_tokens = 0  # TRL's num_tokens: input tokens of every rank's training batches so far
        self.val_metrics = nn.ModuleDict({_key(n): MeanMetric() for n in PAIR_METRICS + TOKEN_METRICS})
        self.test_metrics = nn.ModuleDict({_key(n): MeanMetric() for n in PAIR_METRICS + TOKEN_METRICS})

    # ----------------------------------------------------------------------------------------- set-up
    def on_fit_start(self) -> None:
        # Lightning warns about every module in eval mode at the start of fit; the frozen reference always is,
        # by design. That warning is replaced by the one that matters: a policy module left in eval mode.
        # Lightning warns just before on_train_start, which closes the scope.
        self._eval_mode_warning.open()
        modules = self.policy.named_modules()
        if self.disable_dropout:  # eval mode everywhere but the decoder layers is how its noise stays off
            noise_free_training(self.policy)
            modules = training_switches(self.policy)
        frozen = [name or "policy" for name, m in modules if not m.training]
        if frozen:
            rank_zero_warn(f"{len(frozen)} policy module(s) are in eval mode at the start of training, e.g. {frozen[:3]}")

    def on_train_start(self) -> None:
        self._window = MetricWindow()  # a resumed run's window starts with its first step
        self._eval_mode_warning.close()
        self._apply_resumed_setup()

    def teardown(self, stage: str) -> None:
        self._eval_mode_warning.close()

    def setup(self, stage: str) -> None:
        seed = self.sampler_seed if self.sampler_seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))
        self.sampler_rng = SamplerRNG(seed=seed, rank=self.global_rank)
        self._check_vocabulary()
        datamodule = getattr(self._trainer, "datamodule", None)
        check_positions(self.policy, datamodule)
        self.reference.prepare(self.policy, datamodule, ReferenceRuntime.of(self._trainer))
        check_log_softmax_split(self.position_sampler, self.policy, self.reference)

    def _check_vocabulary(self) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        data_vocab = getattr(datamodule, "vocab_size", None)
        model_vocab = self.policy.get_input_embeddings().num_embeddings
        if data_vocab is not None and data_vocab > model_vocab:
            raise ValueError(
                f"the data's tokenizer has {data_vocab} tokens but the policy's embedding has {model_vocab}: "
                "set the model config's vocab_size to at least the tokenizer's"
            )

    def configure_model(self) -> None:
        """Shard the policy, and an online reference's frozen model, with FSDP2 per decoder layer when the
        strategy provides a device mesh (``lit_prunedpo.distributed.FSDP2Strategy`` or Lightning's
        ``ModelParallelStrategy``); a no-op for every other strategy. See ``lit_prunedpo.distributed``."""
        if self.device_mesh is None or self._sharded:
            return
        from lit_prunedpo.distributed import shard_pruned_dpo

        shard_pruned_dpo(self, self.device_mesh)
        self._sharded = True

    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params)
        scheduler = None if self.scheduler_factory is None else self.scheduler_factory(optimizer)
        # saved in checkpoints; a resume compares it with its own
        configured = describe(optimizer, scheduler, getattr(self.scheduler_factory, "keywords", None))
        if isinstance(scheduler, WarmupCosineLR):
            scheduler.fit_to(int(self.trainer.estimated_stepping_batches))
        self._optimizer_setup = (configured, describe(optimizer, scheduler))
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _apply_resumed_setup(self) -> None:
        """After Lightning restored the optimizer and scheduler state (before the first step): apply this run's
        optimizer and scheduler arguments where they differ from the checkpoint's (``lit_prunedpo.optim``)."""
        saved, self._resumed_setup = getattr(self, "_resumed_setup", None), None
        setup = getattr(self, "_optimizer_setup", None)
        if saved == "unrecorded":
            rank_zero_warn("resume: the checkpoint records no optimizer or scheduler arguments (written by an older "
                           "lit_prunedpo): the restored optimizer and scheduler keep the checkpoint's, learning rate "
                           "included, whatever this run's model.optimizer and model.scheduler say")
            return
        if saved is None or setup is None or len(self.trainer.optimizers) != 1:
            return
        schedulers = self.trainer.lr_scheduler_configs
        apply_changes(saved, *setup, self.trainer.optimizers[0], schedulers[0].scheduler if schedulers else None)

    def train(self, mode: bool = True) -> "PrunedDPO":
        super().train(mode)
        if mode and getattr(self, "disable_dropout", False):
            noise_free_training(self.policy)  # whatever turned training mode on, the policy's noise stays off
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
                                       train_noise_check=self.disable_dropout)
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
        a callback replacing a sampler (``PruneEarly``) takes effect at the next one."""
        return StepParts(
            self.prefix_sampler, self.position_sampler, self.branch_sampler, self.scorer, self.reference,
            self.resolved_layout(),
        )

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

    def score_policy(self, batch: PreferenceBatch, group: RowGroup, scorer: TokenScorer | None = None) -> Tensor:
        """The policy's log-probs of one group, alone in its forward, laid out as this module lays its steps out:
        a graph only for the gradient rows; ``scorer`` ``None`` is the module's."""
        scorer = self.scorer if scorer is None else scorer
        return score_groups(scorer, self.policy, batch, [group], self.resolved_layout())[0]

    def execute_and_estimate(self, batch: PreferenceBatch, plan: StepPlan, parts: StepParts | None = None) -> Estimate:
        """Stages 2 and 3: policy and reference forwards, then the IPW estimate."""
        return self.estimate(batch, plan, self.execute(batch, plan, parts))

    def training_step(self, batch: PreferenceBatch, batch_idx: int) -> Tensor | None:
        # TRL's token metrics take one more pass over the scored logits: only on the steps whose logs are written
        logged = self._logs_this_step()
        out = self.step(batch, token_stats=logged)
        est = out.estimate
        self.step_stats = out.stats
        self._count_tokens(batch)
        finite = self.nonfinite.loss_ok(est, batch, batch_idx, self.global_step, self._trainer and self.trainer.strategy)
        B = batch.num_pairs
        # every step into the window, a skipped one with its own (non-finite) values, never the previous step's
        self._window.add({**{f"train/{k}": v.mean() for k, v in pair_metrics(est, self.beta).items()},
                          **{f"train/{k}": v for k, v in self.step_stats.as_metrics().items()}})
        if not finite:
            self.log("train/skipped_nonfinite_steps", float(self.skipped_steps), on_step=True, on_epoch=False)
        if logged:  # TRL's: the means over the steps since the last log; the token metrics of this step alone
            values = self._window.pop_means()
            tokens = token_metrics(out.plan, out.logps.policy_token_stats, B)
            values.update({f"train/{k}": weighted_mean(v, w) for k, (v, w) in tokens.items()})
            # float64, so that the count stays exact past float32's 2**24 (Lightning keeps a step-only value's dtype)
            values["train/num_tokens"] = torch.tensor(self.num_tokens, dtype=torch.float64)
            # the mean over ranks, as TRL gathers every rank's values (only on logged steps: one small all-reduce)
            self.log("train/loss", values.pop("train/loss"), on_step=True, on_epoch=False, prog_bar=True, batch_size=B,
                     sync_dist=True)
            self.log_dict(values, on_step=True, on_epoch=False, batch_size=B, sync_dist=True)
        return est.objective if finite else None

    def _logs_this_step(self) -> bool:
        """Whether Lightning writes this training step's on-step logs (every ``log_every_n_steps``, and the last);
        True outside a trainer."""
        connector = getattr(self._trainer, "_logger_connector", None)
        return bool(getattr(connector, "should_update_logs", True))

    def _count_tokens(self, batch: PreferenceBatch) -> None:
        """Add the batch's input tokens, summed over ranks (TRL gathers them too), to :attr:`num_tokens`."""
        count = input_tokens(batch)
        if self._trainer is not None and self.trainer.world_size > 1:
            count = int(self.trainer.strategy.reduce(torch.tensor(count, device=self.device), reduce_op="sum"))
        self.num_tokens += count

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        if optimizer_closure is None:
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

        def closure() -> Any:  # runs the step and its backward; the gradient is checked before the update
            loss = optimizer_closure()
            self._check_gradient(optimizer, batch_idx, loss is not None)
            return loss

        optimizer.step(closure=closure)

    def _check_gradient(self, optimizer: torch.optim.Optimizer, batch_idx: int, has_loss: bool) -> None:
        """A non-finite gradient never reaches the weights (``lit_prunedpo.nonfinite``): under ``skip`` the
        gradients are dropped, so the optimizer's update changes nothing."""
        self._grad_norm = None
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            if has_loss:  # a GradScaler skips infinite (scaled) gradients itself
                self.nonfinite.finite_step()
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._grad_norm = gradient_norm(params)
        if not self.nonfinite.gradient_ok(self._grad_norm, self.global_step, batch_idx):
            for p in params:
                p.grad = None
            self.log("train/skipped_nonfinite_steps", float(self.skipped_steps), on_step=True, on_epoch=False)
        elif has_loss:
            self.nonfinite.finite_step()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Lightning calls this after the (accumulated) backward, with gradients unscaled and not yet clipped:
        # grad_norm is the norm that gradient clipping compares with gradient_clip_val, as TRL's (transformers').
        # A step without a gradient (skipped) logs NaN, not the previous step's norm.
        self.log("train/learning_rate", float(optimizer.param_groups[0]["lr"]), on_step=True, on_epoch=False)
        norm, self._grad_norm = self._grad_norm, None
        if norm is None:
            norm = gradient_norm(p for group in optimizer.param_groups for p in group["params"])
        self.log("train/grad_norm", norm if norm is not None else float("nan"), on_step=True, on_epoch=False)

    def validation_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        self._exact_step(batch, self.val_metrics, "val")

    def test_step(self, batch: PreferenceBatch, batch_idx: int) -> None:
        self._exact_step(batch, self.test_metrics, "test")

    def exact_pair_metrics(self, batch: PreferenceBatch) -> dict[str, Tensor]:
        """Per-pair metrics (``loss``, ``rewards/accuracies``, ...) of the unpruned objective: every position of
        every whole response, whatever the samplers are. What validation and test log, and what the study's
        harness evaluates with (``lit_prunedpo.study.runner.exact_eval``)."""
        return pair_metrics(self._exact(batch)[2], self.beta)

    def _exact(self, batch: PreferenceBatch, token_stats: bool = False) -> tuple[StepPlan, StepLogps, Estimate]:
        batch.validate()
        plan = exact_plan(batch)
        logps = self.execute(batch, plan, token_stats=token_stats)
        return plan, logps, self.estimate(batch, plan, logps)

    def _exact_step(self, batch: PreferenceBatch, metrics: nn.ModuleDict, prefix: str) -> None:
        plan, logps, est = self._exact(batch, token_stats=True)  # validation also logs TRL's token metrics
        for name, value in pair_metrics(est, self.beta).items():
            metric = metrics[_key(name)]
            metric.update(value)
            self.log(f"{prefix}/{name}", metric, on_step=False, on_epoch=True, prog_bar=name == "rewards/accuracies")
        for name, (value, weight) in token_metrics(plan, logps.policy_token_stats, batch.num_pairs).items():
            metric = metrics[_key(name)]
            metric.update(value, weight)  # token-weighted, as TRL's: sum(value * weight) / sum(weight)
            self.log(f"{prefix}/{name}", metric, on_step=False, on_epoch=True)

    # ---------------------------------------------------------------------------- failure policy
    @property
    def skipped_steps(self) -> int:
        """Steps skipped for a non-finite loss or gradient, over the whole run (resumes included)."""
        return self.nonfinite.skipped_steps

    @property
    def skipped_in_a_row(self) -> int:
        return self.nonfinite.skipped_in_a_row

    # ------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from lit_prunedpo.checkpointing import install_atomic_io

        refuse_nonfinite_weights(checkpoint, self.global_step)
        # A plain Trainer gets the atomic writes too: the strategy writes this checkpoint after this hook.
        if self._trainer is not None:
            install_atomic_io(self._trainer)
        checkpoint["sampler_rng"] = self.sampler_rng.state_dict()
        checkpoint.update(self.nonfinite.state_dict())  # a resume keeps counting toward the limit
        checkpoint["num_tokens"] = self.num_tokens  # a resumed run goes on counting (TRL's restarts from 0)
        if getattr(self, "_optimizer_setup", None) is not None:
            checkpoint["optimizer_setup"] = self._optimizer_setup[0]  # this run's configuration, for a resume
        from lit_prunedpo.export import policy_metadata
        from lit_prunedpo.lora import drop_frozen, is_peft_model

        checkpoint["policy"] = policy_metadata(self.policy, self.policy_source)
        if is_peft_model(self.policy) and not self._sharded:  # LoRA: adapters only (see lit_prunedpo.lora)
            drop_frozen(checkpoint["state_dict"], self.policy)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from lit_prunedpo.lora import restore_base

        restore_base(checkpoint, self.policy, self.policy_source, where=getattr(self._trainer, "ckpt_path", None))
        self.nonfinite.load_state_dict(checkpoint)
        self.num_tokens = int(checkpoint.get("num_tokens", 0))
        # applied (or warned about) once Lightning has restored the optimizer state
        unrecorded = "unrecorded" if "optimizer_states" in checkpoint else None
        self._resumed_setup = checkpoint.get("optimizer_setup", unrecorded)
        state = checkpoint.get("sampler_rng")
        if state is None:
            rank_zero_warn("checkpoint has no sampler generator state: sampler draws restart from step 0")
            return
        if self.sampler_seed is not None and int(state["seed"]) != self.sampler_seed:
            rank_zero_info(f"resuming with the checkpoint's sampler seed {state['seed']} (config says {self.sampler_seed})")
        self.sampler_rng.load_state_dict(state)


def _key(name: str) -> str:
    return name.replace("/", "__")
