"""WarmupCosineLR: linear warm-up, cosine decay, the trainer's step count filled in when not given."""

from __future__ import annotations

import math

import pytest
import torch

from lit_prunedpo.optim import WarmupCosineLR


def rates(scheduler, steps):
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def test_warmup_then_cosine():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    lr = rates(WarmupCosineLR(opt, warmup_steps=3, total_steps=13, min_lr_ratio=0.1), 14)
    assert lr[:3] == pytest.approx([0.25, 0.5, 0.75])
    assert lr[3] == pytest.approx(1.0)
    assert lr[8] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr[13] == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs, name", [({"warmup_steps": -1}, "warmup_steps"), ({"total_steps": 0}, "total_steps"),
                                          ({"min_lr_ratio": 2.0}, "min_lr_ratio")])
def test_bad_arguments(kwargs, name):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=name):
        WarmupCosineLR(opt, **kwargs)
