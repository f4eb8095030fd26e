"""The scorer: log-probs from gathered hidden states equal the stock full-logits forward, on left-padded,
truncated rows; models that transform logits after the head are refused."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo.models import FromConfig
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.samplers import BernoulliPositions, BothBranches, SharedFractionPrefix
from lit_prunedpo.scoring import TokenScorer, group_inputs, split_causal_lm

from helpers import TINY_LLAMA, make_batch


@pytest.mark.parametrize("model_type, config", [
    ("llama", TINY_LLAMA),
    ("gpt2", dict(vocab_size=32, n_embd=32, n_layer=2, n_head=2, n_positions=64)),
])
def test_gathered_log_probs_equal_full_forward(model_type, config):
    model = FromConfig(model_type, config).build().eval()
    batch = make_batch([3, 1, 5], [6, 2, 9], [4, 7, 1], seed=2)
    g = torch.Generator().manual_seed(0)
    plan = plan_step(batch, SharedFractionPrefix(0.4), BernoulliPositions(0.5), BothBranches(), g)
    (group,) = plan.groups
    inputs = group_inputs(batch, group)
    assert inputs.input_ids.shape == (group.num_rows, batch.prompt_width + int(group.kept.max()) - 1)
    with torch.no_grad():
        got = TokenScorer()(model, inputs)
        # reference: each row alone, unpadded, through the stock forward with all logits
        for k in range(group.num_scored):
            r, t = int(group.scored_row[k]), int(group.scored_t[k])
            i, b = int(group.pair[r]), int(group.branch[r])
            prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
            response = batch.response_ids[i, b][batch.response_mask[i, b]]
            ids = torch.cat([prompt, response[:t]])[None]
            logps = model(input_ids=ids).logits[0, -1].float().log_softmax(-1)
            torch.testing.assert_close(got[k], logps[response[t]], atol=1e-5, rtol=1e-5)


def test_non_causal_lm_is_refused():
    with pytest.raises(ValueError, match="body and an LM head"):
        split_causal_lm(torch.nn.Linear(2, 2))
