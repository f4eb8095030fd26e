"""Benchmark presets (model, batches, step counts) and the pruning modes compared.

* ``small``: a tiny Llama and 2 steps, seconds in all: a **smoke test** that every configuration runs (CI). Its
  reports state no measured speedups: two runs of it gave 0.53x-1.59x for the same configurations, and even 30
  steps (20 s on a shared 2-core machine) left run-to-run differences up to 0.23x around 1.0x, where the cost
  model's ideal is 1.04x-1.92x: a model this small times overheads, not pruning.
* ``quickstart``: a Llama at the quickstart config's size and batch shape (4 KV heads where the config has 2),
  for the branch-vs-vanilla ratio at that size.
* ``medium``: representative of the step's cost split: Llama d=256, 4 layers, V=8192, 4 pairs of responses of
  128-384 tokens; the LM head is ~24% of a forward's FLOPs (the CLI prints the cost model's number).
* ``head-heavy``: vocabulary 32768, d=64: the LM head dominates, to show what position pruning and the
  chunked scorer do to peak memory.
* ``hh-body``: body-heavy, HH-RLHF-shaped: Llama d=384, 6 layers, V=8192 (LM head about 4% of a forward, as in
  7B+ models), 4 pairs whose prompt and response lengths are drawn from HH-RLHF's (GPT-2 tokens, harmless-base
  test file, ``max_length`` 512 / ``max_prompt_length`` 256: :data:`HH_RLHF_LENGTHS`), length-grouped like the
  data module's training order. The shape where the shared prompt matters: prompts are over half the tokens.
* ``hh-gpt2``: the same lengths on a Llama d=256, 4 layers with GPT-2's vocabulary (V=50257): the shape of
  the TRL comparison (docs/performance.md; the LM head is 21.6% of a vanilla forward's FLOPs here, by the cost model;
  TRL also runs it on every prompt position).
* ``hh-gpu``: the same lengths on a ~0.9B Llama (d=2048, 16 layers, V=32000), 8 pairs: what ``lab/scripts/gpu-check``
  runs in bf16 on one GPU.

Modes: the shipped overlays ``configs/modes/{vanilla,branch,sequence,position,position-bernoulli,all}.yaml``, loaded
by :mod:`lit_prunedpo.modes`: the benchmark times the configurations users run. ``position`` is the default position
mode (exact target logits, sampled log-sum-exps); ``position-bernoulli`` the paper's design, which every benchmark
recorded before 2026-12-03 calls ``position``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from lit_prunedpo.modes import Samplers, samplers_of

#: The modes the benchmark compares (names of shipped overlays); each value returns new sampler objects.
MODES: dict[str, Callable[[], Samplers]] = {
    name: functools.partial(samplers_of, name)
    for name in ("vanilla", "branch", "sequence", "position", "position-bernoulli", "all")
}
REFERENCES = ("online", "cached")
SCORERS = ("plain", "chunked")
PROMPTS = ("shared", "padded")  # PrunedDPO(shared_prompt=True / False)

# 5%-step quantiles (0%, 5%, ..., 100%) of HH-RLHF lengths in GPT-2 tokens: the 2,196 training pairs of the
# harmless-base test file through PreferenceDataModule (max_length 512, max_prompt_length 256, EOS included), as
# printed by `python lab/scripts/measure_padding.py --quantiles`.
HH_RLHF_LENGTHS: dict[str, tuple[int, ...]] = {
    "prompt": (12, 17, 19, 21, 25, 33, 47, 61, 72, 84, 97, 110, 122, 136, 151, 169, 191, 227, 256, 256, 256),
    "chosen": (2, 7, 10, 12, 14, 16, 18, 21, 24, 26, 29, 32, 37, 42, 47, 56, 65, 76, 91, 121, 282),
    "rejected": (2, 7, 10, 13, 16, 19, 22, 25, 29, 33, 38, 43, 48, 55, 61, 68, 78, 92, 113, 151, 494),
}


@dataclass(frozen=True)
class Preset:
    """One benchmark setting.

    Attributes:
        name: the preset's name.
        description: one line for reports.
        model: ``transformers`` Llama config keyword arguments.
        batch_size: pairs per step.
        response_length: ``(min, max)`` response tokens (EOS included) of the synthetic pairs.
        warmup: un-timed rounds (one step of every configuration each) before the measured ones.
        steps: measured rounds.
        chunk_size: the chunked scorer's ``chunk_size``.
        lr: AdamW learning rate (the weights barely move: the benchmark times steps, it does not train).
        threads: torch CPU threads; ``None`` keeps torch's default. Tiny models run 1 thread: on a shared,
            oversubscribed machine two OpenMP threads make millisecond steps up to 100x slower.
        lengths: quantile tables (``prompt``, ``chosen``, ``rejected``) to draw each pair's lengths from, with
            random tokens and length-grouped batches; ``None`` uses the synthetic task's pairs (3-token prompts,
            ``response_length``).
        smoke_test: the preset checks that the configurations run, not how fast: reports leave out its measured
            speedups (``lit_prunedpo_lab.bench.report``).
    """

    name: str
    description: str
    model: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 8
    response_length: tuple[int, int] = (8, 32)
    warmup: int = 1
    steps: int = 5
    chunk_size: int = 1024
    lr: float = 1e-5
    threads: int | None = None
    lengths: dict[str, tuple[int, ...]] | None = None
    smoke_test: bool = False


def llama_config(vocab: int, d: int, layers: int, heads: int, ffn: int, max_len: int) -> dict[str, Any]:
    return dict(
        vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len,
        tie_word_embeddings=False,
    )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="small",
            description="tiny Llama (d=32, 2 layers, V=64), 4 pairs of 8-24 tokens: a smoke test, seconds, for CI",
            model=llama_config(64, 32, 2, 4, 64, 64),
            batch_size=4,
            response_length=(8, 24),
            warmup=1,
            steps=2,
            chunk_size=16,
            threads=1,
            smoke_test=True,  # 2 steps of a tiny model: speedups within noise (see the module docstring)
        ),
        Preset(
            name="quickstart",
            description="Llama at configs/quickstart.yaml's size (d=64, 2 layers, V=384; 4 KV heads, the config "
                        "has 2), 16 pairs of 9-33 tokens",
            model=llama_config(384, 64, 2, 4, 128, 128),
            batch_size=16,
            response_length=(9, 33),
            warmup=3,
            steps=20,
            chunk_size=256,
            threads=1,
        ),
        Preset(
            name="medium",
            description="Llama d=256, 4 layers, V=8192, 4 pairs of 128-384 tokens",
            model=llama_config(8192, 256, 4, 4, 1024, 512),
            batch_size=4,
            response_length=(128, 384),
            warmup=1,
            steps=5,
            chunk_size=1024,
        ),
        Preset(
            name="head-heavy",
            description="Llama d=64, 2 layers, V=32768, 4 pairs of 64-256 tokens: the LM head dominates",
            model=llama_config(32768, 64, 2, 2, 256, 512),
            batch_size=4,
            response_length=(64, 256),
            warmup=1,
            steps=4,
            chunk_size=256,
        ),
        Preset(
            name="hh-body",
            description="Llama d=384, 6 layers, V=8192 (body-heavy), 4 pairs with HH-RLHF's prompt/response lengths",
            model=llama_config(8192, 384, 6, 6, 1024, 1024),
            batch_size=4,
            response_length=(2, 494),
            warmup=1,
            steps=4,
            chunk_size=1024,
            lengths=HH_RLHF_LENGTHS,
        ),
        Preset(
            name="hh-gpt2",
            description="Llama d=256, 4 layers, V=50257 (GPT-2's vocabulary), 4 pairs with HH-RLHF's lengths",
            model=llama_config(50257, 256, 4, 4, 1024, 1024),
            batch_size=4,
            response_length=(2, 494),
            warmup=1,
            steps=4,
            chunk_size=1024,
            lengths=HH_RLHF_LENGTHS,
        ),
        Preset(
            name="hh-gpu",
            description="Llama d=2048, 16 layers, V=32000 (~0.9B, body-heavy), 8 pairs with HH-RLHF's lengths: for one "
                        "GPU",
            model=llama_config(32000, 2048, 16, 16, 5632, 1024),
            batch_size=8,
            response_length=(2, 494),
            warmup=2,
            steps=8,
            chunk_size=1024,
            lengths=HH_RLHF_LENGTHS,
        ),
    )
}


#: The settings of a run with ``--model`` (no preset): 5 measured steps after 1 warm-up round, 4 pairs per step; the
#: batches are ``--data``'s, else random tokens with HH-RLHF's lengths in the model's vocabulary.
OWN_MODEL = Preset(
    name="own-model",
    description="--model's weights; without --data, 4 pairs with HH-RLHF's prompt/response lengths",
    batch_size=4,
    response_length=(2, 494),
    warmup=1,
    steps=5,
    chunk_size=1024,
    lengths=HH_RLHF_LENGTHS,
)


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ValueError: naming the known presets, for an unknown ``name``.
    """
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    return PRESETS[name]
