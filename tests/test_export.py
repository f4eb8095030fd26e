"""``lit-prunedpo export``: a checkpoint becomes a Hugging Face folder that ``from_pretrained`` loads and that
gives the trained module's logits; LoRA runs export merged weights or peft's adapter folder. The FSDP2 round
trip runs with the multi-process tests (tests/distributed)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_prunedpo.cli import build_cli, main
from lit_prunedpo.export import export, read_checkpoint

from helpers import REPO

GPT2_TOKENIZER = REPO.parent / "shared/tokenizers/gpt2"
FAST = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
        "--data.init_args.max_rows=64", "--data.init_args.val_fraction=0.25", "--data.init_args.batch_size=8"]
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"


def _fit(config: str, root, *extra: str):
    cli = build_cli(["--config", str(REPO / f"configs/{config}.yaml"), f"--trainer.default_root_dir={root}",
                     "--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=1",
                     *FAST, *extra], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (2, 11), generator=torch.Generator().manual_seed(0))


def _module_logits(policy, ids):
    with torch.no_grad():
        return policy.eval()(input_ids=ids).logits


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    return _fit("quickstart", root), root


def test_export_round_trip_from_a_single_file_checkpoint(trained, tmp_path):
    cli, root = trained
    ckpt = root / "lightning_logs/version_0/checkpoints/last.ckpt"
    main(["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'hf'}"])
    assert (tmp_path / "hf/model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(tokenizer).__name__ == "ByT5Tokenizer" and len(tokenizer) == 384
    ids = _ids(384)
    expected = _module_logits(cli.model.policy, ids)
    torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=0)
    prompt = tokenizer("abc", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 4)
    assert json.loads((tmp_path / "hf/lit_prunedpo_export.json").read_text())["global_step"] == 3


def test_export_writes_the_given_tokenizer_with_its_chat_template(trained, tmp_path):
    _, root = trained
    out = export(str(root / "lightning_logs/version_0/checkpoints/last.ckpt"), str(tmp_path / "hf"),
                 tokenizer=str(GPT2_TOKENIZER), chat_template=TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == TEMPLATE
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<|user|>hi\n"


def test_export_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        read_checkpoint(tmp_path / "missing.ckpt")
    bare = tmp_path / "bare.ckpt"
    torch.save({"state_dict": {"policy.w": torch.zeros(1)}}, bare)
    with pytest.raises(ValueError, match="no 'policy' metadata"):
        read_checkpoint(bare)
    with pytest.raises(ValueError, match="not a sharded Lightning checkpoint"):
        read_checkpoint(tmp_path)


def test_lora_exports_merged_weights_or_the_adapter(tmp_path):
    cli = _fit("lora", tmp_path / "run", f"--final.export_dir={tmp_path / 'merged'}")  # merged: the default
    ids = _ids(384)
    expected = _module_logits(cli.model.policy, ids)
    assert not (tmp_path / "merged/adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)

    from peft import PeftModel

    export(str(tmp_path / "run/lightning_logs/version_0/checkpoints/last.ckpt"), str(tmp_path / "adapter"), adapter="adapter")
    assert (tmp_path / "adapter/adapter_model.safetensors").exists() and not (tmp_path / "adapter/model.safetensors").exists()
    model = PeftModel.from_pretrained(cli.model.policy_source.base.build(), tmp_path / "adapter").eval()
    torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=0)
