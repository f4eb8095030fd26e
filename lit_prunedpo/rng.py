"""The samplers' dedicated random stream: one generator, re-seeded from (seed, rank, draw step).

Deriving every step's seed from the run's seed, the process rank and a step counter means that ranks draw
different prunings, that no other code touching the global RNG changes the draws, and that a resumed run
draws exactly what an uninterrupted one would have: the counter and the generator state go into checkpoints.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

__all__ = ["SamplerRNG", "derive_seed"]


def derive_seed(seed: int, rank: int, step: int) -> int:
    """A well-mixed 63-bit seed for (seed, rank, step); distinct tuples give unrelated streams."""
    digest = hashlib.blake2b(f"lit_prunedpo:{seed}:{rank}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class SamplerRNG:
    """Hands out the generator for each training step and remembers how many steps drew.

    Args:
        seed: the run's seed.
        rank: this process's global rank.
    """

    def __init__(self, seed: int = 0, rank: int = 0) -> None:
        self.seed = int(seed)
        self.rank = int(rank)
        self.step = 0
        self.generator = torch.Generator()

    def next(self) -> torch.Generator:
        """The generator for the next training step."""
        self.generator.manual_seed(derive_seed(self.seed, self.rank, self.step))
        self.step += 1
        return self.generator

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "rank": self.rank, "step": self.step, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the saved seed and step; this rank keeps its own rank and re-derives its stream from them.

        Rank 0 writes the checkpoint, so its generator state is restored only on the rank that saved it (the
        next :meth:`next` re-seeds from (seed, rank, step) anyway).
        """
        self.seed = int(state["seed"])
        self.step = int(state["step"])
        if int(state.get("rank", 0)) == self.rank:
            self.generator.set_state(state["generator"])
