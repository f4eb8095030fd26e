"""ValidationSamples: greedy completions of fixed held-out prompts at every validation, written beside the logs
(CSVLogger has no text API) and equal to what the policy generates."""

from __future__ import annotations

import json

import pytest
import torch

from lit_prunedpo.callbacks import ValidationSamples
from lit_prunedpo.cli import build_cli

from helpers import REPO

FAST = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
        "--data.init_args.max_rows=64", "--data.init_args.val_fraction=0.25", "--data.init_args.batch_size=8",
        "--trainer.limit_val_batches=1", "--trainer.val_check_interval=2", "--trainer.max_steps=4"]


def _fit(tmp_path, *callback_args):
    return build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"),
                      f"--trainer.default_root_dir={tmp_path}",
                      *FAST, "--trainer.callbacks+=lit_prunedpo.callbacks.ValidationSamples",
                      "--trainer.callbacks.max_new_tokens=6", *callback_args])


def _samples(cli):
    return next(c for c in cli.trainer.callbacks if isinstance(c, ValidationSamples))


def test_held_out_prompts_are_completed_at_every_validation(tmp_path):
    cli = _fit(tmp_path, "--trainer.callbacks.num_prompts=3")
    rows = [json.loads(line) for line in (tmp_path / "lightning_logs/version_0/samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 2, 2, 4, 4, 4]
    assert [r["prompt"] for r in rows[:3]] == [r["prompt"] for r in rows[3:]]  # the same fixed prompts
    assert all(r["prompt"] for r in rows)
    # the last validation's text is the final policy's greedy completion
    callback = _samples(cli)
    ids, mask = callback._prompt_inputs(cli.trainer)
    tok = cli.datamodule.tokenizer
    with torch.no_grad():
        out = cli.model.policy.eval().generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=6,
                                               do_sample=False, pad_token_id=tok.pad_token_id,
                                               eos_token_id=tok.eos_token_id)
    expected = [tok.decode(row[ids.shape[1]:].tolist(), skip_special_tokens=True) for row in out]
    assert [r["completion"] for r in rows[3:]] == expected
    assert callback.history == rows


def test_text_prompts_are_encoded_with_the_data_tokenizer(tmp_path):
    from types import SimpleNamespace

    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}"],
                    run=False)
    callback = ValidationSamples(prompts=["abc", "hello there"], max_new_tokens=3)
    trainer = SimpleNamespace(datamodule=cli.datamodule, global_step=7)
    samples = callback.generate(trainer, cli.model)
    assert [s["prompt"] for s in samples] == ["abc", "hello there"] and all(s["step"] == 7 for s in samples)
    ids, mask = callback._prompt_inputs(trainer)
    assert mask.sum(1).tolist() == [3, 11]  # ByT5 has no BOS: the bytes alone
    assert not mask[0, :8].any() and mask[0, 8:].all()  # left-padded to the longer prompt


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="prompts"):
        ValidationSamples(prompts=[])
    with pytest.raises(ValueError, match="num_prompts"):
        ValidationSamples(num_prompts=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ValidationSamples(max_new_tokens=0)
    with pytest.raises(ValueError, match="filename"):
        ValidationSamples(filename="a/b.jsonl")
