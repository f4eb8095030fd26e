"""Learning-rate schedules that ``torch`` lacks as a class (LightningCLI needs a class to configure), and a resume
that keeps the optimizer and scheduler arguments the command line gives.

A resumed ``fit`` restores the optimizer's and the scheduler's state from the checkpoint, hyperparameters
included: the checkpoint's learning rate, and the checkpoint's ``total_steps``, silently replaced what this
run's configuration says. Here:

* :class:`WarmupCosineLR` left with ``total_steps: None`` follows this run's trainer (``max_steps``) also after a
  resume: a larger ``max_steps`` extends the schedule (logged), instead of the checkpoint's total holding the
  rate at its final value (0 by default) for every later step. By default (``on_extension: continue``) the rate
  goes on from where the checkpoint left it, down a cosine to the floor at the new end: no jump. Re-fitting the
  whole warm-up and cosine to the new total (``stretch``, what transformers' Trainer does on such a resume) puts
  the rate back up at the resume step, which undid a finished run's last steps in the issue that asked for this.
  A schedule that had already ended at rate 0 cannot continue (every added step would train at rate 0): that
  resume is refused, naming both ways on.
* :func:`describe` records the classes and constructor arguments of a run's optimizer and scheduler (in every
  checkpoint, by ``PrunedDPO``); :func:`apply_changes` compares the checkpoint's record with this run's once
  the state is restored, and applies every argument that differs (the rate in the optimizer's groups, the
  scheduler's ``base_lrs`` and ``initial_lr``, and its current rate), one logged line per argument. A change
  that cannot be carried over (another optimizer or scheduler class, an argument the restored objects do not
  hold) is refused with a message. The record is the objects' own (``optimizer.defaults``, the scheduler's
  attributes), not the module's saved hyperparameters: ``PrunedDPO`` saves none, on purpose, since LightningCLI
  parses a checkpoint's hyperparameters *over* the command line's (``--ckpt_path`` would then undo
  ``--model.optimizer.init_args.lr``).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, MultiplicativeLR, ReduceLROnPlateau

__all__ = ["WarmupCosineLR", "apply_changes", "describe"]

#: Constructor arguments of a scheduler that are not its configuration.
_NOT_CONFIG = {"self", "optimizer", "last_epoch", "verbose", "lr_lambda"}


class WarmupCosineLR(LambdaLR):
    """Linear warm-up from 0 to the base rate, then cosine decay to ``min_lr_ratio`` of it.

    Args:
        optimizer: the wrapped optimizer.
        warmup_steps: optimizer steps of linear warm-up (>= 0).
        total_steps: optimizer steps of the whole run; ``None`` lets ``PrunedDPO`` fill in the trainer's
            estimated number of stepping batches before training starts (again on a resume: a resume with a
            larger ``max_steps`` extends the schedule).
        min_lr_ratio: final rate as a fraction of the base rate, in [0, 1].
        on_extension: what a resume whose ``max_steps`` changes the total does after the warm-up: ``continue``
            from the rate at the resume step down a cosine to ``min_lr_ratio`` at the new end, or ``stretch`` the
            whole schedule over the new total (the rate at the resume step jumps to the new schedule's).
    """

    def __init__(
        self, optimizer: Optimizer, warmup_steps: int = 0, total_steps: int | None = None, min_lr_ratio: float = 0.0,
        on_extension: Literal["continue", "stretch"] = "continue",
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"total_steps must be >= 1 or None, got {total_steps!r}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
        if on_extension not in ("continue", "stretch"):
            raise ValueError(f"on_extension must be 'continue' or 'stretch', got {on_extension!r}")
        self.warmup_steps = int(warmup_steps)
        self.total_steps = total_steps
        self.min_lr_ratio = float(min_lr_ratio)
        self.follows_trainer = total_steps is None
        self.on_extension = on_extension
        self.anchor: tuple[int, float] | None = None  # (step, factor) a continued extension decays from
        super().__init__(optimizer, self._factor)

    def _factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.total_steps is None:
            return 1.0
        if self.anchor is not None and step >= self.anchor[0]:
            start, factor = self.anchor
            progress = min(1.0, (step - start) / max(1, self.total_steps - start))
            return self.min_lr_ratio + (factor - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def fit_to(self, run_steps: int) -> None:
        """Make the schedule span a run of ``run_steps`` optimizer steps: fills ``total_steps`` when it was left
        ``None``; warns when a ``total_steps`` that was given ends before the run does, and when the warm-up does
        not end before the run does (the rate never reaches the base rate)."""
        if self.warmup_steps >= run_steps:
            rank_zero_warn(
                f"model.scheduler.init_args.warmup_steps={self.warmup_steps} is not less than this run's {run_steps} "
                f"optimizer steps (trainer.max_steps): the learning rate never reaches the set rate (the last step's "
                f"is {run_steps / (self.warmup_steps + 1):.0%} of it); lower warmup_steps or raise trainer.max_steps"
            )
        if self.follows_trainer:
            self.total_steps = int(run_steps)
        elif self.total_steps < run_steps:
            rank_zero_warn(
                f"model.scheduler.init_args.total_steps={self.total_steps} is less than this run's {run_steps} "
                f"optimizer steps: the learning rate stays at min_lr_ratio={self.min_lr_ratio} times the base rate "
                f"from step {self.total_steps} on. Leave total_steps unset to follow trainer.max_steps"
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # The state holds the checkpoint's total_steps (filled from *its* trainer): a total that follows this run's
        # trainer is kept, so that a resume with a larger max_steps extends the schedule. Whether it follows the
        # trainer, and what an extension does, are this run's configuration too (apply_changes applies a
        # total_steps that was changed).
        # min_lr_ratio too, so that the rate an extension continues from is this configuration's (apply_changes
        # logs the change; it sets the rates as if this configuration had run all along)
        mine = {k: getattr(self, k) for k in ("follows_trainer", "on_extension", "min_lr_ratio")}
        follows, filled = self.follows_trainer, self.total_steps
        super().load_state_dict(state_dict)
        self.__dict__.update(mine)
        self.anchor = state_dict.get("anchor")
        if follows and filled is not None and self.total_steps != filled:
            self._refit(filled)

    def _refit(self, total: int) -> None:
        """Make the restored schedule end at ``total`` (module docstring), say how in one line, and set the rate
        of the next step (Lightning restores the optimizer's groups, and the rate the old schedule gave them,
        before this state), not only from the first scheduler step on."""
        step, previous = self.last_epoch, self.total_steps
        if step >= total:  # nothing left to train (FinalCheckpoint says so): no schedule to continue or refuse
            self.total_steps = total
            return
        base = self.base_lrs[0]
        before = self._factor(step)
        self.total_steps, anchor = total, self.anchor
        self.anchor = None
        stretched = self._factor(step)
        change = "extended" if previous is None or previous < total else "shortened"
        head = (f"resume: WarmupCosineLR schedule {change} from {previous} to {total} steps (total_steps follows the "
                "trainer's max_steps)")
        if self.on_extension == "stretch" or step < self.warmup_steps:
            rank_zero_info(f"{head}: the whole schedule re-fitted to {total} steps, rate {base * stretched:.3g} at "
                           f"step {step} (was {base * before:.3g})")
        elif before <= 0.0:
            raise ValueError(
                f"{head}, but the checkpoint's schedule had ended at rate 0 at step {step}: continued, every added "
                f"step would train at rate 0. Set model.scheduler.init_args.on_extension=stretch to re-fit the warm-up "
                f"and cosine to {total} steps (rate {base * stretched:.3g} at step {step}), or min_lr_ratio > 0 to go "
                "on at that floor")
        else:
            self.anchor = (step, before) if anchor is None or step > anchor[0] else anchor
            rank_zero_info(f"{head}: the rate continues from {base * before:.3g} at step {step} down a cosine to "
                           f"{base * self.min_lr_ratio:.3g} at step {total} (on_extension=stretch would re-fit the "
                           f"whole schedule instead: rate {base * stretched:.3g} at step {step})")
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * self._factor(step)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


# ------------------------------------------------------------------------------------------------ resume
def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _qualname(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def _scheduler_args(scheduler: Any) -> dict[str, Any]:
    """The scheduler's constructor arguments it keeps as attributes of the same name (plain values only)."""
    if scheduler is None:
        return {}
    names = [n for n in inspect.signature(type(scheduler).__init__).parameters if n not in _NOT_CONFIG]
    return {n: getattr(scheduler, n) for n in names if hasattr(scheduler, n) and _plain(getattr(scheduler, n))}


def describe(
    optimizer: Optimizer, scheduler: Any = None, scheduler_given: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The classes and constructor arguments of an optimizer (``defaults``: every argument, given or default) and
    of its scheduler (``None``: none), as plain values that a checkpoint can hold.

    ``scheduler_given``: the arguments the scheduler was built with (a ``functools.partial``'s ``keywords``, which
    is what LightningCLI passes: every argument), over the ones it keeps as attributes of the same name; so that
    a changed argument it keeps elsewhere (``OneCycleLR``'s ``max_lr``) is seen, and refused.
    """
    given = {k: v for k, v in (scheduler_given or {}).items() if _plain(v) and k not in _NOT_CONFIG}
    return {
        "optimizer": _qualname(optimizer),
        "optimizer_args": {k: v for k, v in optimizer.defaults.items() if _plain(v)},
        "scheduler": _qualname(scheduler),
        "scheduler_args": {**_scheduler_args(scheduler), **given} if scheduler is not None else {},
    }


def _refuse(what: str) -> None:
    raise ValueError(
        f"resume: {what}. Resume with the checkpoint's setting, or start a new run from the checkpoint's weights "
        "(lit-prunedpo export, then model.policy: lit_prunedpo.models.Pretrained)"
    )


def apply_changes(saved: dict[str, Any], configured: dict[str, Any], in_effect: dict[str, Any],
                  optimizer: Optimizer, scheduler: Any = None) -> list[str]:
    """Apply this run's optimizer and scheduler arguments over the state restored from a checkpoint.

    Args:
        saved: :func:`describe` of the run that wrote the checkpoint, as configured.
        configured: :func:`describe` of this run's optimizer and scheduler as configured (before
            :meth:`WarmupCosineLR.fit_to`).
        in_effect: :func:`describe` of them as built for this run (after it, without ``scheduler_given``: the
            attributes), before the checkpoint's state was loaded: the values to apply.
        optimizer, scheduler: this run's, with the checkpoint's state loaded.

    Returns:
        The names of the arguments applied (each also logged).

    Raises:
        ValueError: another optimizer or scheduler class than the checkpoint's, or a changed argument that the
            restored objects do not hold (so it cannot be applied).
    """
    for kind in ("optimizer", "scheduler"):
        if saved.get(kind) != configured[kind]:
            _refuse(f"the checkpoint was trained with model.{kind} {saved.get(kind) or 'none'}, this run has "
                    f"{configured[kind] or 'none'}: the checkpoint's {kind} state cannot be carried over to another "
                    "class")
    applied = []
    old, new = saved.get("optimizer_args", {}), configured["optimizer_args"]
    changed = [k for k in new if k in old and old[k] != new[k] and k != "lr"]
    for key in changed:
        if any(key not in group for group in optimizer.param_groups):
            _refuse(f"model.optimizer.init_args.{key} changed ({old[key]!r} -> {new[key]!r}) but the restored "
                    "optimizer has no such setting in its parameter groups, so it cannot be applied")
        for group in optimizer.param_groups:
            group[key] = new[key]
    old_s, new_s = saved.get("scheduler_args", {}), configured["scheduler_args"]
    changed_s = [k for k in new_s if k in old_s and old_s[k] != new_s[k]]
    for key in changed_s:
        if key not in in_effect["scheduler_args"]:
            _refuse(f"model.scheduler.init_args.{key} changed ({old_s[key]!r} -> {new_s[key]!r}) but the restored "
                    f"{_qualname(scheduler)} keeps it in no attribute of that name, so it cannot be applied")
        setattr(scheduler, key, in_effect["scheduler_args"][key])
    lr_changed = "lr" in new and "lr" in old and old["lr"] != new["lr"]
    if lr_changed or changed_s:
        _set_rates(optimizer, scheduler, new["lr"] if lr_changed else None, old.get("lr"))
    for key in changed + (["lr"] if lr_changed else []):
        rank_zero_info(f"resume: model.optimizer.init_args.{key} is {new[key]!r} (the checkpoint's: {old[key]!r}): "
                       "applied over the restored optimizer state")
    for key in changed_s:
        rank_zero_info(f"resume: model.scheduler.init_args.{key} is {new_s[key]!r} (the checkpoint's: {old_s[key]!r}): "
                       "applied over the restored scheduler state")
    return [f"optimizer.{k}" for k in changed + (["lr"] if lr_changed else [])] + [f"scheduler.{k}" for k in changed_s]


def _set_rates(optimizer: Optimizer, scheduler: Any, base: float | None, old_base: float | None) -> None:
    """Set the optimizer's current rates from its base rate ``base`` (``None``: unchanged) and the scheduler's
    position, as the scheduler would have them had it run with this configuration all along."""
    groups = optimizer.param_groups
    if scheduler is None:
        if base is not None:
            for group in groups:
                group["lr"] = base
        return
    if base is not None:
        for group in groups:
            if "initial_lr" in group:
                group["initial_lr"] = base
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [base] * len(groups)
    if isinstance(scheduler, LambdaLR):
        rates = [b * f(scheduler.last_epoch) for b, f in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    elif hasattr(scheduler, "_get_closed_form_lr"):  # StepLR, CosineAnnealingLR, LinearLR, ...: rate of (base, step)
        rates = scheduler._get_closed_form_lr()
    elif isinstance(scheduler, (MultiplicativeLR, ReduceLROnPlateau)) and base is not None and old_base:
        rates = [group["lr"] * base / old_base for group in groups]  # the rate is the base rate times its factors
    elif base is None:
        return  # an argument the scheduler reads at its next step
    else:
        _refuse(f"model.optimizer.init_args.lr changed ({old_base!r} -> {base!r}) but the current rate of "
                f"{_qualname(scheduler)} cannot be recomputed from a new base rate")
    for group, rate in zip(groups, rates):
        group["lr"] = rate
    scheduler._last_lr = [group["lr"] for group in groups]
