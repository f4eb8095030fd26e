"""``PrunedDPO.use_samplers``, the one way to change a module's samplers: a sampler of the wrong kind is refused
naming the argument and the class, ``None`` keeps the current sampler, a position sampler that splits the
log-softmax passes set-up's checks once the module is set up, and the sampler attributes cannot be assigned."""

from __future__ import annotations

import re

import pytest
import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.reference import CachedReference, compute_reference_logps
from lit_prunedpo.samplers import (
    AllPositions, BernoulliPositions, BothBranches, ExactTargetLogits, FullPrefix, RandomBranch, ReferenceLogSumExp,
    SharedFractionPrefix,
)

from helpers import make_batch

ONLINE_REFUSAL = "ReferenceLogSumExp needs the reference's log-sum-exp at every executed position"


def samplers(module: PrunedDPO) -> tuple:
    return module.prefix_sampler, module.position_sampler, module.branch_sampler


#: use_samplers' arguments, in their order
ARGUMENTS = ("prefix", "position", "branch")


@pytest.mark.parametrize("index, wrong, kind", [
    (0, AllPositions(), "PrefixSampler"),
    (1, FullPrefix(), "PositionSampler"),
    (2, BernoulliPositions(0.5), "BranchSampler"),
    (1, "AllPositions", "PositionSampler"),
])
def test_a_sampler_of_the_wrong_kind_is_refused_naming_the_argument_and_the_class(tiny_source, index, wrong, kind):
    module = PrunedDPO(policy=tiny_source)
    before = samplers(module)
    given = [SharedFractionPrefix(0.5), BernoulliPositions(0.5), RandomBranch()]  # the other two are valid:
    given[index] = wrong  # a refusal changes none of the three
    message = f"use_samplers: {ARGUMENTS[index]} must be a {kind}, got {type(wrong).__name__}"
    with pytest.raises(TypeError, match=re.escape(message)):
        module.use_samplers(**dict(zip(ARGUMENTS, given)))
    assert samplers(module) == before


@pytest.mark.parametrize("cls, fix", [(BernoulliPositions, ": pass an instance, BernoulliPositions(...)"),
                                      (FullPrefix, "")])
def test_a_sampler_class_instead_of_a_sampler_is_refused_saying_so(tiny_source, cls, fix):
    module = PrunedDPO(policy=tiny_source)
    message = f"use_samplers: position must be a PositionSampler, got the class {cls.__name__} itself{fix}"
    with pytest.raises(TypeError, match=re.escape(message) + "$"):
        module.use_samplers(position=cls)


def test_the_refusing_setter_points_at_use_samplers():
    from lit_prunedpo.guards import refusing_setter

    class Module:  # PrunedDPO's sampler properties, as they are meant to take it
        position_sampler = property(lambda self: None).setter(refusing_setter("position"))

    with pytest.raises(AttributeError) as refused:
        Module().position_sampler = AllPositions()
    assert str(refused.value) == ("Module.position_sampler cannot be assigned: call use_samplers(position=...), which "
                                  "checks the sampler and changes it for the next steps")


def test_none_keeps_the_current_sampler(tiny_source):
    module = PrunedDPO(policy=tiny_source)
    prefix, position, _ = samplers(module)
    branch = RandomBranch()
    module.use_samplers(branch=branch)
    assert samplers(module) == (prefix, position, branch)
    module.use_samplers()
    assert samplers(module) == (prefix, position, branch)
    new_prefix, new_position = SharedFractionPrefix(0.5), BernoulliPositions(0.5)
    module.use_samplers(new_prefix, new_position)
    assert samplers(module) == (new_prefix, new_position, branch)


def test_the_next_step_draws_with_the_new_samplers(tiny_source):
    module = PrunedDPO(policy=tiny_source, shared_prompt=False)
    batch = make_batch([3, 1, 4], [5, 2, 7], [4, 6, 1])
    module.use_samplers(branch=RandomBranch())
    assert module.parts.branch_sampler is module.branch_sampler
    assert module.step(batch, generator=torch.Generator()).stats.branches_backpropagated == batch.num_pairs
    module.use_samplers(branch=BothBranches())
    assert module.step(batch, generator=torch.Generator()).stats.branches_backpropagated == 2 * batch.num_pairs


@pytest.mark.parametrize("name", ["prefix_sampler", "position_sampler", "branch_sampler"])
def test_the_sampler_attributes_cannot_be_assigned(tiny_source, name):
    module = PrunedDPO(policy=tiny_source)
    with pytest.raises(AttributeError, match="use_samplers"):
        setattr(module, name, AllPositions())


def test_once_set_up_a_log_softmax_split_passes_set_ups_checks(tiny_source):
    module = PrunedDPO(policy=tiny_source)  # an online reference: no log-sum-exps of the reference
    module.setup("fit")
    with pytest.raises(ValueError, match=re.escape(ONLINE_REFUSAL)):
        module.use_samplers(position=ReferenceLogSumExp())
    assert isinstance(module.position_sampler, AllPositions)  # refused: nothing changed
    split = ExactTargetLogits()  # works with any reference, and the tiny Llama's head is a plain linear one
    module.use_samplers(position=split)
    assert module.position_sampler is split


def test_before_set_up_the_check_is_set_ups_own(tiny_source):
    module = PrunedDPO(policy=tiny_source)
    module.use_samplers(position=ReferenceLogSumExp())  # nothing to check against yet: set-up decides
    with pytest.raises(ValueError, match=re.escape(ONLINE_REFUSAL)):
        module.setup("fit")


def test_a_cached_reference_with_log_sum_exps_runs_reference_lse(tiny_source):
    batch = make_batch([3, 1, 4], [5, 2, 7], [4, 6, 1])
    reference = CachedReference.from_store(compute_reference_logps(tiny_source.build(), [batch], with_lse=True))
    module = PrunedDPO(policy=tiny_source, reference=reference)
    module.setup("fit")
    module.use_samplers(position=ReferenceLogSumExp())
    assert isinstance(module.position_sampler, ReferenceLogSumExp)


@pytest.mark.parametrize("argument", ["prefix_sampler", "position_sampler", "branch_sampler"])
def test_a_sampler_class_given_to_the_constructor_is_refused_at_once(tiny_source, argument):
    name = argument.removesuffix("_sampler")
    kind = {"prefix": "PrefixSampler", "position": "PositionSampler", "branch": "BranchSampler"}[name]
    message = f"PrunedDPO: {name} must be a {kind}, got the class BernoulliPositions itself"
    with pytest.raises(TypeError, match=re.escape(message)):
        PrunedDPO(policy=tiny_source, **{argument: BernoulliPositions})
