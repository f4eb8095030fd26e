"""Check any sampler's unbiasedness, exactly where its support is small and by Monte Carlo otherwise.

For your own sampler, in your own tests::

    from lit_prunedpo.testing import check_position_sampler
    check_position_sampler(MyPositions(rate=0.3))   # raises AssertionError with the numbers if it is biased

What is checked, and the tolerances:

* **exact** (where ``support`` enumerates at most ``max_support`` outcomes): the outcome probabilities sum to 1
  and the probability-weighted outcomes equal the reported inclusion (or branch) probabilities, to ``1e-9``;
  hence ``E[R_hat] = R`` exactly.
* **Monte Carlo** (always): over ``num_draws`` draws, each empirical inclusion frequency lies within
  ``z`` binomial standard errors of its reported probability, and the mean of the IPW estimate
  ``R_hat`` of a random sum lies within ``z`` standard errors of the true sum. The default ``z = 5``
  gives a false alarm less than once in a million checks.
* **end to end** (:func:`check_unbiased`): the real :func:`lit_prunedpo.step.plan.plan_step` and
  :func:`lit_prunedpo.step.estimate.ipw_sums` are run with any combination of samplers, and the mean of the
  branch-weighted estimate matches ``R_w - R_l`` within ``z`` standard errors. A position sampler that samples
  only the log-sum-exp (:mod:`lit_prunedpo.samplers.control_variates`) is fed each token's two terms
  (``rho_t = z_t - lse_t``, a random ``lse_t``, and for ``ReferenceLogSumExp`` a random baseline ``lse'_t``).
* **through a module's step** (:func:`check_step_unbiased`): the real plan, execute and estimate of a
  :class:`~lit_prunedpo.PrunedDPO` (its model, scorer, reference and layout); the means of the policy's and the
  reference's IPW sums, and of the gradient of the branch-weighted policy sums on random directions, match the
  unpruned step's within ``z`` standard errors.
* **a loss's reward estimate** (:func:`check_reward_estimate`): a quantity a loss computes from the IPW sums
  and the full lengths (a length-normalised mean, a token-averaged NLL) has, exactly by enumeration and by
  Monte Carlo through the real planner, the expectation of that quantity on the true sums.

Every name is imported from here; the modules: :mod:`~lit_prunedpo.testing.report` (the report, the exact and Monte
Carlo comparisons), :mod:`~lit_prunedpo.testing.samplers` (one sampler at a time),
:mod:`~lit_prunedpo.testing.end_to_end` (the planner and a module's step), :mod:`~lit_prunedpo.testing.losses` (a
loss's reward estimate and coefficient bias).
"""

from lit_prunedpo.testing.end_to_end import (at_scored, check_step_unbiased, check_unbiased, scored_values,
                                             synthetic_batch)
from lit_prunedpo.testing.losses import CoefficientBias, check_reward_estimate, coefficient_bias
from lit_prunedpo.testing.report import EXACT_TOL, SamplerReport
from lit_prunedpo.testing.samplers import (
    DEFAULT_LENGTHS, check_branch_sampler, check_position_sampler, check_prefix_sampler,
)

__all__ = [
    "DEFAULT_LENGTHS", "EXACT_TOL", "CoefficientBias", "SamplerReport", "at_scored", "check_branch_sampler",
    "check_position_sampler", "check_prefix_sampler", "check_reward_estimate", "check_step_unbiased", "check_unbiased",
    "coefficient_bias", "scored_values", "synthetic_batch",
]
