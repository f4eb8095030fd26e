"""A reference-cache build scores the LM head a chunk of positions at a time, and its values
are the model's own: each response token's log-prob equals the plain Hugging Face forward of that pair's prompt
and response alone, ``log_softmax(model(ids).logits)`` gathered at the token, compared independently of the
package's layouts and scorers. Tolerance ``atol=1e-5`` (``rtol=0``): float32 round-off of differently shaped
matmuls (padded batch against one unpadded row) on log-probs of magnitude up to ~12 (ln 50,257).
"""

from __future__ import annotations

import pytest
import torch
from helpers import REPO

import lit_prunedpo.reference.build as rb
from lit_prunedpo.data import PreferenceDataModule, SyntheticPreferenceData
from lit_prunedpo.head import OutputHead
from lit_prunedpo.models import FromConfig
from lit_prunedpo.reference import compute_reference_logps
from lit_prunedpo.scoring import TokenScorer

ATOL = 1e-5
HH_DATA = str(REPO.parent / "shared/data/hh-rlhf/harmless-base-test.jsonl.gz")
GPT2_TOKENIZER = str(REPO.parent / "shared/tokenizers/gpt2")
TINY_GPT2 = dict(vocab_size=50257, n_embd=32, n_layer=1, n_head=2, n_positions=1024)


class RowCounting(TokenScorer):
    """The plain scorer, recording how many positions each head call projects."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def log_probs(self, head, hidden, targets, stats=None):
        self.rows.append(hidden.shape[0])
        return super().log_probs(head, hidden, targets, stats)


@torch.no_grad()
def plain_forward_logps(model, pair: dict) -> list[torch.Tensor]:
    """Chosen and rejected log-probs of ``pair`` from ``model(prompt ++ response).logits``, one response at a time."""
    out = []
    for key in ("chosen_ids", "rejected_ids"):
        prompt, response = pair["prompt_ids"], pair[key]
        ids = torch.tensor([prompt + response])
        logps = model(input_ids=ids).logits[0].float().log_softmax(-1)
        predicting = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)  # column before each token
        out.append(logps[predicting, torch.tensor(response)])
    return out


def assert_matches_plain_forward(store, model, pairs):
    for pair in pairs:
        for branch, expected in enumerate(plain_forward_logps(model, pair)):
            t = torch.arange(expected.numel())
            got = store.gather(torch.tensor(pair["index"]), torch.tensor(branch), t)
            torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=f"pair {pair['index']} branch {branch}")


@pytest.mark.parametrize("logits_per_chunk", [rb.LOGITS_PER_CHUNK, 7 * 32 + 5])
def test_build_equals_the_plain_forward_on_every_token_of_every_pair(tiny_source, logits_per_chunk):
    """48 pairs (train and validation), both responses, every token; with the default budget (one chunk per batch
    at this 32-token vocabulary) and with 7 positions per chunk (chunk boundaries inside most responses, ~20
    tokens each)."""
    dm = SyntheticPreferenceData(vocab_size=32, num_train=40, num_val=8, batch_size=8, seed=3)
    dm.setup("fit")
    model = tiny_source.build().eval()
    scorer = RowCounting()
    batches = list(dm.reference_batches(16))
    store = compute_reference_logps(model, batches, scorer, logits_per_chunk=logits_per_chunk)
    assert store.num_rows == 48 and sum(scorer.rows) == store.num_tokens
    if logits_per_chunk == rb.LOGITS_PER_CHUNK:
        assert len(scorer.rows) == len(batches)
    else:
        assert max(scorer.rows) == 7 and len(scorer.rows) > 250
    assert_matches_plain_forward(store, model, dm.train_pairs + dm.val_pairs)


def test_hh_rlhf_build_never_projects_a_whole_batch_and_equals_the_plain_forward():
    """Real HH-RLHF pairs and GPT-2 tokenizer, a tiny GPT-2 with the full 50,257-token vocabulary, batches of 16
    pairs (1,002 and 1,475 response tokens): no head call projects more than ``LOGITS_PER_CHUNK / 50,257 = 83``
    positions, where the unchunked build projected every response token of the batch at once."""
    dm = PreferenceDataModule(HH_DATA, tokenizer=GPT2_TOKENIZER, max_rows=32, val_fraction=0.0, max_length=256,
                              max_prompt_length=128, batch_size=16)
    dm.setup("fit")
    model = FromConfig(model_type="gpt2", config=TINY_GPT2, seed=0).build().eval()
    scorer = RowCounting()
    store = compute_reference_logps(model, dm.reference_batches(16), scorer)
    rows = rb.LOGITS_PER_CHUNK // 50257
    assert rows == 83 and max(scorer.rows) == rows and sum(scorer.rows) == store.num_tokens
    assert store.num_tokens / 2 > 10 * rows  # a batch averages more than 10 chunks
    pairs = [dm.train_dataset[i] for i in range(len(dm.train_dataset))]
    assert len(pairs) == store.num_rows == 32
    assert_matches_plain_forward(store, model, pairs)


def test_head_rows_follow_the_vocabulary_and_never_drop_to_zero():
    assert rb.head_rows(OutputHead(torch.nn.Linear(8, 50257, bias=False)), 1 << 22) == 83
    assert rb.head_rows(OutputHead(torch.nn.Linear(8, 32)), 100) == 3
    assert rb.head_rows(OutputHead(torch.nn.Linear(8, 50257)), 10) == 1  # a vocabulary above the budget: one row
    assert rb.head_rows(OutputHead(torch.nn.Identity()), 1 << 22) == 64  # no 2-D weight: taken as 2**16 tokens


def test_a_budget_below_one_logit_is_refused(tiny_source):
    with pytest.raises(ValueError, match="logits_per_chunk must be >= 1, got 0"):
        compute_reference_logps(tiny_source.build(), [], logits_per_chunk=0)
