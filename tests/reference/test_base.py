"""The reference seam's lifecycle: what a source is handed (runtime, data), what it exposes instead of its
attributes (``models``, ``with_scorer``), and the import paths kept for configs written before the package."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from helpers import make_batch
from lit_prunedpo import PrunedDPO
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.step.plan import exact_plan
from lit_prunedpo.reference import (
    CachedReference,
    NoReference,
    OnlineReference,
    ReferenceData,
    ReferenceRuntime,
)
from lit_prunedpo.scoring import TokenScorer


def test_runtime_of_a_trainer_and_of_none(tmp_path):
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=str(tmp_path),
                        precision="bf16-mixed")
    runtime = ReferenceRuntime.of(trainer)
    assert (runtime.device, runtime.root_dir, runtime.precision) == (torch.device("cpu"), str(tmp_path), "bf16-mixed")
    assert (runtime.world_size, runtime.rank) == (1, 0)
    with runtime.forward_context():
        assert torch.is_autocast_enabled("cpu")  # the trainer's autocast, handed to a cache build
    alone = ReferenceRuntime.of(None)
    assert (alone.device, alone.precision, alone.world_size, alone.rank) == (torch.device("cpu"), "32-true", 1, 0)


def test_data_modules_implement_the_reference_data_interface():
    assert isinstance(SyntheticPreferenceData(), ReferenceData)
    assert not isinstance(object(), ReferenceData)


def test_cached_reference_refuses_missing_or_unfit_data(tiny_source, tmp_path):
    policy, runtime = tiny_source.build(), ReferenceRuntime(root_dir=str(tmp_path))
    with pytest.raises(ValueError, match="CachedReference needs a LightningDataModule"):
        CachedReference().prepare(policy, None, runtime)
    with pytest.raises(TypeError, match="implement cache_fingerprint.*; LightningDataModule does not"):
        CachedReference().prepare(policy, L.LightningDataModule(), runtime)
    assert not list(tmp_path.iterdir()), "nothing is written for data that cannot be cached"


def test_online_reference_exposes_its_frozen_model_and_shares_it_with_another_scorer(tiny_source):
    module = PrunedDPO(policy=tiny_source)
    online = module.reference
    (frozen,) = online.models()
    assert not any(p.requires_grad for p in frozen.parameters()) and not frozen.training
    other = online.with_scorer(scorer := TokenScorer())
    assert other.models()[0] is frozen and other.scorer is scorer and online.scorer is module.scorer
    batch = make_batch([3, 1], [5, 2], [4, 6])
    plan = exact_plan(batch)
    for a, b in zip(online.token_logps(batch, plan), other.token_logps(batch, plan), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_sources_without_a_model_have_nothing_to_shard():
    assert NoReference().models() == [] and CachedReference().models() == []
    assert OnlineReference().models() == []  # not configured yet: no copy of the policy
