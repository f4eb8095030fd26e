"""SmolLM2-135M-Instruct against TRL's own ``DPOTrainer``: the default path's loss and gradient equal TRL's on the
same pairs, in float32 and in bf16-mixed.

TRL is the independent implementation here: its ``compute_loss`` runs the concatenated chosen + rejected rows
through the model (right-padded), with its reference model forward online (``precompute_ref_log_probs=False``), on
the probe's pairs given as token ids (its tokenizer never runs: ``_prepare_dataset`` is bypassed, as in the bench's
TRL peer). The policy is moved off the reference first, or both losses would be ln 2 whatever either computes.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util

import pytest
import torch

from test_probe_precision_real import moved_off_reference, smollm2  # noqa: F401  (smollm2: the module fixture)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the [peer] extra (trl)")]


def _trl_loss_and_gradient(policy, reference, batch, beta, autocast):
    import datasets
    import transformers
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    class PreTokenized(DPOTrainer):
        def _prepare_dataset(self, dataset, *args, **kwargs):  # rows are token ids already
            return dataset

    rows = []
    for i in range(batch.num_pairs):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]].tolist()
        chosen, rejected = (batch.response_ids[i, b][batch.response_mask[i, b]].tolist() for b in (0, 1))
        rows.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    args = DPOConfig(output_dir="/tmp/lit-prunedpo-trl-parity", per_device_train_batch_size=len(rows), beta=beta,
                     precompute_ref_log_probs=False, max_length=None, report_to=[], save_strategy="no", use_cpu=True,
                     disable_tqdm=True, dataloader_num_workers=0, bf16=False)  # TRL 1.16 defaults to bf16 autocast
    # (accelerate would wrap the model's forward in it for good): the precision is the test's, set below
    trainer = PreTokenized(model=policy, ref_model=reference, args=args, train_dataset=datasets.Dataset.from_list(rows),
                           processing_class=transformers.ByT5Tokenizer(), data_collator=DataCollatorForPreference(0))
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(len(rows))])
    policy.zero_grad()
    context = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
    with context:
        loss = trainer.compute_loss(policy, inputs)
    loss.backward()
    return float(loss), torch.cat([p.grad.flatten() for p in policy.parameters()])


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["32-true", "bf16-mixed"])
def test_the_default_path_gives_trls_loss_and_gradient_on_smollm2(smollm2, autocast):  # noqa: F811
    """Bounds as against plain Hugging Face DPO (test_probe_precision_real.py): 1e-4 relative loss and 1e-3 relative
    gradient in float32; bf16-mixed rounds each side's bfloat16 matmuls differently, hence 2e-2 and 0.1."""
    module, batch = moved_off_reference(copy.deepcopy(smollm2))
    context = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
    module.policy.zero_grad()
    with context:
        out = module.step(batch)
    out.estimate.objective.backward()
    ours = torch.cat([p.grad.flatten() for p in module.policy.parameters()])
    ours_loss = float(out.estimate.objective)
    trl_loss, trl = _trl_loss_and_gradient(module.policy, module.reference.models()[0], batch, module.beta, autocast)
    assert abs(ours_loss - 0.6931471805599453) > 1e-3, "the policy did not move off the reference: nothing compared"
    relative = 1e-4 if autocast is None else 2e-2
    assert abs(ours_loss - trl_loss) <= relative * abs(trl_loss), (ours_loss, trl_loss)
    assert float((ours - trl).norm()) <= (1e-3 if autocast is None else 0.1) * float(trl.norm())
