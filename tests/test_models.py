"""Model sources: specs that rebuild a source (for exports), and FromConfig taking the data's vocabulary size
when the config leaves it out (through the real CLI)."""

from __future__ import annotations

import torch

from lit_prunedpo.cli import build_cli
from lit_prunedpo.models import FromConfig, Pretrained, source_from_spec

from helpers import REPO, TINY_LLAMA

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
    cli = build_cli(["--config", str(REPO / "configs/lora.yaml"), f"--model.policy.init_args.base.init_args.config={NO_VOCAB}",
                     "--data=lit_prunedpo.data.SyntheticPreferenceData", "--data.vocab_size=48",
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.model.policy.get_input_embeddings().num_embeddings == 48


def test_a_given_vocab_size_is_kept(tmp_path):
    config = dict(TINY_LLAMA, vocab_size=512)
    import json

    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--model.policy.init_args.config={json.dumps(config)}",
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.model.policy.get_input_embeddings().num_embeddings == 512


def test_whole_file_training_without_validation(tmp_path):
    cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
                     "--data.init_args.val_fraction=0", "--data.init_args.max_rows=32", "--trainer.max_steps=3",
                     "--trainer.val_check_interval=2", "--trainer.enable_progress_bar=false"])
    assert cli.trainer.global_step == 3 and len(cli.datamodule.train_dataset) == 32
    assert not any(k.startswith("val/") for k in cli.trainer.callback_metrics)
    assert (tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt").exists()
