"""``SamplerSet``: a run's samplers as given and as admitted against its model, in one place (set-up, again after
sharding, each swap, and every measurement of the step), each object admitted once. Against the real admission
(``guards.usable_position_sampler``) on a tiny Llama, whose head gives a row, with an online reference, which
stores no log-sum-exps."""

from __future__ import annotations

import warnings

import pytest

from lit_prunedpo import PrunedDPO
from lit_prunedpo.sampler_set import SamplerSet
from lit_prunedpo.samplers import (AllPositions, BothBranches, CoupledStratifiedPositions, ExactTargetLogits,
                                   FullPrefix, RandomBranch, ReferenceLogSumExp)

REFUSAL = "ReferenceLogSumExp needs the reference's log-sum-exp at every executed position"


@pytest.fixture
def run(tiny_source):
    module = PrunedDPO(policy=tiny_source)
    return module.policy, module.reference


def test_before_set_up_samplers_are_kept_as_given_and_set_up_decides(run):
    given = ReferenceLogSumExp()
    samplers = SamplerSet(FullPrefix(), given, BothBranches())
    other = ReferenceLogSumExp()
    assert samplers.samplers[1] is given and samplers.admitted(other) is other  # nothing to check against yet
    with pytest.raises(ValueError, match=REFUSAL):
        samplers.set_up(*run)


def test_a_swap_is_admitted_and_a_refused_one_changes_nothing(run):
    samplers = SamplerSet(FullPrefix(), AllPositions(), BothBranches())
    samplers.set_up(*run)
    before = samplers.samplers
    with pytest.raises(ValueError, match=REFUSAL):
        samplers.use(prefix=FullPrefix(), position=ReferenceLogSumExp(), branch=RandomBranch())
    assert samplers.samplers == before
    split, branch = ExactTargetLogits(CoupledStratifiedPositions(0.5)), RandomBranch()
    samplers.use(position=split, branch=branch)
    assert samplers.samplers == (before[0], split, branch)


def test_measurements_choose_without_changing_the_set_and_are_admitted_alike(run):
    samplers = SamplerSet(FullPrefix(), AllPositions(), BothBranches())
    samplers.set_up(*run)
    own = samplers.samplers
    split = ExactTargetLogits()
    chosen = samplers.chosen(position=split)
    assert chosen == (own[0], split, own[2]) and samplers.samplers == own
    with pytest.raises(ValueError, match=REFUSAL):
        samplers.chosen(position=ReferenceLogSumExp())


def test_the_given_object_is_admitted_once_and_set_up_admits_it_again(run, monkeypatch):
    import lit_prunedpo.sampler_set as module

    calls = []
    real = module.usable_position_sampler
    monkeypatch.setattr(module, "usable_position_sampler",
                        lambda position, *a: calls.append(position) or real(position, *a))
    given = ExactTargetLogits(fallback=True)
    samplers = SamplerSet(FullPrefix(), given, BothBranches())
    samplers.set_up(*run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samplers.use(position=given)  # a callback passing the same object: not admitted again
        assert samplers.chosen(position=given)[1] is given
    assert calls == [given]
    samplers.set_up(*run)  # a new set-up, or the head sharded: checked again
    assert calls == [given, given]
