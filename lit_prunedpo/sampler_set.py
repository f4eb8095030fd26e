"""The step's three samplers as a run holds them: as given, admitted against the run's model, swapped mid-run.

A position sampler that splits the log-softmax (:class:`~lit_prunedpo.samplers.LogSoftmaxSplit`) runs only where the
policy's head gives each target's logit as one row and, for ``ReferenceLogSumExp``, where the reference stores its
log-sum-exps. That is known only once the run is set up (the reference prepared, the head perhaps sharded by FSDP2).
:class:`SamplerSet` keeps the samplers as given and admits a position sampler in one place, :meth:`SamplerSet.admitted`
(``guards.usable_position_sampler``: the sampler itself, the sampler it wraps with a warning when it has ``fallback``,
or a refusal): at set-up and again after sharding (:meth:`SamplerSet.set_up`), for a sampler swapped in after
(:meth:`SamplerSet.use`), and for the samplers a measurement runs the module's step with (:meth:`SamplerSet.chosen`:
the gradient-noise calibration of ``AutoPruning``, the Monte Carlo unbiasedness check), so that every path that
builds a step's parts runs what training would run. The same object coming back (callbacks pass theirs every step)
is not admitted again.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lit_prunedpo.guards import check_sampler_kinds, usable_position_sampler
from lit_prunedpo.samplers import BranchSampler, PositionSampler, PrefixSampler

Samplers = tuple[PrefixSampler, PositionSampler, BranchSampler]


class SamplerSet:
    """The prefix, position and branch samplers of a run (each given, none ``None``)."""

    def __init__(self, prefix: PrefixSampler, position: PositionSampler, branch: BranchSampler) -> None:
        self._given: Samplers = (prefix, position, branch)
        self._position = position  # the given position sampler as admitted (as given before set-up)
        self._run: tuple[nn.Module, Any] | None = None  # (policy, reference) once set up

    @property
    def samplers(self) -> Samplers:
        """The samplers the next step draws with: the position sampler as admitted."""
        return self._given[0], self._position, self._given[2]

    def set_up(self, policy: nn.Module, reference: Any) -> None:
        """Admit the given position sampler against this run's policy and reference: at every set-up, and again once
        the policy is sharded (a sharded head gives no row)."""
        self._run = (policy, reference)
        self._position = usable_position_sampler(self._given[1], policy, reference)

    def admitted(self, position: PositionSampler) -> PositionSampler:
        """``position`` as this run can use it (before set-up: as given; set-up decides)."""
        if position is self._given[1]:
            return self._position
        return position if self._run is None else usable_position_sampler(position, *self._run)

    def use(self, prefix: PrefixSampler | None = None, position: PositionSampler | None = None,
            branch: BranchSampler | None = None) -> None:
        """Draw the next steps with these samplers (``None``: keep the current one); a refused sampler changes
        nothing."""
        check_sampler_kinds("use_samplers", prefix, position, branch)
        admitted = self.admitted(position) if position is not None else self._position
        self._given = tuple(new if new is not None else old  # type: ignore[assignment]
                            for new, old in zip((prefix, position, branch), self._given))
        self._position = admitted

    def chosen(self, prefix: PrefixSampler | None = None, position: PositionSampler | None = None,
               branch: BranchSampler | None = None) -> Samplers:
        """These samplers in place of the set's own (``None``: its own), a position sampler admitted, without
        changing the set."""
        own = self.samplers
        return (prefix if prefix is not None else own[0],
                self.admitted(position) if position is not None else own[1],
                branch if branch is not None else own[2])
