"""PruneEarly: the configured samplers for the first share of the steps, exact samplers after, in a real fit."""

from __future__ import annotations

import lightning as L
import pytest

from helpers import RecordWork
from lit_prunedpo import PrunedDPO
from lit_prunedpo.callbacks import PruneEarly
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.samplers import BernoulliPositions, BothBranches, RandomBranch, SharedFractionPrefix



def test_prunes_the_first_share_of_steps_then_runs_exact(tiny_source):
    branch = RandomBranch()
    # the padded layout scores every position of an exact step (the shared-prompt layout skips the responses'
    # common prefix under a margin loss, which would blur "exact" here)
    module = PrunedDPO(policy=tiny_source, prefix_sampler=SharedFractionPrefix(0.3),
                       position_sampler=BernoulliPositions(0.2),
                       branch_sampler=branch, shared_prompt=False)
    record = RecordWork()
    trainer = L.Trainer(accelerator="cpu", max_steps=6, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[PruneEarly(0.5), record])
    trainer.fit(module, datamodule=SyntheticPreferenceData(vocab_size=32, num_train=48, num_val=8, batch_size=4))
    assert len(record.steps) == 6
    for step, (branches, all_branches, positions, all_positions) in enumerate(record.steps):
        if step < 3:  # pruned: one branch per pair, a fraction of the positions
            assert branches == all_branches // 2 and positions < all_positions, step
        else:  # exact: concatenated DPO
            assert branches == all_branches and positions == all_positions, step
    assert module.branch_sampler is branch  # the configured samplers are back after fit
    assert not isinstance(module.branch_sampler, BothBranches)


def test_bad_arguments():
    with pytest.raises(ValueError, match="prune_fraction"):
        PruneEarly(1.5)


def test_needs_max_steps(tiny_source):
    module = PrunedDPO(policy=tiny_source, branch_sampler=RandomBranch())
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[PruneEarly(0.5)])
    with pytest.raises(ValueError, match="max_steps"):
        trainer.fit(module, datamodule=SyntheticPreferenceData(vocab_size=32, num_train=8, num_val=8, batch_size=4))
