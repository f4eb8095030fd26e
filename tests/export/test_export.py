"""``lit-prunedpo export``: a checkpoint becomes a Hugging Face folder that ``from_pretrained`` loads and that
gives the trained module's logits; LoRA runs export merged weights or peft's adapter folder; the exported
tokenizer's plain call gives the prompt ids training gave (or the export says how to build them); a full disk is
named and leaves nothing half-written under ``--out``. The FSDP2 round trip runs with the multi-process tests
(tests/distributed)."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys

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

    export(str(tmp_path / "run/lightning_logs/version_0/checkpoints/last.ckpt"), str(tmp_path / "adapter"),
           adapter="adapter")
    assert ((tmp_path / "adapter/adapter_model.safetensors").exists()
            and not (tmp_path / "adapter/model.safetensors").exists())
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


def _handmade_checkpoint(path, vocab: int, tokenizer: str, data: dict | None = None) -> None:
    """A checkpoint as ``PrunedDPO`` writes it (policy weights and metadata, the data module's tokenizer, or all of
    ``data``, its hyperparameters), of a randomly initialised Llama: its config says BOS 1, EOS 2, no PAD
    (``LlamaConfig``'s defaults)."""
    from lit_prunedpo.export import policy_metadata
    from lit_prunedpo.models import FromConfig

    policy = FromConfig("llama", dict(vocab_size=vocab, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, tie_word_embeddings=True)).build()
    assert (policy.config.bos_token_id, policy.config.eos_token_id, policy.config.pad_token_id) == (1, 2, None)
    torch.save({"state_dict": {f"policy.{k}": v for k, v in policy.state_dict().items()},
                "policy": policy_metadata(policy),
                "datamodule_hyper_parameters": data or {"tokenizer": tokenizer}}, path)


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
             "tensor.ckpt": r"not a Lightning checkpoint \(it holds a Tensor",
             "nodict.ckpt": r"not a Lightning checkpoint \(no 'state_dict' in it\)",
             "shards": "not a readable Lightning checkpoint", "plain": "not a sharded Lightning checkpoint"}
    (tmp_path / "plain").mkdir()
    for name, message in cases.items():
        with pytest.raises(ValueError,
                           match=rf"^cannot load checkpoint {re.escape(str(tmp_path / name))}: {message}") as caught:
            main(["export", f"--ckpt_path={tmp_path / name}", f"--out={tmp_path / 'hf'}"])
        assert "\n" not in str(caught.value), name  # one line: the output's last
    with pytest.raises(FileNotFoundError,
                       match=rf"^checkpoint not found: {re.escape(str(tmp_path / 'missing.ckpt'))}$"):
        main(["export", f"--ckpt_path={tmp_path / 'missing.ckpt'}", f"--out={tmp_path / 'hf'}"])


# ------------------------------------------------------------------------------- the tokenizer's plain call
def _pairs_file(path) -> list[str]:
    prompts = [f"Question {i}: what is {i} + {i}?" for i in range(4)] + ["\n\nHuman: hi there\n\nAssistant:"]
    rows = [{"prompt": p, "chosen": f" yes {i}", "rejected": f" no {i}"} for i, p in enumerate(prompts)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return prompts


def _training_prompt_ids(path, tokenizer: str, add_bos: bool):
    """The prompt ids the data module makes in training, by prompt, and its hyperparameters as a checkpoint
    saves them."""
    from lit_prunedpo.data import PreferenceDataModule

    dm = PreferenceDataModule(str(path), tokenizer=tokenizer, val_fraction=0.0, add_bos=add_bos)
    dm.setup("fit")
    return {int(i): ids for i, ids in zip(dm.train_dataset["index"], dm.train_dataset["prompt_ids"])}, dict(dm.hparams)


@pytest.mark.parametrize("add_bos", [True, False], ids=["add_bos", "no_bos"])
def test_the_exported_gpt2_tokenizer_gives_the_prompt_ids_of_training(tmp_path, capsys, add_bos):
    # GPT-2's tokenizer adds no BOS by itself; training puts BOS (50256) first unless add_bos=False: the export
    # switches the saved tokenizer's add_bos_token to match, read from the checkpoint's data hyperparameters
    prompts = _pairs_file(tmp_path / "pairs.jsonl")
    training, hparams = _training_prompt_ids(tmp_path / "pairs.jsonl", str(GPT2_TOKENIZER), add_bos)
    assert (training[0][0] == 50256) == add_bos
    _handmade_checkpoint(tmp_path / "run.ckpt", 50257, str(GPT2_TOKENIZER), data=hparams)
    main(["export", f"--ckpt_path={tmp_path / 'run.ckpt'}", f"--out={tmp_path / 'hf'}"])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for index, prompt in enumerate(prompts):
        assert tokenizer(prompt).input_ids == training[index], prompt
    recorded = json.loads((tmp_path / "hf/lit_prunedpo_export.json").read_text())["prompt_ids"]
    assert recorded["plain_call"] and recorded["build"] == "tok(prompt).input_ids" and recorded["add_bos"] == add_bos
    said = capsys.readouterr().out
    switched = "tokenizer: add_bos_token: False -> True, so that tok(prompt) gives the prompt ids training did"
    assert (switched in said) == add_bos
    assert "does not give the prompt ids training did" not in said


def test_a_tokenizer_that_cannot_match_training_gets_the_recipe_recorded(trained, tmp_path, capsys):
    # ByT5's tokenizer always appends EOS, which training's prompts never hold: the export records how to build
    # prompt ids and says so; the quickstart's own checkpoint carries the data module's add_bos
    from transformers import ByT5Tokenizer

    from lit_prunedpo.data.tokenize import PairEncoder
    from lit_prunedpo.data.formats import Columns

    _, root = trained
    ckpt = root / "lightning_logs/version_0/checkpoints/last.ckpt"
    assert read_checkpoint(ckpt)[1]["datamodule_hyper_parameters"]["add_bos"] is True
    main(["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'hf'}"])
    recorded = json.loads((tmp_path / "hf/lit_prunedpo_export.json").read_text())["prompt_ids"]
    assert not recorded["plain_call"] and recorded["build"] == "tok(prompt, add_special_tokens=False).input_ids"
    said = capsys.readouterr().out
    assert re.search(r"the exported tokenizer's plain call tok\(prompt\) does not give the prompt ids training did "
                     r"\(for 'Hello, world': \[.*, 1\], training \[.*\]\): build prompt ids as "
                     r"tok\(prompt, add_special_tokens=False\)\.input_ids \(recorded in .*lit_prunedpo_export.json, "
                     r'"prompt_ids"\)', said), said
    # the recipe gives what the data module's encoder (the training code path) gives
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    encoder = PairEncoder(ByT5Tokenizer(), "explicit", Columns("prompt", "chosen", "rejected"), 64, 24)
    row = encoder({"prompt": ["abc de"], "chosen": ["x"], "rejected": ["y"]}, [0])
    recipe = tokenizer("abc de", add_special_tokens=False).input_ids
    assert recipe == row["prompt_ids"][0] != tokenizer("abc de").input_ids


# ----------------------------------------------------------------------------------------- a full disk
def _wrote_nothing_beside(out) -> None:
    assert not list(out.parent.glob(f"{out.name}.partial-*")), "a partial export was left behind"


def test_a_full_disk_names_the_file_and_leaves_the_earlier_export_whole(trained, tmp_path, monkeypatch):
    import transformers.modeling_utils as modeling_utils

    _, root = trained
    ckpt = root / "lightning_logs/version_0/checkpoints/last.ckpt"
    out = tmp_path / "hf"
    export(str(ckpt), str(out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def fills_the_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)  # part of the file, as a disk filling mid-write leaves it
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(modeling_utils, "safe_save_file", fills_the_disk)
    weights = re.escape(str(out / "model.safetensors"))
    said = (rf"^disk full \(ENOSPC: No space left on device\) while writing {weights}, "
            rf"exporting {re.escape(str(ckpt))}: {re.escape(str(out))} is as it was \(the partial export "
            r"hf\.partial-\d+ beside it was removed\): free space on that disk, or pass another --out$")
    with pytest.raises(OSError, match=said) as caught:
        main(["export", f"--ckpt_path={ckpt}", f"--out={out}", "--adapter=merged"])
    assert caught.value.errno == errno.ENOSPC and "\n" not in str(caught.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    _wrote_nothing_beside(out)


def test_an_export_onto_a_disk_too_small_names_the_weights_file(trained, tmpfs):
    _, root = trained
    ckpt = root / "lightning_logs/version_0/checkpoints/last.ckpt"
    disk = tmpfs("256k")  # config.json fits, the quickstart model's ~0.5 MB of weights do not
    out = disk / "hf"
    with pytest.raises(OSError, match=rf"^disk full \(ENOSPC: No space left on device\) while writing "
                                      rf"{re.escape(str(out / 'model.safetensors'))}, exporting "):
        export(str(ckpt), str(out))
    assert os.listdir(disk) == []  # neither the export nor a partial one


def test_what_a_killed_export_leaves_is_never_taken_for_an_export(trained, tmp_path, capsys):
    # killed (SIGKILL: no clean-up) while writing the weights: --out does not exist, the partial folder beside it
    # has no marker, and the next export writes --out whole and names the leftover
    _, root = trained
    ckpt = root / "lightning_logs/version_0/checkpoints/last.ckpt"
    out = tmp_path / "hf"
    killed = (
        "import os, signal, sys\n"
        "import transformers.modeling_utils as m\n"
        "def dies(tensors, filename, metadata=None):\n"
        "    open(filename, 'wb').write(b'\\0' * 100)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "m.safe_save_file = dies\n"
        "from lit_prunedpo.export import export\n"
        "export(sys.argv[1], sys.argv[2])\n"
    )
    done = subprocess.run([sys.executable, "-c", killed, str(ckpt), str(out)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert done.returncode == -9, done.stderr[-2000:]
    (leftover,) = tmp_path.glob("hf.partial-*")
    assert not out.exists() and not (leftover / "lit_prunedpo_export.json").exists()
    assert (leftover / "model.safetensors").stat().st_size == 100
    export(str(ckpt), str(out))
    assert json.loads((out / "lit_prunedpo_export.json").read_text())["global_step"] == 3
    AutoModelForCausalLM.from_pretrained(out)
    assert f"{leftover}: left by an interrupted export (never read as one): delete it" in capsys.readouterr().out


def test_an_export_into_an_earlier_one_removes_the_files_only_the_earlier_one_wrote(tmp_path):
    # merged then adapter into the same folder: the merged model.safetensors must not stay beside the adapter
    # (AutoModelForCausalLM would load it); a file of the user's in the folder stays
    _fit("lora", tmp_path / "run")
    ckpt = tmp_path / "run/lightning_logs/version_0/checkpoints/last.ckpt"
    out = tmp_path / "hf"
    export(str(ckpt), str(out))
    (out / "NOTES.md").write_text("mine\n")
    assert (out / "model.safetensors").exists()
    export(str(ckpt), str(out), adapter="adapter")
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" not in names and {"adapter_model.safetensors", "base", "NOTES.md"} <= names
    _wrote_nothing_beside(out)
