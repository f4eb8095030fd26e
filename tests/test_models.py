"""Model sources: specs that rebuild a source (for exports), FromConfig taking the data's vocabulary size
when the config leaves it out (through the real CLI), and FromConfig refusing config keys its config class does
not know (transformers would store them as attributes and keep the defaults)."""

from __future__ import annotations

import re

import pytest
import torch

from lit_prunedpo.cli import build_cli
from lit_prunedpo.models import FromConfig, Pretrained, source_from_spec

from helpers import REPO, TINY_LLAMA

GPT2_TOKENIZER = REPO.parent / "shared/tokenizers/gpt2"

NO_VOCAB = ('{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, '
            '"num_key_value_heads": 1, "tie_word_embeddings": false}')


def test_spec_rebuilds_the_same_weights(tiny_source):
    rebuilt = source_from_spec(tiny_source.spec())
    assert isinstance(rebuilt, FromConfig)
    for a, b in zip(tiny_source.build().state_dict().values(), rebuilt.build().state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert Pretrained("some/model", dtype="bfloat16").spec()["init_args"]["dtype"] == "bfloat16"


def test_from_config_takes_the_tokenizers_vocabulary_when_unset(tmp_path):
    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--model.policy.init_args.config={NO_VOCAB}",
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.model.policy.get_input_embeddings().num_embeddings == len(cli.datamodule.tokenizer) == 384


def test_lora_base_and_synthetic_data_vocabulary(tmp_path):
    cli = build_cli(["--config", str(REPO / "configs/lora.yaml"),
                     f"--model.policy.init_args.base.init_args.config={NO_VOCAB}",
                     "--data=lit_prunedpo.data.SyntheticPreferenceData", "--data.vocab_size=48",
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.model.policy.get_input_embeddings().num_embeddings == 48


def test_a_given_vocab_size_larger_than_the_tokenizers_is_kept_and_said(tmp_path, caplog):
    config = dict(TINY_LLAMA, vocab_size=512)
    import json

    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"),
                     f"--model.policy.init_args.config={json.dumps(config)}",
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.model.policy.get_input_embeddings().num_embeddings == 512
    assert "vocab_size 512 kept, larger than the data's 384" in caplog.text


@pytest.mark.parametrize("given", [[], ["--model.policy.init_args.config.vocab_size", "null"]],
                         ids=["left-out", "null"])
def test_the_quickstart_takes_another_tokenizers_size(tmp_path, caplog, given):
    # the quickstart YAML names no vocab_size, so GPT-2's tokenizer gives the model GPT-2's 50257 rows
    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--data.init_args.tokenizer={GPT2_TOKENIZER}",
                     f"--trainer.default_root_dir={tmp_path}", *given], run=False)
    assert cli.model.policy.get_input_embeddings().num_embeddings == len(cli.datamodule.tokenizer) == 50257
    assert "vocab_size not set, using the data's: 50257" in caplog.text


def test_a_vocab_size_smaller_than_the_tokenizers_is_refused_naming_both(tmp_path):
    # a config written for ByT5 (384) run with GPT-2's tokenizer: ids up to 50256 would index past the embedding
    with pytest.raises(ValueError, match="vocab_size is 384 but the tokenizer .*gpt2.* has 50257 tokens"):
        build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--data.init_args.tokenizer={GPT2_TOKENIZER}",
                   "--model.policy.init_args.config.vocab_size=384", f"--trainer.default_root_dir={tmp_path}"],
                  run=False)


def test_whole_file_training_without_validation(tmp_path):
    cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
                     "--data.init_args.val_fraction=0", "--data.init_args.max_rows=32", "--trainer.max_steps=3",
                     "--trainer.val_check_interval=2", "--trainer.enable_progress_bar=false"])
    assert cli.trainer.global_step == 3 and len(cli.datamodule.train_dataset) == 32
    assert not any(k.startswith("val/") for k in cli.trainer.callback_metrics)
    assert (tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt").exists()


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "qwen2"])
def test_from_config_accepts_the_config_classes_own_and_common_keys(model_type):
    common = dict(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=False,
                  torch_dtype="float32", dtype="float32", pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if model_type != "gpt2":  # GPT-2 has learned positions: rotary keys are refused for it (next test)
        common.update(intermediate_size=16, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=5e4)
    config = FromConfig(model_type, common).build().config
    assert (config.hidden_size, config.vocab_size, config.tie_word_embeddings) == (32, 40, False)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 2)


@pytest.mark.parametrize(
    ("model_type", "config", "message"),
    [
        ("llama", {"hiden_size": 128}, r"^FromConfig: unknown config key 'hiden_size' \(closest valid names: "
                                       r"hidden_size\b.*\) for model_type 'llama' \(LlamaConfig\)$"),
        ("gpt2", {"n_emb": 8, "zzqq": 1}, r"'n_emb' \(closest valid names: n_embd\); 'zzqq' \(no close valid name\) "
                                          r"for model_type 'gpt2' \(GPT2Config\); its keys are: .*\bn_embd\b"),
        ("gpt2", {"rope_theta": 1e4}, r"'rope_theta' \(this model has no rotary position embeddings\)"),
        ("llama", {"model_type": "gpt2"}, r"give it as FromConfig's model_type"),
        ("lama", {}, r"^FromConfig: unknown model_type 'lama' .*closest model types: llama"),
    ],
    ids=["typo", "two-keys", "rope-on-gpt2", "model_type-inside", "model_type"],
)
def test_from_config_refuses_keys_its_config_class_does_not_know(model_type, config, message):
    with pytest.raises(ValueError, match=message):
        FromConfig(model_type, config)


def test_a_model_folder_that_is_gone_is_named_not_taken_for_a_hub_name(tmp_path, tiny_source):
    from lit_prunedpo.models import Pretrained

    folder = tmp_path / "policy"
    tiny_source.build().save_pretrained(folder)
    assert Pretrained(str(folder)).build() is not None
    moved = tmp_path / "moved"
    folder.rename(moved)
    for name in (str(folder), "./policy", "~/no/such/policy"):
        with pytest.raises(FileNotFoundError,
                           match=rf"model folder {re.escape(name)} does not exist \(moved or deleted\?\)"):
            Pretrained(name).build()


def test_a_truncated_safetensors_file_is_named_as_incomplete(tmp_path, tiny_source):
    from lit_prunedpo.models import Pretrained

    folder = tmp_path / "policy"
    tiny_source.build().save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # an interrupted copy or download
    with pytest.raises(ValueError, match=rf"^model file {re.escape(str(weights))} is incomplete or corrupt "
                                         r"\(SafetensorError: .*\): save the model again with save_pretrained, or copy "
                                         r"or download it again$"):
        Pretrained(str(folder)).build()


def test_a_moved_adapter_export_names_its_gone_base_and_where_it_is_now(tmp_path):
    # what `lit-prunedpo export --adapter adapter` writes for a base without a hub name, moved since: transformers
    # handed the recorded path to the hub client ("Repo id must be in the form ...")
    import json

    moved = tmp_path / "moved"
    (moved / "base").mkdir(parents=True)
    (moved / "base/config.json").write_text("{}")
    gone = tmp_path / "adapter/base"
    (moved / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(gone)}))
    with pytest.raises(FileNotFoundError) as refused:
        Pretrained(str(moved)).build()
    assert str(refused.value) == (
        f"LoRA adapter folder {moved}: its base model {gone} (base_model_name_or_path in "
        f"{moved / 'adapter_config.json'}) does not exist (moved or deleted?): the folder was moved with its base: set "
        f"it to {moved / 'base'}")
