"""Warm start of a study task: a short supervised pass on the chosen responses, cached per (task, seed).

A randomly initialised model trained by DPO against itself as the reference barely moves held-out preference
accuracy within a CPU budget (on HH-RLHF its log-ratios start as noise over a 50k-token vocabulary). The
remedy, as TRL's and OpenRLHF's pipelines do with an SFT stage: first fit the model to the chosen
responses by next-token NLL, then start DPO from there with the warmed model as **both** policy and
reference. Here:

* only the **training** split's chosen responses are used (the data module's training order, seeded by the
  seed): held-out pairs are never seen, by construction and recorded (``trained_rows`` in the record);
* the loss is the mean NLL of every chosen response token given its prompt, scored by the package's own
  :class:`~lit_prunedpo.scoring.TokenScorer` (LM head on the response positions only), AdamW with a linear
  warm-up then a constant learning rate;
* the result is saved with ``save_pretrained`` under ``<work_dir>/warm-start/<task>-seed<seed>-<digest>/``,
  the digest covering everything that changes the warmed weights (the task's data and model settings, the
  seed, the pass's steps, learning rate and batch size), and is reused by every arm of that seed and by any
  later study with the same settings; ``warm_start.json`` beside the weights records the pass's cost
  (process CPU and wall seconds, reported apart from every arm's budget) and its loss curve.

The pass is a plain loop rather than a Lightning ``Trainer``: its clock covers the steps alone (no loading, no
hooks), and the weights it caches under a key of *settings* must stay bit for bit those earlier studies warmed,
which a new training driver under the same key could not promise.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from lit_prunedpo.batch import CHOSEN, PreferenceBatch
from lit_prunedpo.data import PreferenceDataModule
from lit_prunedpo.models import ModelSource, Pretrained
from lit_prunedpo.scoring import GroupInputs, TokenScorer

RECORD = "warm_start.json"
# task fields that only the DPO phase reads: changing them keeps the warmed weights valid
_DPO_ONLY = ("lr", "warmup_steps", "batch_size", "best_accuracy", "warm_start_steps")


def chosen_inputs(batch: PreferenceBatch) -> GroupInputs:
    """Every pair's prompt followed by its chosen response, scored at every chosen response token."""
    P = batch.prompt_width
    responses, mask = batch.response_ids[:, CHOSEN], batch.response_mask[:, CHOSEN]
    width = P + int(mask.sum(-1).max()) - 1  # the last token is only ever a target
    input_ids = torch.cat([batch.prompt_ids, responses], dim=1)[:, :width]
    attention_mask = torch.cat([batch.prompt_mask, mask], dim=1)[:, :width].long()
    row, t = mask.nonzero(as_tuple=True)
    return GroupInputs(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(1) - 1).clamp(min=0),
        gather_row=row,
        gather_col=P - 1 + t,
        targets=responses[row, t],
    )


def chosen_nll(model: torch.nn.Module, batch: PreferenceBatch, scorer: TokenScorer | None = None) -> torch.Tensor:
    """Mean negative log-likelihood of the chosen responses' tokens (a token-level mean over the batch)."""
    return -(scorer or TokenScorer())(model, chosen_inputs(batch)).mean()


def cache_key(task: Any, seed: int, steps: int, lr: float, batch_size: int) -> str:
    """The digest naming a warm start: the task's settings that shape the warmed weights, and the pass's own."""
    settings = {k: v for k, v in dataclasses.asdict(task).items() if k not in _DPO_ONLY}
    text = json.dumps({"task": settings, "seed": seed, "steps": steps, "lr": lr, "batch_size": batch_size},
                      sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def warm_start(
    task: Any,
    seed: int,
    dm: PreferenceDataModule,
    work_dir: Path | str,
    steps: int,
    lr: float = 1e-3,
    batch_size: int | None = None,
    warmup_steps: int = 20,
    log: Callable[[str], None] | None = None,
) -> tuple[ModelSource, dict[str, Any]]:
    """The warmed model of ``task`` for ``seed`` (trained now, or read from the cache) and its record.

    ``task.policy(seed)`` gives the initial weights; ``dm``'s training split the data (``batch_size`` pairs per
    step, default the task's). The record holds ``steps``, ``cpu_s``, ``wall_s``, ``losses`` (one per step),
    ``trained_rows`` (every training row it saw), ``path`` and ``reused`` (True when read from the cache).

    Raises:
        ValueError: on ``steps < 1``, ``lr <= 0`` or ``batch_size < 1``.
    """
    batch_size = task.batch_size if batch_size is None else batch_size
    if steps < 1 or not lr > 0 or batch_size < 1:
        raise ValueError(f"warm start: need steps >= 1, lr > 0, batch_size >= 1; got steps={steps!r}, lr={lr!r}, "
                         f"batch_size={batch_size!r}")
    log = log or (lambda line: None)
    path = Path(work_dir) / "warm-start" / f"{task.name}-seed{seed}-{cache_key(task, seed, steps, lr, batch_size)}"
    record_file = path / RECORD
    if record_file.exists():
        record = json.loads(record_file.read_text())
        log(f"warm start seed {seed}: reusing {path} ({record['steps']} steps, {record['cpu_s']:.1f} CPU-s when made)")
        return Pretrained(str(path), dtype="float32"), {**record, "path": str(path), "reused": True}

    model = task.policy(seed).build()
    data = copy.copy(dm)  # the training split only; the order follows the seed, as an arm's does
    data.batch_size, data.seed = batch_size, seed
    trained = _train(model, data.train_dataloader(), steps, lr, warmup_steps, f"warm start seed {seed}", log)
    record = {"task": task.name, "seed": seed, "steps": steps, "lr": lr, "batch_size": batch_size,
              "warmup_steps": warmup_steps,
              "cpu_s": trained.cpu_s, "wall_s": trained.wall_s, "losses": trained.losses,
              "trained_rows": sorted(trained.seen)}
    _save(model, record, path)
    losses = trained.losses
    log(f"warm start seed {seed}: {steps} steps, NLL {losses[0]:.3f} -> {losses[-1]:.3f}, {trained.cpu_s:.1f} CPU-s, "
        f"saved {path}")
    return Pretrained(str(path), dtype="float32"), {**record, "path": str(path), "reused": False}


@dataclass
class _Pass:
    """What a supervised pass did: its per-step NLL, the training rows it saw and its cost (the steps only)."""

    losses: list[float] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    cpu_s: float = 0.0
    wall_s: float = 0.0


def _train(model: torch.nn.Module, loader: Any, steps: int, lr: float, warmup_steps: int, name: str,
           log: Callable[[str], None]) -> _Pass:
    """``steps`` steps of chosen-response NLL on ``loader``'s batches, epoch after epoch (AdamW, linear warm-up then
    constant rate), each step timed without its batch's loading; a progress line every 50 steps.

    Raises:
        FloatingPointError: on a non-finite NLL.
    """
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))
    scorer = TokenScorer()
    done = _Pass()
    losses = done.losses
    epoch = 0
    while len(losses) < steps:
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            wall, cpu = time.perf_counter(), time.process_time()
            loss = chosen_nll(model, batch, scorer)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            done.cpu_s += time.process_time() - cpu
            done.wall_s += time.perf_counter() - wall
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{name}: non-finite NLL at step {len(losses)}")
            losses.append(float(loss.detach()))
            done.seen.update(batch.index.tolist())
            if len(losses) % 50 == 0 and len(losses) < steps:  # the last step has a summary line of its own
                left = done.cpu_s / len(losses) * (steps - len(losses))
                log(f"{name}: step {len(losses)} of {steps}, NLL {sum(losses[-50:]) / 50:.3f} "
                    f"({done.cpu_s:.0f} CPU-s, about {left:.0f} CPU-s left)")
            if len(losses) == steps:
                break
        epoch += 1
    return done


def _save(model: torch.nn.Module, record: dict[str, Any], path: Path) -> None:
    """``model`` (``save_pretrained``) and its ``record`` under ``path``, written whole, then renamed: a killed pass
    leaves no half cache behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        (staging / RECORD).write_text(json.dumps(record))
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
