"""Greedy completions of a few fixed held-out prompts at every validation, logged as text (TRL's
``generate_during_eval``), so that a user sees what the model says while it trains, not only its metrics.

Where the text goes: every run writes ``samples.jsonl`` beside the logs (``trainer.log_dir``; one JSON object per
prompt and validation: step, prompt, completion), because Lightning's ``CSVLogger`` has no text API. Loggers that
have one get it too: ``WandbLogger.log_text`` (a table per validation) and TensorBoard's ``add_text``.

Under DDP and FSDP2 every rank generates the same completions (FSDP2 needs every rank in each forward's
all-gathers; greedy decoding on equal weights stops at the same token everywhere); rank 0 writes them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class ValidationSamples(Callback):
    """Log greedy completions of fixed held-out prompts after each validation.

    Args:
        prompts: the prompts, as text (tokenized with the data module's ``tokenizer``); ``None`` takes the first
            ``num_prompts`` prompts of the first validation batch (held-out pairs, as the model sees them).
        num_prompts: how many validation prompts to take when ``prompts`` is ``None`` (>= 1).
        max_new_tokens: most tokens generated per prompt (>= 1).
        filename: the JSON-lines file written in the log folder.

    Raises:
        ValueError: on an empty ``prompts`` list, ``num_prompts`` or ``max_new_tokens`` < 1, or a ``filename``
            with a folder in it.

    Example::

        lit-prunedpo fit --config configs/quickstart.yaml \\
            --trainer.callbacks+=lit_prunedpo.callbacks.ValidationSamples --trainer.callbacks.max_new_tokens=24
    """

    def __init__(
        self,
        prompts: Optional[list[str]] = None,
        num_prompts: int = 4,
        max_new_tokens: int = 32,
        filename: str = "samples.jsonl",
    ) -> None:
        if prompts is not None and (not prompts or not all(isinstance(p, str) and p for p in prompts)):
            raise ValueError(f"prompts must be None or a non-empty list of non-empty strings, got {prompts!r}")
        if not isinstance(num_prompts, int) or num_prompts < 1:
            raise ValueError(f"num_prompts must be an int >= 1, got {num_prompts!r}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if not filename or os.sep in filename:
            raise ValueError(f"filename must be a bare file name, got {filename!r}")
        self.prompts = prompts
        self.num_prompts = num_prompts
        self.max_new_tokens = max_new_tokens
        self.filename = filename
        self.history: list[dict[str, Any]] = []  # every sample logged by this process, in order
        self._inputs: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    # ---------------------------------------------------------------------------------- prompts
    @staticmethod
    def _tokenizer(trainer: pl.Trainer) -> Any:
        return getattr(trainer.datamodule, "tokenizer", None) if trainer.datamodule is not None else None

    def _prompt_inputs(self, trainer: pl.Trainer) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, mask)``, left-padded, fixed for the whole run."""
        if self._inputs is not None:
            return self._inputs
        if self.prompts is not None:
            tokenizer = self._tokenizer(trainer)
            if tokenizer is None:
                raise ValueError("ValidationSamples(prompts=...) needs a data module with a `tokenizer` to encode them")
            rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in self.prompts]
            if tokenizer.bos_token_id is not None:
                rows = [[tokenizer.bos_token_id, *r] for r in rows]  # as the data pipeline starts prompts
            width = max(len(r) for r in rows)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
            mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
        else:
            loaders = trainer.val_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
            batch = next(iter(loader))
            ids, mask = batch.prompt_ids[: self.num_prompts], batch.prompt_mask[: self.num_prompts]
            keep = mask.any(0)  # drop columns that are padding in every kept row
            ids, mask = ids[:, keep], mask[:, keep]
        self._inputs = (ids, mask)
        return self._inputs

    def _decode(self, trainer: pl.Trainer, ids: torch.Tensor) -> str:
        tokenizer = self._tokenizer(trainer)
        if tokenizer is None:
            return " ".join(str(i) for i in ids.tolist())
        return tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    # ------------------------------------------------------------------------------- generation
    @torch.no_grad()
    def generate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[dict[str, Any]]:
        """Greedy completions of the fixed prompts by ``pl_module.policy`` (also callable outside a fit)."""
        ids, mask = self._prompt_inputs(trainer)
        policy = pl_module.policy
        tokenizer = self._tokenizer(trainer)
        pad = getattr(tokenizer, "pad_token_id", None)
        eos = getattr(tokenizer, "eos_token_id", None)
        was_training = policy.training
        policy.eval()
        try:
            out = policy.generate(
                input_ids=ids.to(pl_module.device), attention_mask=mask.to(pl_module.device).long(),
                max_new_tokens=self.max_new_tokens, do_sample=False,
                pad_token_id=pad if pad is not None else (eos if eos is not None else 0), eos_token_id=eos,
            )
        finally:
            policy.train(was_training)
        samples = []
        for row, prompt_ids, prompt_mask in zip(out.cpu(), ids, mask):
            samples.append({
                "step": trainer.global_step,
                "prompt": self._decode(trainer, prompt_ids[prompt_mask]),
                "completion": self._decode(trainer, row[ids.shape[1]:]),
            })
        return samples

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        samples = self.generate(trainer, pl_module)
        self.history.extend(samples)
        if trainer.is_global_zero:
            self._write(trainer, samples)

    def _write(self, trainer: pl.Trainer, samples: list[dict[str, Any]]) -> None:
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / self.filename).open("a") as f:
            for sample in samples:
                f.write(json.dumps(sample) + "\n")
        for logger in trainer.loggers:
            if hasattr(logger, "log_text"):  # WandbLogger
                logger.log_text(key="samples", columns=["step", "prompt", "completion"],
                                data=[[s["step"], s["prompt"], s["completion"]] for s in samples],
                                step=trainer.global_step)
            elif hasattr(getattr(logger, "experiment", None), "add_text"):  # TensorBoardLogger
                text = "\n\n".join(f"**{s['prompt']}** {s['completion']}" for s in samples)
                logger.experiment.add_text("samples", text, global_step=trainer.global_step)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {}
