"""What a ``PrunedDPO`` checkpoint carries beside the weights, and how a resume takes it back.

:class:`RunState` holds the run's counters and streams, saved and loaded as one state dict:

* ``sampler_rng``: the samplers' generator, so that a resumed run draws what an uninterrupted one would;
* the non-finite step counters (``lit_prunedpo.run.nonfinite``), so that a resume keeps counting toward the limit;
* ``num_tokens``: TRL's count of input tokens, which a resumed run goes on counting (TRL's restarts from 0);
* ``optimizer_setup``: the run's optimizer and scheduler arguments (``lit_prunedpo.run.optimizer_setup``), applied
  back once Lightning has restored the optimizer and scheduler (at train start).

Beside it, :func:`save_policy_state` writes what an export needs besides the weights
(:func:`lit_prunedpo.export.policy.policy_metadata`); a LoRA policy's checkpoint holds its adapters only
(``lit_prunedpo.lora``). :func:`load_policy_state` checks the checkpoint against the policy and rebuilds a LoRA
base from its source, before Lightning loads the weights.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from lit_prunedpo.run.nonfinite import NonFiniteGuard
from lit_prunedpo.run.optimizer_setup import OptimizerRecord
from lit_prunedpo.rng import SamplerRNG


class RunState:
    """A run's state beside its weights (module docstring).

    Args:
        nonfinite: the failure policy and its counts.
    """

    def __init__(self, nonfinite: NonFiniteGuard) -> None:
        self.sampler_rng = SamplerRNG()  # seeded at set-up (PrunedDPO.setup)
        self.nonfinite = nonfinite
        self.num_tokens = 0  # TRL's num_tokens: input tokens of every rank's training batches so far
        self.optimizer = OptimizerRecord()

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's entries (module docstring)."""
        return {"sampler_rng": self.sampler_rng.state_dict(), **self.nonfinite.state_dict(),
                "num_tokens": self.num_tokens, **self.optimizer.state_dict()}

    def load_state_dict(self, checkpoint: dict[str, Any], sampler_seed: int | None = None) -> None:
        """Take the run state back from ``checkpoint``. A checkpoint without the samplers' generator state restarts
        their draws, with a warning; a sampler seed that differs from ``sampler_seed`` (the configured one) is the
        checkpoint's, said in one line."""
        self.nonfinite.load_state_dict(checkpoint)
        self.num_tokens = int(checkpoint.get("num_tokens", 0))
        self.optimizer.load_state_dict(checkpoint)
        state = checkpoint.get("sampler_rng")
        if state is None:
            rank_zero_warn("checkpoint has no sampler generator state: sampler draws restart from step 0")
            return
        if sampler_seed is not None and int(state["seed"]) != sampler_seed:
            rank_zero_info(f"resuming with the checkpoint's sampler seed {state['seed']} (config says {sampler_seed})")
        self.sampler_rng.load_state_dict(state)


def save_policy_state(checkpoint: dict[str, Any], policy: nn.Module, source: Any, sharded: bool) -> None:
    """Write the policy's metadata into ``checkpoint``; drop a LoRA policy's frozen base from its weights, except
    under FSDP2 (``sharded``), whose sharded checkpoint keeps the base (Lightning's sharded loader asks for every
    key)."""
    from lit_prunedpo.lora import drop_frozen, is_peft_model
    from lit_prunedpo.export.policy import policy_metadata

    checkpoint["policy"] = policy_metadata(policy, source)
    if is_peft_model(policy) and not sharded:
        drop_frozen(checkpoint["state_dict"], policy)


def load_policy_state(checkpoint: dict[str, Any], policy: nn.Module, source: Any, where: str | None) -> None:
    """Check ``checkpoint`` (read from ``where``) against ``policy`` (another model type, LoRA against a full model,
    another size: one line before Lightning's lists of keys) and rebuild a LoRA base from ``source``."""
    from lit_prunedpo.lora import restore_base
    from lit_prunedpo.export.policy import check_resumed_policy

    check_resumed_policy(checkpoint, policy, where)
    restore_base(checkpoint, policy, source, where=where)
