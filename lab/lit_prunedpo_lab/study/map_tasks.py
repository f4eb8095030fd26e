"""The regime map's tasks: generated preference pairs set by the variables that decide a verdict.

A :class:`CellTask` is a :class:`~lit_prunedpo_lab.study.tasks.StudyTask` made from four numbers:

* ``length``: tokens per response, EOS included (every response exactly that long: ``length - 1`` letters);
* ``similarity``: ``"near-duplicate"``, one wrong letter at a random place (:mod:`lit_prunedpo.data.edited`),
  or ``"unrelated"``, random letters against the ordered ones (:mod:`lit_prunedpo.data.unrelated`); both with
  10 % swapped labels, so the best achievable held-out accuracy is 0.9;
* ``head_share``: the LM head's share of a vanilla step's FLOPs (forward, backward, online reference) by the
  cost model (:mod:`lit_prunedpo_lab.bench.cost`). A body is picked by the target (:data:`BODIES`: the quickstart's
  d=64 body with 16 layers below 10 %, with its 2 layers up to 60 %, a one-layer d=32 body above), then the vocabulary
  ``V`` is solved for: a step's FLOPs are ``A + h V`` (only the head depends on ``V``), so the share is
  ``h V / (A + h V)`` and ``V = share A / ((1 - share) h)``, rounded to a multiple of 64. Tokens are bytes
  (ByT5, 384 ids), so ``V`` below 384 cannot be: such a target is refused (:class:`ValueError`). The extra
  vocabulary rows are never seen in the data but cost what a real head costs;
* ``batch_size``: pairs per step of the same-batch arms.

:func:`head_share` gives the cost model's share on real batches (what the map reports beside each cell).
``HHRLHFTask`` keeps the real data as a cell (:func:`hh_cell`: responses cut at ``length`` tokens).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench import cost
from lit_prunedpo.data import PreferenceDataModule, best_accuracy, edited_pairs, unrelated_pairs
from lit_prunedpo.models import FromConfig
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo_lab.study.arms import MODES
from lit_prunedpo_lab.study.tasks import HHRLHFTask, StudyTask
from lit_prunedpo.testing import synthetic_batch

Similarity = Literal["near-duplicate", "unrelated"]
SIMILARITIES: tuple[str, ...] = ("near-duplicate", "unrelated")
PROMPT_TOKENS = 18  # "count from m by 3:" in ByT5 bytes, as the data module tokenizes it
MAX_PROMPT_LENGTH = 24
MIN_VOCAB = 384  # the ByT5 tokenizer's ids
MAX_LENGTH = 1024

# (largest target share it serves, Llama body); the vocabulary is solved per cell
BODIES: tuple[tuple[float, dict[str, Any]], ...] = (
    (0.10, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=16, num_attention_heads=4,
                num_key_value_heads=2)),
    (0.60, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2)),
    (1.00, dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1)),
)


def step_flops_parts(batches: Iterable[PreferenceBatch], dims: cost.ModelDims) -> tuple[int, int]:
    """``(A, h)``: a vanilla step's FLOPs over ``batches`` are ``A + h * vocab_size`` (online reference, plain
    scorer, the planner's default layout, as :func:`lit_prunedpo_lab.study.arms.ideal_speedup` counts them)."""
    g = torch.Generator().manual_seed(0)
    a = h = 0
    for batch in batches:
        plan = plan_step(batch, *MODES["vanilla"](), g)
        f0 = cost.step_flops(plan, dataclasses.replace(dims, vocab_size=0)).total
        f1 = cost.step_flops(plan, dataclasses.replace(dims, vocab_size=1)).total
        a, h = a + f0, h + f1 - f0
    return a, h


def head_share(batches: Iterable[PreferenceBatch], dims: cost.ModelDims) -> float:
    """The LM head's share of a vanilla step's FLOPs over ``batches`` (cost model)."""
    a, h = step_flops_parts(batches, dims)
    return h * dims.vocab_size / (a + h * dims.vocab_size)


def body_for(share: float) -> dict[str, Any]:
    """The Llama body (:data:`BODIES`) for a target head share."""
    return next(dict(body) for top, body in BODIES if share <= top)


def model_for(length: int, share: float, batch_size: int) -> dict[str, Any]:
    """The Llama config of a cell: :func:`body_for` ``(share)`` and the vocabulary solved for ``share`` on
    ``batch_size`` pairs of ``length``-token responses after an 18-token prompt.

    Raises:
        ValueError: if ``share`` is outside (0, 1) or needs a vocabulary below 384 (the tokenizer's).
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"head_share must be in (0, 1), got {share!r}")
    model = {**body_for(share), "vocab_size": MIN_VOCAB, "max_position_embeddings": MAX_PROMPT_LENGTH + length,
             "tie_word_embeddings": False}
    dims = cost.ModelDims.from_model(FromConfig("llama", dict(model), seed=0).build())
    lengths = torch.full((batch_size, 2), length)
    a, h = step_flops_parts([synthetic_batch(lengths, prompt_length=PROMPT_TOKENS)], dims)
    vocab = round(share * a / ((1.0 - share) * h) / 64) * 64
    if vocab < MIN_VOCAB:
        floor = h * MIN_VOCAB / (a + h * MIN_VOCAB)
        raise ValueError(f"head_share {share:g} at length {length}: needs a vocabulary of {vocab} < {MIN_VOCAB} (the "
                         f"tokenizer's); the smallest share this body reaches is {floor:.3f}")
    return {**model, "vocab_size": vocab}


def _write_jsonl(rows: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps({k: row[k] for k in ("prompt", "chosen", "rejected")}) + "\n")


@dataclass
class CellTask(StudyTask):
    """A generated map cell (see the module docstring); 5 % of the rows held out."""

    length: int = 64
    similarity: Similarity = "near-duplicate"
    target_head_share: float = 0.25
    batch_size: int = 8
    name: str = ""
    lr: float = 2e-3
    warmup_steps: int = 10
    label_noise: float = 0.1
    num_rows: int = 2048
    max_rows: int | None = None
    warm_start_steps: int = 0
    warm_start_lr: float = 1e-3
    model: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.length, int) and 2 <= self.length <= MAX_LENGTH):
            raise ValueError(f"length must be an integer in [2, {MAX_LENGTH}] (tokens per response, EOS included), got "
                             f"{self.length!r}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {', '.join(SIMILARITIES)}, got {self.similarity!r}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not self.model:
            self.model = model_for(self.length, self.target_head_share, self.batch_size)
        if not self.name:
            self.name = f"{self.similarity}-L{self.length}-head{self.target_head_share:g}-B{self.batch_size}"

    @property
    def best_accuracy(self) -> float:  # type: ignore[override]
        return best_accuracy(self.label_noise)

    def rows(self) -> Any:
        make = edited_pairs if self.similarity == "near-duplicate" else unrelated_pairs
        extra = {"edit_at": "random"} if self.similarity == "near-duplicate" else {}
        letters = self.length - 1  # the data module appends EOS
        return make(num_rows=self.num_rows, seed=0, min_length=letters, max_length=letters,
                    label_noise=self.label_noise, **extra)

    def datamodule(self, work_dir: Path) -> PreferenceDataModule:
        path = Path(work_dir) / f"{self.name}.jsonl"
        _write_jsonl(self.rows(), path)
        dm = PreferenceDataModule(path=str(path), tokenizer="byt5", max_length=MAX_PROMPT_LENGTH + self.length,
                                  max_prompt_length=MAX_PROMPT_LENGTH, batch_size=self.batch_size,
                                  max_rows=self.max_rows)
        dm.setup("fit")
        return dm

    def policy(self, seed: int) -> FromConfig:
        return FromConfig("llama", copy.deepcopy(self.model), seed=seed)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "length": self.length, "similarity": self.similarity,
                "target_head_share": self.target_head_share, "label_noise": self.label_noise, "num_rows": self.num_rows}


def hh_cell(length: int, batch_size: int, **overrides: Any) -> HHRLHFTask:
    """The HH-RLHF task with responses cut at ``length`` tokens (prompts at 32) and ``batch_size`` pairs."""
    if not (isinstance(length, int) and 2 <= length <= MAX_LENGTH):
        raise ValueError(f"length must be an integer in [2, {MAX_LENGTH}], got {length!r}")
    base = HHRLHFTask()
    model = {**base.model, "max_position_embeddings": max(base.model["max_position_embeddings"],
                                                          base.max_prompt_length + length)}
    return dataclasses.replace(base, name=f"hh-rlhf-L{length}-B{batch_size}",
                               max_length=base.max_prompt_length + length,
                               batch_size=batch_size, model=model, **overrides)
