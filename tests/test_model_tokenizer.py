"""A pretrained policy's own tokenizer must be the data's (lit_prunedpo.model_tokenizer): the quickstart with a
``Pretrained`` model and ByT5's byte ids is refused in one line before the model is built, through the real CLI; the
same tokenizer by another path, a model without a tokenizer and a hub name the cache lacks pass without a word."""

from __future__ import annotations

import json
import re
import time

import pytest
from huggingface_hub import constants
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

from lit_prunedpo.cli import build_cli
from lit_prunedpo.model_tokenizer import check_model_tokenizer, model_tokenizer, vocabulary_difference

from helpers import REPO

GPT2_TOKENIZER = REPO.parent / "shared/tokenizers/gpt2"
PRETRAINED = ["--model.policy", "lit_prunedpo.models.Pretrained"]


def tiny_qwen2(folder, vocab_size=50257, weights=True, tokenizer=True):
    """A tiny random Qwen2 saved in ``folder``, with GPT-2's tokenizer beside it (the reported setup)."""
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    if weights:
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    if tokenizer:
        AutoTokenizer.from_pretrained(GPT2_TOKENIZER).save_pretrained(folder)
    return folder


def quickstart(tmp_path, *args):
    return ["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path / 'run'}", *args]


def test_the_quickstart_with_a_pretrained_model_refuses_the_byte_tokenizer_before_building(tmp_path):
    # no weights in the folder: were the model built first, from_pretrained would fail on them instead
    model = tiny_qwen2(tmp_path / "qwen", weights=False)
    message = (rf"^the data's tokenizer 'byt5' \(data.init_args.tokenizer\) is not the tokenizer of the model "
               rf"{re.escape(str(model))} \(model.policy.init_args.name_or_path\): their vocabularies differ \(384 "
               rf"tokens against the model's 50257\), .*: --data.init_args.tokenizer {re.escape(str(model))}$")
    with pytest.raises(ValueError, match=message):
        build_cli(quickstart(tmp_path, *PRETRAINED, f"--model.policy.init_args.name_or_path={model}"), run=False)


def test_a_lora_base_with_its_own_tokenizer_is_checked_too(tmp_path):
    pytest.importorskip("peft")
    model = tiny_qwen2(tmp_path / "qwen", weights=False)
    with pytest.raises(ValueError, match=r"model.policy.init_args.base.init_args.name_or_path\): their vocabularies"):
        build_cli(["--config", str(REPO / "configs/lora.yaml"), f"--trainer.default_root_dir={tmp_path / 'run'}",
                   "--model.policy.init_args.base", "lit_prunedpo.models.Pretrained",
                   f"--model.policy.init_args.base.init_args.name_or_path={model}"], run=False)


def test_the_same_tokenizer_given_by_another_path_trains(tmp_path):
    model = tiny_qwen2(tmp_path / "qwen")
    cli = build_cli(quickstart(tmp_path, *PRETRAINED, f"--model.policy.init_args.name_or_path={model}",
                               f"--data.init_args.tokenizer={GPT2_TOKENIZER}"), run=False)
    assert cli.model.policy.get_input_embeddings().num_embeddings == len(cli.datamodule.tokenizer) == 50257


def test_a_model_without_a_tokenizer_of_its_own_is_not_checked(tmp_path):
    model = tiny_qwen2(tmp_path / "qwen", vocab_size=512, tokenizer=False)
    cli = build_cli(quickstart(tmp_path, *PRETRAINED, f"--model.policy.init_args.name_or_path={model}"), run=False)
    assert cli.model.policy.get_input_embeddings().num_embeddings == 512
    assert model_tokenizer({"name_or_path": str(model)}, "model.policy") is None


def test_same_sized_vocabularies_with_other_ids_differ(tmp_path):
    gpt2 = AutoTokenizer.from_pretrained(GPT2_TOKENIZER)
    assert vocabulary_difference(gpt2, AutoTokenizer.from_pretrained(GPT2_TOKENIZER)) is None
    gpt2.save_pretrained(tmp_path / "swapped")  # the same tokens, two of them renumbered
    spec = json.loads((tmp_path / "swapped/tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]
    (tmp_path / "swapped/tokenizer.json").write_text(json.dumps(spec))
    swapped = AutoTokenizer.from_pretrained(tmp_path / "swapped")
    assert vocabulary_difference(gpt2, swapped) == ("both have 50257 tokens, but 2 of the model's have another id or "
                                                    "are missing")


POLICY_FROM_HUB = {"class_path": "lit_prunedpo.models.Pretrained", "init_args": {"name_or_path": "someone/not-cached"}}
DATA = {"class_path": "lit_prunedpo.data.PreferenceDataModule", "init_args": {"tokenizer": "byt5"}}


def test_a_hub_name_the_cache_lacks_is_passed_over_at_once_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    start = time.monotonic()
    assert check_model_tokenizer(POLICY_FROM_HUB, DATA) is None
    assert time.monotonic() - start < 10


def test_a_hub_name_the_cache_lacks_is_passed_over_at_once_when_the_hub_does_not_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    start = time.monotonic()
    assert check_model_tokenizer(POLICY_FROM_HUB, DATA) is None  # Pretrained.build names the unreachable hub
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_a_gguf_models_tokenizer_is_compared_and_named_as_the_flag_to_set(tmp_path):
    gguf = REPO.parent / "shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    policy = {"class_path": "lit_prunedpo.models.Pretrained", "init_args": {"name_or_path": str(gguf)}}
    with pytest.raises(ValueError, match=rf"vocabularies differ \(384 tokens against the model's 49152\), .*: "
                                         rf"--data.init_args.tokenizer {re.escape(str(gguf))}$"):
        check_model_tokenizer(policy, DATA)
    # the file's folder with gguf_file: the hub form, here local
    policy["init_args"] = {"name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    with pytest.raises(ValueError, match=rf"model {re.escape(str(gguf.parent))} \(gguf_file {gguf.name}\)"):
        check_model_tokenizer(policy, DATA)
