"""The study's tasks: what data a run trains and validates on, and which model learns it.

A task is a small class: :meth:`StudyTask.datamodule` builds a set-up
:class:`~lit_prunedpo.data.PreferenceDataModule` (the same pipeline as ``lit-prunedpo fit``; its held-out
pairs are never trained on) and :meth:`StudyTask.policy` the model source for a seed.

* ``quickstart``: ``configs/quickstart.yaml``'s task and model, unchanged (it saturates: accuracy 1.0).
* ``quickstart-d256``: the same task with a 4x wider model (d=256, FFN 512, 2 layers): fixed per-step costs
  weigh less, so pruning saves a larger share of a step.
* ``edited``: near-duplicate pairs, one wrong letter at a random place, 10% of labels swapped
  (:mod:`lit_prunedpo.data.edited`; best achievable held-out accuracy 0.9), the quickstart's model.
* ``edited-start``: the same with the wrong letter first: the near-duplicate regime's other end.
* ``hh-rlhf``: 2,312 real HH-RLHF pairs, GPT-2's tokenizer, a Llama with GPT-2's vocabulary (d=64, 4 layers:
  the LM head is most of a step), warm-started on the chosen responses; prompts cut to 32 tokens and responses
  to 16 so that a study fits on 2 CPU cores. Its data file and tokenizer are arguments (``HHRLHFTask(path=...,
  tokenizer=...)``, ``lit-prunedpo-study --data-path ... --tokenizer ...``); by default
  :data:`HH_RLHF_DATA` and :data:`GPT2_TOKENIZER`, in the ``shared/`` folder beside the repository (resolved
  from this file, not from the working directory).
* ``smollm2-hh``: a real pretrained model, SmolLM2-135M-Instruct (:data:`SMOLLM2_GGUF`, its own tokenizer and
  chat template), on the same HH-RLHF pairs read as chat messages (``configs/smollm2_hh.yaml``'s data, sized for a
  CPU: batch 4, 192 tokens). Every seed starts from the same pretrained weights; the seed orders the data.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_prunedpo.data import EditPlace, PreferenceDataModule, best_accuracy, edited_pairs
from lit_prunedpo.models import FromConfig, ModelSource, Pretrained

#: The folder beside the repository's root that holds the local copies of the real data and tokenizers.
SHARED = Path(__file__).resolve().parents[3].parent / "shared"
#: HH-RLHF's harmless-base test file: the ``hh-rlhf`` task's default data.
HH_RLHF_DATA = SHARED / "data/hh-rlhf/harmless-base-test.jsonl.gz"
#: GPT-2's tokenizer files: the ``hh-rlhf`` task's default tokenizer.
GPT2_TOKENIZER = SHARED / "tokenizers/gpt2"
#: SmolLM2-135M-Instruct as a 4-bit GGUF file (model and tokenizer): the ``smollm2-hh`` task's default model.
SMOLLM2_GGUF = SHARED / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"

QUICKSTART_MODEL: dict[str, Any] = dict(
    vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
)


class StudyTask(ABC):
    """Data and model of one study task. ``name``, ``lr``, ``warmup_steps`` and ``best_accuracy`` are read
    by the runner and the report."""

    name: str
    lr: float
    warmup_steps: int
    best_accuracy: float | None
    batch_size: int
    max_rows: int | None  # only the first rows of the data (quick runs); None: all
    warm_start_steps: int  # supervised steps on the training split's chosen responses before DPO (0: none)
    warm_start_lr: float

    @abstractmethod
    def datamodule(self, work_dir: Path) -> PreferenceDataModule:
        """A set-up data module (``setup("fit")`` done); ``work_dir`` may hold generated files."""

    @abstractmethod
    def policy(self, seed: int) -> FromConfig:
        """The model source whose weights depend on ``seed`` only (same seed, same initial weights)."""

    def describe(self) -> dict[str, Any]:
        """What the report says about the task."""
        return {"name": self.name, "lr": self.lr, "warmup_steps": self.warmup_steps,
                "best_accuracy": self.best_accuracy,
                "batch_size": self.batch_size, "max_rows": self.max_rows, "model": getattr(self, "model", None),
                "warm_start_steps": self.warm_start_steps, "warm_start_lr": self.warm_start_lr,
                "model_type": getattr(self, "model_type", "llama")}


@dataclass
class QuickstartTask(StudyTask):
    """``configs/quickstart.yaml``: the generated ordered-vs-corrupted task and its tiny Llama."""

    name: str = "quickstart"
    lr: float = 2e-3
    warmup_steps: int = 20
    best_accuracy: float | None = 1.0
    batch_size: int = 16
    max_rows: int | None = None
    warm_start_steps: int = 0
    warm_start_lr: float = 1e-3
    model: dict[str, Any] = field(default_factory=lambda: dict(QUICKSTART_MODEL))
    model_type: str = "llama"  # the transformers model type ``model`` configures (:func:`with_family`)

    def datamodule(self, work_dir: Path) -> PreferenceDataModule:
        dm = PreferenceDataModule(path=None, tokenizer="byt5", max_length=64, max_prompt_length=24,
                                  batch_size=self.batch_size,
                                  max_rows=self.max_rows)
        dm.setup("fit")
        return dm

    def policy(self, seed: int) -> FromConfig:
        return FromConfig(self.model_type, copy.deepcopy(self.model), seed=seed)


@dataclass
class EditedTask(StudyTask):
    """One-edit pairs with label noise (:func:`lit_prunedpo.data.edited.edited_pairs`), written to a JSONL
    file and read through the real pipeline; 5% held out."""

    name: str = "edited"
    lr: float = 2e-3
    warmup_steps: int = 20
    edit_at: EditPlace = "random"
    label_noise: float = 0.1
    num_rows: int = 4096
    batch_size: int = 16
    max_rows: int | None = None
    warm_start_steps: int = 0
    warm_start_lr: float = 1e-3
    model: dict[str, Any] = field(default_factory=lambda: dict(QUICKSTART_MODEL))
    model_type: str = "llama"  # the transformers model type ``model`` configures (:func:`with_family`)

    @property
    def best_accuracy(self) -> float:  # type: ignore[override]
        return best_accuracy(self.label_noise)

    def datamodule(self, work_dir: Path) -> PreferenceDataModule:
        path = Path(work_dir) / f"{self.name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = edited_pairs(num_rows=self.num_rows, seed=0, edit_at=self.edit_at, label_noise=self.label_noise)
        with path.open("w") as f:
            for row in rows:
                f.write(json.dumps({k: row[k] for k in ("prompt", "chosen", "rejected")}) + "\n")
        dm = PreferenceDataModule(path=str(path), tokenizer="byt5", max_length=64, max_prompt_length=24,
                                  batch_size=self.batch_size,
                                  max_rows=self.max_rows)
        dm.setup("fit")
        return dm

    def policy(self, seed: int) -> FromConfig:
        return FromConfig(self.model_type, copy.deepcopy(self.model), seed=seed)


@dataclass
class HHRLHFTask(StudyTask):
    """Real preference pairs: the shared HH-RLHF harmless-base test file (10% held out), GPT-2's tokenizer.

    Sized for 2 shared CPU cores, where a vanilla step of the d=256 shape took 3-4 CPU-s at batch 16 even with
    responses cut to 32 tokens: prompts keep their last 32 tokens and responses their first 16 (``max_length``
    48), and the model is a d=64, 4-layer Llama with GPT-2's 50,257-token vocabulary, so the LM head is most of
    a step's cost (the bench's ``head-heavy`` regime, where position and branch pruning save the most). DPO
    starts from a warm start (:mod:`lit_prunedpo_lab.study.warm_start`): 200 supervised steps on the training
    split's chosen responses, policy and reference alike.
    """

    name: str = "hh-rlhf"
    lr: float = 1e-3
    warmup_steps: int = 10
    best_accuracy: float | None = None
    path: str | None = None  # the data file; None: HH_RLHF_DATA
    tokenizer: str | None = None  # a tokenizer folder or hub name; None: GPT2_TOKENIZER
    max_length: int = 48
    max_prompt_length: int = 32
    max_rows: int | None = None
    warm_start_steps: int = 200
    warm_start_lr: float = 3e-3
    # cut to 16 tokens, some pairs' two responses become identical (no preference): skipped, counted in the stats
    on_bad_row: str = "skip"
    batch_size: int = 16
    model: dict[str, Any] = field(default_factory=lambda: dict(
        vocab_size=50257, hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128, tie_word_embeddings=False,
    ))
    model_type: str = "llama"

    def datamodule(self, work_dir: Path) -> PreferenceDataModule:
        path = Path(self.path) if self.path is not None else HH_RLHF_DATA
        tokenizer = self.tokenizer if self.tokenizer is not None else str(GPT2_TOKENIZER)
        if not path.is_file():
            raise FileNotFoundError(f"hh-rlhf task: data file {str(path)!r} not found; give its location with "
                                    "lit-prunedpo-study --data-path (HHRLHFTask(path=...))")
        if self.tokenizer is None and not GPT2_TOKENIZER.is_dir():
            raise FileNotFoundError(f"hh-rlhf task: tokenizer {str(GPT2_TOKENIZER)!r} not found; give its location "
                                    "with lit-prunedpo-study --tokenizer (HHRLHFTask(tokenizer=...): a folder or a hub "
                                    "name)")
        dm = PreferenceDataModule(
            path=str(path), tokenizer=tokenizer, max_length=self.max_length, max_prompt_length=self.max_prompt_length,
            val_fraction=0.1, batch_size=self.batch_size, max_rows=self.max_rows, on_bad_row=self.on_bad_row,
        )
        dm.setup("fit")
        return dm

    def policy(self, seed: int) -> FromConfig:
        return FromConfig(self.model_type, copy.deepcopy(self.model), seed=seed)


@dataclass
class PretrainedHHTask(StudyTask):
    """A real pretrained instruct model on HH-RLHF's pairs rendered with its chat template (``dialogues:
    messages``, as TRL renders conversational data), a fifth held out; no warm start (the model is already trained).

    ``model_path`` is a local folder, a hub name or a ``.gguf`` file, whose tokenizer the data uses too (by default
    :data:`SMOLLM2_GGUF`). Sized for 2 CPU cores, where a float32 vanilla step of SmolLM2-135M at batch 4 and 256
    tokens takes about 10 s: 192 tokens (prompts keep their last 128). The learning rate is for a run of one short
    epoch (tens of steps); the recipe's 1e-6 is for 10,000.
    """

    name: str = "smollm2-hh"
    lr: float = 5e-6
    warmup_steps: int = 4
    best_accuracy: float | None = None
    path: str | None = None  # the data file; None: HH_RLHF_DATA
    model_path: str | None = None  # None: SMOLLM2_GGUF
    max_length: int = 192
    max_prompt_length: int = 128
    max_rows: int | None = None
    val_fraction: float = 0.2  # held-out pairs: a fifth, so that a short run's accuracy is read on tens of pairs
    warm_start_steps: int = 0
    warm_start_lr: float = 0.0
    on_bad_row: str = "skip"
    batch_size: int = 4
    model_type: str = "llama"

    @property
    def model(self) -> str:
        return str(self.model_path if self.model_path is not None else SMOLLM2_GGUF)

    def datamodule(self, work_dir: Path) -> PreferenceDataModule:
        path = Path(self.path) if self.path is not None else HH_RLHF_DATA
        for what, where in (("data file", path), ("model", Path(self.model))):
            if not where.exists() and (what == "data file" or self.model_path is None):
                raise FileNotFoundError(f"{self.name} task: {what} {str(where)!r} not found; give its location with "
                                        "lit-prunedpo-study --data-path (PretrainedHHTask(path=..., model_path=...))")
        dm = PreferenceDataModule(
            path=str(path), tokenizer=self.model, max_length=self.max_length, max_prompt_length=self.max_prompt_length,
            val_fraction=self.val_fraction, batch_size=self.batch_size, max_rows=self.max_rows,
            on_bad_row=self.on_bad_row, dialogues="messages",
        )
        dm.setup("fit")
        return dm

    def policy(self, seed: int) -> ModelSource:  # type: ignore[override]
        return Pretrained(self.model, dtype="float32")


#: Model families a task's Llama can be swapped for, at the same sizes (:func:`with_family`).
FAMILIES = ("llama", "qwen2", "gpt2")


def family_config(llama: dict[str, Any], family: str) -> dict[str, Any]:
    """A config of ``family`` with the sizes of the Llama config ``llama``: width, depth, heads, FFN, vocabulary,
    context and tying. Qwen2 takes Llama's keywords (it adds biases to q, k, v); GPT-2 has learned absolute
    positions, LayerNorm, GELU and full multi-head attention (no grouped KV heads).

    Raises:
        ValueError: for a family not in :data:`FAMILIES`.
    """
    if family not in FAMILIES:
        raise ValueError(f"model family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if family != "gpt2":
        return dict(llama)
    last = llama["vocab_size"] - 1  # GPT-2's default special ids (50256) lie outside a small vocabulary
    return dict(vocab_size=llama["vocab_size"], n_embd=llama["hidden_size"], n_layer=llama["num_hidden_layers"],
                n_head=llama["num_attention_heads"], n_inner=llama["intermediate_size"],
                n_positions=llama["max_position_embeddings"],
                tie_word_embeddings=llama.get("tie_word_embeddings", False),
                bos_token_id=min(50256, last), eos_token_id=min(50256, last))


def with_family(task: StudyTask, family: str) -> StudyTask:
    """``task`` with its model swapped for ``family``'s at the same sizes, named ``<task>-<family>`` (``llama``: the
    task itself)."""
    if family not in FAMILIES:
        raise ValueError(f"model family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if family == getattr(task, "model_type", "llama"):
        return task
    if isinstance(task, PretrainedHHTask):
        raise ValueError(f"task {task.name!r} trains a pretrained model ({task.model}): its family is the model's own "
                         f"({task.model_type}), not {family!r}")
    return dataclasses.replace(task, name=f"{task.name}-{family}", model=family_config(task.model, family),  # type: ignore[call-arg]
                               model_type=family)


TASKS: dict[str, StudyTask] = {
    "quickstart": QuickstartTask(),
    # model shape as a variable: the quickstart's task with a 4x wider body, where a step's fixed costs weigh less
    "quickstart-d256": QuickstartTask(name="quickstart-d256", lr=1e-3, model={**QUICKSTART_MODEL, "hidden_size": 256,
                                                                             "intermediate_size": 512}),
    "edited": EditedTask(),
    "edited-start": EditedTask(name="edited-start", edit_at="start"),
    "hh-rlhf": HHRLHFTask(),
    "smollm2-hh": PretrainedHHTask(),
}
