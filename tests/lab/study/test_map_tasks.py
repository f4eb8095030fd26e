"""The map's generated tasks: response lengths, pair similarity, label noise, and the LM head's share of a
vanilla step by the cost model, hitting each target of the default map."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo_lab.bench.cost import ModelDims
from lit_prunedpo.data.unrelated import unrelated_pairs
from lit_prunedpo_lab.study.map_tasks import PROMPT_TOKENS, CellTask, head_share, hh_cell
from lit_prunedpo.testing import synthetic_batch


@pytest.mark.parametrize("similarity", ["near-duplicate", "unrelated"])
def test_cell_data_has_the_lengths_and_similarity_asked_for(similarity, tmp_path):
    task = CellTask(length=16, similarity=similarity, target_head_share=0.25, batch_size=8, num_rows=200)
    dm = task.datamodule(tmp_path)
    batches = list(dm.train_dataloader())
    lengths = torch.cat([b.response_lengths for b in batches])
    assert bool((lengths == 16).all())
    assert all(int(b.prompt_mask.sum(1).max()) == PROMPT_TOKENS for b in batches)
    differ = torch.cat([(b.response_ids[:, 0] != b.response_ids[:, 1]).sum(-1) for b in batches])
    if similarity == "near-duplicate":
        assert bool((differ == 1).all())  # one wrong letter
    else:
        assert float(differ.float().mean()) > 10  # random letters: ~15 of 16 positions differ (EOS is shared)
    assert task.best_accuracy == pytest.approx(0.9)
    rows = task.rows()
    assert 0.05 < sum(rows["swapped"]) / len(rows) < 0.15


@pytest.mark.parametrize("length", [16, 64, 256])
@pytest.mark.parametrize("share", [0.03, 0.25, 0.97])
def test_head_share_hits_the_target(length, share):
    task = CellTask(length=length, target_head_share=share, batch_size=8)
    dims = ModelDims.from_model(task.policy(0).build())
    batch = synthetic_batch(torch.full((8, 2), length), prompt_length=PROMPT_TOKENS)
    assert head_share([batch], dims) == pytest.approx(share, abs=0.01)
    assert task.model["max_position_embeddings"] >= PROMPT_TOKENS + length


def test_head_share_on_real_batches_matches_the_planned_one(tmp_path):
    task = CellTask(length=64, target_head_share=0.25, batch_size=4, num_rows=64)
    dm = task.datamodule(tmp_path)
    dims = ModelDims.from_model(task.policy(0).build())
    real = head_share([b for _, b in zip(range(3), dm.train_dataloader())], dims)
    planned = head_share([synthetic_batch(torch.full((4, 2), 64), prompt_length=PROMPT_TOKENS)], dims)
    assert real == pytest.approx(planned, rel=1e-6)


def test_bad_cells_are_refused():
    with pytest.raises(ValueError, match="needs a vocabulary of .* < 384"):
        CellTask(length=16, target_head_share=0.001)
    with pytest.raises(ValueError, match=r"head_share must be in \(0, 1\)"):
        CellTask(length=16, target_head_share=1.0)
    with pytest.raises(ValueError, match="length must be an integer"):
        CellTask(length=1)
    with pytest.raises(ValueError, match="similarity must be one of"):
        CellTask(length=16, similarity="same")  # type: ignore[arg-type]


def test_unrelated_pairs_and_the_hh_cell():
    rows = unrelated_pairs(num_rows=50, min_length=3, max_length=3, label_noise=0.0)
    assert all(c != r and len(c) == len(r) == 3 for c, r in zip(rows["chosen"], rows["rejected"]))
    with pytest.raises(ValueError, match="label_noise"):
        unrelated_pairs(label_noise=0.5)
    hh = hh_cell(64, 8)
    assert (hh.max_length, hh.max_prompt_length, hh.batch_size, hh.name) == (96, 32, 8, "hh-rlhf-L64-B8")
    assert hh.model["max_position_embeddings"] >= 96
