"""What a ``PrunedDPO`` checkpoint carries beside the weights, and how a resume takes it back.

Saved by ``on_save_checkpoint`` (:func:`save_run_state`):

* ``sampler_rng``: the samplers' generator, so that a resumed run draws what an uninterrupted one would;
* the non-finite step counters (``lit_prunedpo.nonfinite``), so that a resume keeps counting toward the limit;
* ``num_tokens``: TRL's count of input tokens, which a resumed run goes on counting (TRL's restarts from 0);
* ``optimizer_setup``: the run's optimizer and scheduler arguments (``lit_prunedpo.optim.describe``);
* ``policy``: what an export needs besides the weights (:func:`lit_prunedpo.policy_checkpoint.policy_metadata`);
  a LoRA policy's checkpoint holds its adapters only (``lit_prunedpo.lora``).

Read back by ``on_load_checkpoint`` (:func:`load_run_state`): the same, the LoRA base rebuilt from its source and
checked first. The checkpoint's optimizer arguments wait until Lightning has restored the optimizer and scheduler
(``lit_prunedpo.optimizer_setup.apply_resumed_setup``, at train start).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn


def save_run_state(module: Any, checkpoint: dict[str, Any]) -> None:
    """Write ``module``'s (a ``PrunedDPO``'s) run state into ``checkpoint`` (module docstring)."""
    from lit_prunedpo.policy_checkpoint import policy_metadata
    from lit_prunedpo.lora import drop_frozen, is_peft_model

    checkpoint["sampler_rng"] = module.sampler_rng.state_dict()
    checkpoint.update(module.nonfinite.state_dict())
    checkpoint["num_tokens"] = module.num_tokens
    if getattr(module, "_optimizer_setup", None) is not None:
        checkpoint["optimizer_setup"] = module._optimizer_setup[0]  # as configured, before a resume's changes
    checkpoint["policy"] = policy_metadata(module.policy, module.policy_source)
    # LoRA: adapters only; FSDP2's sharded checkpoint keeps the base (Lightning's sharded loader asks for every key)
    if is_peft_model(module.policy) and not module._sharded:
        drop_frozen(checkpoint["state_dict"], module.policy)


def load_run_state(module: Any, checkpoint: dict[str, Any]) -> None:
    """Take ``module``'s (a ``PrunedDPO``'s) run state back from ``checkpoint``; the optimizer arguments are kept for
    ``lit_prunedpo.optimizer_setup.apply_resumed_setup``. A checkpoint without the samplers' generator state
    restarts their draws, with a warning; a sampler seed that differs from the configured one is the checkpoint's,
    said in one line."""
    from lit_prunedpo.lora import restore_base
    from lit_prunedpo.policy_checkpoint import check_resumed_policy

    where = getattr(module._trainer, "ckpt_path", None)
    # another model_type, LoRA against a full model, another size: one line before Lightning's lists of keys
    check_resumed_policy(checkpoint, module.policy, where)
    restore_base(checkpoint, module.policy, module.policy_source, where=where)
    module.nonfinite.load_state_dict(checkpoint)
    module.num_tokens = int(checkpoint.get("num_tokens", 0))
    unrecorded = "unrecorded" if "optimizer_states" in checkpoint else None
    module._resumed_setup = checkpoint.get("optimizer_setup", unrecorded)
    state = checkpoint.get("sampler_rng")
    if state is None:
        rank_zero_warn("checkpoint has no sampler generator state: sampler draws restart from step 0")
        return
    if module.sampler_seed is not None and int(state["seed"]) != module.sampler_seed:
        rank_zero_info(f"resuming with the checkpoint's sampler seed {state['seed']} "
                       f"(config says {module.sampler_seed})")
    module.sampler_rng.load_state_dict(state)

