"""The typed batch every stage of a training step reads, and the collate function that builds it.

Prompt and responses are kept apart so that prefix pruning can cut responses without re-tokenizing:

* ``prompt_ids`` is **left**-padded, so every response starts at the same column ``P``;
* ``response_ids`` holds both branches of each pair, **right**-padded: ``[:, 0]`` is the chosen
  response, ``[:, 1]`` the rejected one.

Keeping a response prefix of length ``L`` for every executed row is then one slice of the columns
``[0, P + L - 1)``: the padded tensor that runs really gets shorter.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["BRANCH_NAMES", "CHOSEN", "PreferenceBatch", "REJECTED", "collate_pairs"]

CHOSEN, REJECTED = 0, 1
BRANCH_NAMES = ("chosen", "rejected")


@dataclass
class PreferenceBatch:
    """A batch of ``B`` preference pairs.

    Attributes:
        prompt_ids: ``[B, P]`` long, left-padded prompts (at least one real token per row).
        prompt_mask: ``[B, P]`` bool, True on real prompt tokens.
        response_ids: ``[B, 2, T]`` long, right-padded responses; branch 0 chosen, branch 1 rejected.
        response_mask: ``[B, 2, T]`` bool, True on real response tokens (a prefix of each row).
        index: ``[B]`` long, each pair's key, unique over the data module's splits: its row number in the
            training source (a separate validation split's rows are numbered after it); keys a cached reference.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    index: Tensor

    @property
    def num_pairs(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def prompt_width(self) -> int:
        return self.prompt_ids.shape[1]

    @property
    def response_width(self) -> int:
        return self.response_ids.shape[2]

    @property
    def response_lengths(self) -> Tensor:
        """``[B, 2]`` number of real tokens of each response."""
        return self.response_mask.sum(-1)

    def to(self, device: torch.device | str) -> "PreferenceBatch":
        return PreferenceBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def validate(self) -> None:
        """Refuse a batch the step cannot score, naming the offending pairs."""
        B, P = self.prompt_ids.shape
        if self.prompt_mask.shape != (B, P):
            raise ValueError(f"prompt_mask has shape {tuple(self.prompt_mask.shape)}, expected {(B, P)}")
        if self.response_ids.ndim != 3 or self.response_ids.shape[:2] != (B, 2):
            raise ValueError(f"response_ids has shape {tuple(self.response_ids.shape)}, expected [B={B}, 2, T]")
        if self.response_mask.shape != self.response_ids.shape:
            raise ValueError("response_mask and response_ids differ in shape")
        empty_prompt = (~self.prompt_mask.bool().any(-1)).nonzero().flatten()
        if empty_prompt.numel():
            rows = self.index[empty_prompt].tolist()
            raise ValueError(
                f"pairs with dataset rows {rows} have an empty prompt: the first response token needs at least "
                "one prompt token (e.g. BOS) to be predicted from"
            )
        empty = (self.response_lengths == 0).nonzero()
        if empty.numel():
            described = ", ".join(f"row {int(self.index[i])} ({BRANCH_NAMES[int(b)]})" for i, b in empty.tolist())
            raise ValueError(f"batch has empty responses, which DPO cannot score: {described}")


def collate_pairs(examples: Sequence[Mapping[str, Any]], pad_id: int) -> PreferenceBatch:
    """Pad tokenized pairs into a :class:`PreferenceBatch`.

    Each example holds ``prompt_ids``, ``chosen_ids`` and ``rejected_ids`` (lists of ints) and ``index``.
    """
    if not examples:
        raise ValueError("cannot collate an empty list of preference pairs")
    B = len(examples)
    P = max(len(e["prompt_ids"]) for e in examples)
    T = max(max(len(e["chosen_ids"]), len(e["rejected_ids"])) for e in examples)
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.bool)
    response_ids = torch.full((B, 2, T), pad_id, dtype=torch.long)
    response_mask = torch.zeros((B, 2, T), dtype=torch.bool)
    for i, e in enumerate(examples):
        p = torch.as_tensor(e["prompt_ids"], dtype=torch.long)
        if p.numel():
            prompt_ids[i, P - p.numel():] = p
            prompt_mask[i, P - p.numel():] = True
        for b, key in enumerate(("chosen_ids", "rejected_ids")):
            r = torch.as_tensor(e[key], dtype=torch.long)
            response_ids[i, b, : r.numel()] = r
            response_mask[i, b, : r.numel()] = True
    index = torch.as_tensor([int(e["index"]) for e in examples], dtype=torch.long)
    return PreferenceBatch(prompt_ids, prompt_mask, response_ids, response_mask, index)
