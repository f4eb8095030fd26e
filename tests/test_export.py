"""``lit-prunedpo export``: a checkpoint becomes a Hugging Face folder that ``from_pretrained`` loads and that
gives the trained module's logits; LoRA runs export merged weights or peft's adapter folder. The FSDP2 round
trip runs with the multi-process tests (tests/distributed)."""

from __future__ import annotations

import json
import re

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
                 tokenizer="byt5", chat_template=TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == TEMPLATE
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<|user|>hi\n"


def test_export_refuses_a_tokenizer_larger_than_the_models_vocabulary(trained, tmp_path):
    _, root = trained  # the quickstart model: 384 rows (ByT5); GPT-2's tokenizer has 50257 tokens
    with pytest.raises(ValueError, match="has 50257 tokens but the model in .* has 384 embedding rows"):
        main(["export", f"--ckpt_path={root / 'lightning_logs/version_0/checkpoints/last.ckpt'}",
              f"--out={tmp_path / 'hf'}", f"--tokenizer={GPT2_TOKENIZER}"])
    assert not (tmp_path / "hf").exists()


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


def test_a_lora_adapter_of_a_random_base_loads_with_auto_peft_offline(tmp_path, monkeypatch):
    # what `export --help` says: AutoPeftModelForCausalLM.from_pretrained(out); the FromConfig base has no hub name,
    # so the export writes it to out/base and names it there (loaded from another working folder, offline)
    from peft import AutoPeftModelForCausalLM

    cli = _fit("lora", tmp_path / "run")
    ids = _ids(384)
    expected = _module_logits(cli.model.policy, ids)
    main(["export", f"--ckpt_path={tmp_path / 'run/lightning_logs/version_0/checkpoints/last.ckpt'}",
          f"--out={tmp_path / 'adapter'}", "--adapter=adapter"])
    config = json.loads((tmp_path / "adapter/adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "adapter/base").resolve())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path / "run")
    model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=0)


def _handmade_checkpoint(path, vocab: int, tokenizer: str) -> None:
    """A checkpoint as ``PrunedDPO`` writes it (policy weights and metadata, the data module's tokenizer), of a
    randomly initialised Llama: its config says BOS 1, EOS 2, no PAD (``LlamaConfig``'s defaults)."""
    from lit_prunedpo.export import policy_metadata
    from lit_prunedpo.models import FromConfig

    policy = FromConfig("llama", dict(vocab_size=vocab, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, tie_word_embeddings=True)).build()
    assert (policy.config.bos_token_id, policy.config.eos_token_id, policy.config.pad_token_id) == (1, 2, None)
    torch.save({"state_dict": {f"policy.{k}": v for k, v in policy.state_dict().items()},
                "policy": policy_metadata(policy), "datamodule_hyper_parameters": {"tokenizer": tokenizer}}, path)


@pytest.mark.parametrize(
    ("tokenizer", "vocab", "ids"),
    [("byt5", 384, (1, 1, 0)), (str(GPT2_TOKENIZER), 50257, (50256, 50256, None))],  # ByT5 has no BOS: Llama's 1 stays
    ids=["byt5", "gpt2"],
)
def test_export_writes_the_tokenizers_special_token_ids(tmp_path, capsys, tokenizer, vocab, ids):
    from transformers import AutoConfig, GenerationConfig

    _handmade_checkpoint(tmp_path / "run.ckpt", vocab, tokenizer)
    main(["export", f"--ckpt_path={tmp_path / 'run.ckpt'}", f"--out={tmp_path / 'hf'}"])
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (tok.eos_token_id, tok.pad_token_id) == ids[1:]
    for config in (AutoConfig.from_pretrained(tmp_path / "hf"), GenerationConfig.from_pretrained(tmp_path / "hf")):
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == ids, type(config).__name__
    said = capsys.readouterr().out
    assert "config.json eos_token_id: 2 -> " in said and "generation_config.json eos_token_id: 2 -> " in said


def test_export_of_what_is_not_a_checkpoint_names_the_file(trained, tmp_path):
    _, root = trained
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes((root / "lightning_logs/version_0/checkpoints/last.ckpt").read_bytes()[:5000])
    (tmp_path / "text.ckpt").write_text("hello\n")
    torch.save(torch.zeros(2), tmp_path / "tensor.ckpt")
    torch.save({"epoch": 0}, tmp_path / "nodict.ckpt")
    (tmp_path / "shards").mkdir()
    torch.save({"epoch": 0}, tmp_path / "shards/meta.pt")  # a meta.pt but no shards
    cases = {"text.ckpt": "not a readable Lightning checkpoint", "cut.ckpt": "not a readable Lightning checkpoint",
             "tensor.ckpt": r"not a Lightning checkpoint \(it holds a Tensor", "nodict.ckpt": r"not a Lightning checkpoint \(no 'state_dict' in it\)",
             "shards": "not a readable Lightning checkpoint", "plain": "not a sharded Lightning checkpoint"}
    (tmp_path / "plain").mkdir()
    for name, message in cases.items():
        with pytest.raises(ValueError, match=rf"^cannot load checkpoint {re.escape(str(tmp_path / name))}: {message}") as caught:
            main(["export", f"--ckpt_path={tmp_path / name}", f"--out={tmp_path / 'hf'}"])
        assert "\n" not in str(caught.value), name  # one line: the output's last
    with pytest.raises(FileNotFoundError, match=rf"^checkpoint not found: {re.escape(str(tmp_path / 'missing.ckpt'))}$"):
        main(["export", f"--ckpt_path={tmp_path / 'missing.ckpt'}", f"--out={tmp_path / 'hf'}"])
