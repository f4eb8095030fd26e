"""TRL's ``DPOTrainer`` as a peer in the benchmark: its loss on the same weights, rows, batches and beta.

``lit-prunedpo-bench --peer trl`` (``pip install -e ".[peer]"``) times, in every round, one step of TRL's own
DPO loss (``DPOTrainer.compute_loss``: the concatenated forward of chosen and rejected rows, log-probs of the
completion tokens, sigmoid loss) with a **precomputed reference** (``precompute_ref_log_probs=True``, TRL's
cheapest reference), then ``backward`` and an AdamW step: the same work as this project's training step. The
Trainer's loop, logging and dataloader are not timed (this project's Lightning loop is not timed either).

The reference log-probs are computed in ``DPOTrainer.__init__`` (not timed). Matched: the initial weights (the same ``FromConfig`` seed), every pair's tokens (TRL gets them pre-tokenized, so
its tokenizer and truncation never run: ``max_length=None``; both sides see exactly the same prompt and response
tokens, BOS included), the batches in the same order, ``beta`` and the learning rate. Departures from a stock
``DPOTrainer``: ``_prepare_dataset`` is bypassed for the pre-tokenized rows (TRL 1.16 re-tokenizes text columns
only), and the rows are padded with the batches' pad id (TRL's collator given it: the pad id of ``--data``'s
tokenizer, or the synthetic batches'), which the masks leave out of every sum either way.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lit_prunedpo.batch import PreferenceBatch


def _rows(batch: PreferenceBatch) -> list[dict[str, Any]]:
    rows = []
    for i in range(batch.num_pairs):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]].tolist()
        chosen, rejected = (batch.response_ids[i, b][batch.response_mask[i, b]].tolist() for b in (0, 1))
        rows.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return rows


class TRLPeer:
    """One TRL DPO step per call of :meth:`step`, on the benchmark's batch ``r``.

    Args:
        model: the policy, with the same initial weights as the benchmarked module's.
        batches: the benchmark's batches.
        beta: DPO's beta.
        lr: AdamW learning rate.
        pad_id: the batches' pad token id, which TRL pads its rows with.

    Raises:
        RuntimeError: if ``trl`` is not installed, naming the extra that installs it.
    """

    def __init__(self, model: torch.nn.Module, batches: Sequence[PreferenceBatch], beta: float, lr: float, pad_id: int) -> None:
        try:
            import datasets
            import transformers
            from trl import DPOConfig, DPOTrainer
            from trl.trainer.dpo_trainer import DataCollatorForPreference
        except ImportError as err:
            raise RuntimeError(f"--peer trl needs TRL: pip install -e '.[peer]' ({err})") from err

        class PreTokenized(DPOTrainer):
            def _prepare_dataset(self, dataset, *args, **kwargs):  # rows are token ids already
                return dataset

        rows = [row for batch in batches for row in _rows(batch.to("cpu"))]
        self.offsets = [0]
        for batch in batches:
            self.offsets.append(self.offsets[-1] + batch.num_pairs)
        tokenizer = transformers.ByT5Tokenizer()  # needs no files; never runs (the rows are token ids already)
        device = next(model.parameters()).device
        args = DPOConfig(
            output_dir="/tmp/lit-prunedpo-bench-trl", per_device_train_batch_size=batches[0].num_pairs, beta=beta,
            precompute_ref_log_probs=True, max_length=None, learning_rate=lr, report_to=[], save_strategy="no",
            use_cpu=device.type == "cpu", disable_tqdm=True, dataloader_num_workers=0, logging_steps=10**9,
        )
        self.trainer = PreTokenized(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                    processing_class=tokenizer, data_collator=DataCollatorForPreference(pad_id))
        self.dataset = self.trainer.train_dataset  # with every row's reference log-probs, computed in __init__
        self.model = model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.device = device

    def inputs(self, r: int) -> dict[str, torch.Tensor]:
        """TRL's collated inputs of batch ``r``: chosen and rejected rows of prompt + response, right-padded."""
        examples = [self.dataset[i] for i in range(self.offsets[r], self.offsets[r + 1])]
        return {k: v.to(self.device) for k, v in self.trainer.data_collator(examples).items()}

    def step(self, inputs: dict[str, torch.Tensor]) -> float:
        loss = self.trainer.compute_loss(self.model, inputs)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())
