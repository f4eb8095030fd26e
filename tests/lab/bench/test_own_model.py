"""The benchmarks on your own model and data: ``--model`` (a tiny random Llama saved with ``save_pretrained``, the
GPT-2 tokenizer saved beside it), ``--data`` (a tiny jsonl) through the data module training runs, the identity the
records carry, and the refusals of bad arguments."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json

import pytest
import torch
from helpers import REPO

from lit_prunedpo_lab.bench.cli import main
from lit_prunedpo_lab.bench.own_data import DataSpec, parse_data_options
from lit_prunedpo_lab.bench.own_model import pretrained_source, weights_sha256
from lit_prunedpo_lab.bench.presets import OWN_MODEL
from lit_prunedpo_lab.bench.rounds import build_rounds
from lit_prunedpo_lab.bench.scaling_cli import main as scaling_main
from lit_prunedpo.data import PreferenceDataModule

GPT2 = REPO.parent / "shared" / "tokenizers" / "gpt2"
pytestmark = pytest.mark.skipif(not GPT2.is_dir(), reason="needs ../shared/tokenizers/gpt2")


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """``(model folder, pairs.jsonl)``: a random Llama with GPT-2's vocabulary and its tokenizer, 24 pairs."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("own")
    tokenizer = AutoTokenizer.from_pretrained(str(GPT2))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(root / "tiny-llama")
    tokenizer.save_pretrained(root / "tiny-llama")
    rows = [{"prompt": f"Question {i}: what is {i} plus {i}?", "chosen": f" It is {2 * i}.",
             "rejected": f" Perhaps {i + 7}, or {'nothing at all' if i % 2 else 'more'}."} for i in range(24)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "tiny-llama", root / "pairs.jsonl"


def _spec(own, **kwargs) -> DataSpec:
    folder, pairs = own
    return DataSpec(str(pairs), tokenizer=str(folder), batch_size=4, max_length=48, max_prompt_length=24, **kwargs)


def test_the_rounds_run_the_data_modules_batches_on_the_models_weights(own):
    folder, pairs = own
    source = pretrained_source(str(folder))
    rounds = build_rounds(OWN_MODEL, ["vanilla"], ["online"], ["plain"], ["shared"], num_batches=3, warmup=0,
                          dev=torch.device("cpu"), source=source, data=_spec(own).data_module())
    # what training builds from the same arguments, independently
    data = PreferenceDataModule(str(pairs), tokenizer=str(folder), batch_size=4, max_length=48, max_prompt_length=24)
    data.setup("fit")
    expected = list(itertools.islice(iter(data.train_dataloader()), 3))
    assert len(rounds.batches) == 3
    for got, want in zip(rounds.batches, expected, strict=True):
        for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "index"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    first = int(rounds.batches[0].index[0])  # the text's GPT-2 tokens, as the data module lays them out
    row = json.loads(pairs.read_text().splitlines()[first])
    prompt = rounds.batches[0].prompt_ids[0][rounds.batches[0].prompt_mask[0]].tolist()
    assert prompt == [data.tokenizer.bos_token_id, *data.tokenizer(row["prompt"], add_special_tokens=False).input_ids]
    loaded = source.build()
    assert weights_sha256(loaded) == weights_sha256(rounds.module.policy)  # the saved weights, unchanged
    assert next(rounds.module.policy.parameters()).dtype == torch.float32


def test_data_options_pass_through_to_the_data_module(own):
    options = parse_data_options(["max_rows=12", "val-fraction=0", "add_bos=false"])
    assert options == {"max_rows": 12, "val_fraction": 0, "add_bos": False}
    data = _spec(own, options=options).data_module()
    assert (data.max_rows, data.val_fraction, data.add_bos) == (12, 0, False)


@pytest.mark.parametrize("argv, message", [
    (["--model", "{folder}", "--preset", "small"], "--model and --preset exclude each other"),
    (["--data", "{pairs}"], "--data needs --model"),
    (["--max-length", "64"], "--max-length describe --data's pairs"),
    (["--model", "./no-such-model"], "--model ./no-such-model: no such file or folder"),
    (["--model", "{folder}", "--data", "no-such.jsonl"], "--data no-such.jsonl: no such file or folder"),
    (["--model", "{folder}", "--data", "{pairs}", "--data-option", "bogus=1"],
     "not an argument of PreferenceDataModule"),
    (["--model", "{folder}", "--data", "{pairs}", "--data-option", "batch_size=2"], "set it with --batch-size"),
    (["--model", "{folder}", "--data", "{pairs}", "--data-option", "max_rows"], "write key=value"),
    (["--model", "{folder}", "--data", "{pairs}", "--max-length", "24"], "--max-prompt-length (256) must be <"),
    (["--model", "{folder}", "--batch-size", "0"], "--batch-size must be >= 1"),
])
def test_bad_arguments_are_one_clear_error(own, argv, message, capsys):
    folder, pairs = own
    with pytest.raises(SystemExit):
        main([a.format(folder=folder, pairs=pairs) for a in argv])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    # 24 pairs, 23 after the validation hold-out: 6 batches of 4
    (["--steps", "40", "--max-length", "48"], "training pairs make 6 batch(es) of 4, the benchmark runs 40"),
    (["--max-length", "512"], "--max-length 512 is beyond the model's 128 positions"),
    (["--tokenizer", "byt5", "--max-length", "64"], None),  # byte tokens fit the model's embedding: it runs
])
@pytest.mark.slow  # loads and tokenizes (the last one runs)
def test_data_that_does_not_fit_is_refused_in_one_line(own, argv, message, capsys):
    folder, pairs = own
    common = ["--model", str(folder), "--data", str(pairs), "--modes", "vanilla", "--references", "online",
              "--scorers", "plain", "--steps", "1", "--warmup", "0", "--max-prompt-length", "24", "--quiet"]
    status = main([*common, *argv])
    err = capsys.readouterr().err
    if message is None:
        assert status == 0
    else:
        assert status == 2 and "lit-prunedpo-bench: error:" in err and message in err


@pytest.mark.slow  # a benchmark run (seconds)
def test_cli_on_own_model_and_data_records_what_it_measured(own, tmp_path):
    folder, pairs = own
    argv = ["--model", str(folder), "--data", str(pairs), "--max-length", "48", "--max-prompt-length", "24",
            "--modes", "vanilla,all", "--references", "online,cached", "--scorers", "plain", "--steps", "2",
            "--warmup", "1", "--data-option", "max_rows=20", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    model, data = payload["model"], payload["data"]
    assert model["kind"] == "folder" and model["name_or_path"] == str(folder) and model["dtype"] == "float32"
    assert model["weights_sha256"] == weights_sha256(pretrained_source(str(folder)).build())
    assert model["vocab_size"] == 50257 and payload["layout"] == "SharedPromptLayout"
    assert data["sha256"] == hashlib.sha256(pairs.read_bytes()).hexdigest()
    assert data["tokenizer"] == str(folder) and data["tokenizer_hash"]  # the model's own tokenizer by default
    assert (data["max_length"], data["max_prompt_length"], data["batch_size"]) == (48, 24, 4)
    assert data["options"] == {"max_rows": 20} and data["format"] == "explicit" and data["train_pairs"] == 19
    assert all(row["tokens_executed"] > 0 for row in payload["results"])
    report = (tmp_path / "bench.md").read_text()
    assert "# lit-prunedpo benchmark: model `tiny-llama` on `pairs.jsonl`" in report
    assert data["sha256"] in report and model["weights_sha256"] in report


@pytest.mark.slow  # a benchmark run with TRL's trainer
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the [peer] extra (trl)")
def test_trl_peer_runs_the_same_weights_and_tokens(own, tmp_path):
    folder, pairs = own
    spec = _spec(own)
    rounds = build_rounds(OWN_MODEL, ["vanilla"], ["cached"], ["plain"], ["shared"], num_batches=2, warmup=0,
                          dev=torch.device("cpu"), peer="trl", source=pretrained_source(str(folder)),
                          data=spec.data_module())
    assert weights_sha256(rounds.peer.model) == weights_sha256(rounds.module.policy)
    batch, inputs = rounds.batches[0], rounds.peer.inputs(0)
    for i in range(batch.num_pairs):  # TRL's rows: prompt + chosen, then prompt + rejected, the same token ids
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]].tolist()
        for b in (0, 1):
            response = batch.response_ids[i, b][batch.response_mask[i, b]].tolist()
            row = inputs["input_ids"][b * batch.num_pairs + i][inputs["attention_mask"][b * batch.num_pairs + i] > 0]
            assert row.tolist() == prompt + response
    assert main(["--model", str(folder), "--data", str(pairs), "--max-length", "48", "--max-prompt-length", "24",
                 "--modes", "vanilla", "--references", "cached", "--scorers", "plain", "--steps", "1", "--warmup",
                 "0", "--dtype", "bfloat16", "--peer", "trl", "--out", str(tmp_path), "--quiet"]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert payload["peer"]["step_time_s"] > 0 and payload["dtype"] == payload["model"]["dtype"] == "bfloat16"


def test_scaling_refuses_the_random_llamas_options_with_a_model(own, capsys):
    folder, _ = own
    with pytest.raises(SystemExit):
        scaling_main(["--model", str(folder), "--sizes", "xs", "--lengths", "8"])
    assert "--sizes describe the random Llamas" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        scaling_main(["--model", "./no-such-model", "--lengths", "8"])
    assert "no such file or folder" in capsys.readouterr().err


@pytest.mark.slow  # a length sweep (seconds)
def test_scaling_sweeps_lengths_on_the_model_and_predicts_its_shape(own, tmp_path, capsys):
    folder, _ = own
    assert scaling_main(["--model", str(folder), "--lengths", "8,16", "--prompt", "8", "--length-batch", "2",
                         "--modes", "vanilla,all", "--steps", "1", "--warmup", "0", "--real-shapes", "Qwen2.5-0.5B",
                         "--real-batch", "2", "--quiet", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "scaling.json").read_text())
    assert {(r["sweep"], r["size"], r["response"]) for r in payload["rows"]} == {
        ("length", "tiny-llama", 8), ("length", "tiny-llama", 16)}
    assert all(r["hidden"] == 16 and r["vocab"] == 50257 for r in payload["rows"])
    assert payload["model"]["weights_sha256"] and payload["settings"]["vocab"] is None
    assert {r["shape"] for r in payload["real_shapes"]["rows"]} == {"Qwen2.5-0.5B", "tiny-llama"}
    assert "tiny-llama (--model" in (tmp_path / "scaling.md").read_text()
    capsys.readouterr()
    assert scaling_main(["--model", str(folder), "--lengths", "8", "--dry-run"]) == 0
    assert "tiny-llama" in capsys.readouterr().out
