"""GGUF files as a user has them (lit_prunedpo.gguf_files): ``Pretrained`` loads a real 4-bit GGUF
(SmolLM2-135M-Instruct) as a plain dense model that saves, trains and exports; the data module takes the same file as
its tokenizer, with a cache fingerprint that is the same in every process; a missing file, a file that is no GGUF,
one cut short and a missing ``gguf`` package are each one line naming the file and what to do. The tests that read
the 98 MB file are slow (about 20 s a load)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_prunedpo.cli import build_cli
from lit_prunedpo.data.tokenize import load_tokenizer, tokenizer_fingerprint
from lit_prunedpo.export import export
from lit_prunedpo.models import Pretrained, source_from_spec

from helpers import REPO

GGUF = REPO.parent / "shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_spec_round_trips_with_its_gguf_file():
    for source in (Pretrained(str(GGUF), dtype="bfloat16"), Pretrained("org/model-GGUF", gguf_file="m.Q4_0.gguf")):
        rebuilt = source_from_spec(source.spec())
        assert isinstance(rebuilt, Pretrained) and rebuilt.init_args == source.init_args
    assert Pretrained("org/model-GGUF", gguf_file="m.Q4_0.gguf").spec()["init_args"]["gguf_file"] == "m.Q4_0.gguf"
    with pytest.raises(ValueError, match=r"is a .gguf file and gguf_file 'other.gguf' names another"):
        Pretrained(str(GGUF), gguf_file="other.gguf")


def test_a_missing_gguf_file_is_named(tmp_path):
    for name in (str(tmp_path / "model.gguf"), "model.gguf"):
        with pytest.raises(FileNotFoundError, match=rf"^GGUF file {re.escape(name)} \(Pretrained name_or_path\) does "
                                                   r"not exist \(moved or deleted\?\)"):
            Pretrained(name).build()
    with pytest.raises(FileNotFoundError, match=r"\(Pretrained gguf_file\) does not exist"):
        Pretrained(str(tmp_path), gguf_file="model.gguf").build()
    with pytest.raises(FileNotFoundError, match=r"\(data.init_args.tokenizer\) does not exist"):
        load_tokenizer(str(tmp_path / "model.gguf"))


def test_a_file_that_is_no_gguf_is_named(tmp_path):
    page = tmp_path / "model.gguf"
    page.write_text("<!DOCTYPE html><html>Rate limited</html>")  # what a failed download leaves
    for call, argument in ((lambda: Pretrained(str(page)).build(), "Pretrained name_or_path"),
                           (lambda: load_tokenizer(str(page)), "data.init_args.tokenizer")):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(page))} \({argument}\) is not a GGUF file \(it does "
                                             r"not start with the bytes 'GGUF' but b'<!DO'\): re-download it"):
            call()


def test_a_gguf_file_cut_short_is_named(tmp_path):
    cut = tmp_path / "cut.gguf"
    with GGUF.open("rb") as whole:
        cut.write_bytes(whole.read(3000))  # the header's start: an interrupted download
    with pytest.raises(ValueError, match=rf"^could not load GGUF file {re.escape(str(cut))} \(Pretrained name_or_path\)"
                                         r": .*; if the file is truncated or corrupt, re-download it$"):
        Pretrained(str(cut)).build()


def test_a_missing_gguf_package_is_named_with_the_install_command(tmp_path, monkeypatch):
    file = tmp_path / "model.gguf"
    file.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` does where it is not installed
    with pytest.raises(ImportError, match=rf"^{re.escape(str(file))} is a GGUF file, which needs the gguf package to "
                                          r"load: pip install 'gguf>=0.10' \(or pip install 'lit-prunedpo\[gguf\]'\)$"):
        Pretrained(str(file)).build()
    with pytest.raises(ImportError, match=r"org/model-GGUF/m.gguf is a GGUF file, which needs the gguf package"):
        Pretrained("org/model-GGUF", gguf_file="m.gguf").build()


@pytest.mark.slow
def test_a_gguf_file_builds_a_plain_model_in_the_asked_dtype_that_saves(tmp_path):
    model = Pretrained(str(GGUF), dtype="bfloat16").build()
    assert type(model).__name__ == "LlamaForCausalLM" and {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert getattr(model.config, "quantization_config", None) is None and not getattr(model, "is_quantized", False)
    model.save_pretrained(tmp_path / "saved")  # refused ("quantized with gguf, not serializable") with the markers
    assert "quantization_config" not in json.loads((tmp_path / "saved/config.json").read_text())
    # the hub form (a folder and a file name) builds the same weights, here from the file's local folder
    again = source_from_spec({"class_path": "lit_prunedpo.models.Pretrained", "init_args": {
        "name_or_path": str(GGUF.parent), "gguf_file": GGUF.name, "dtype": "bfloat16"}}).build()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    for name, weight in model.state_dict().items():
        assert torch.equal(weight, again.state_dict()[name]) and torch.equal(weight, reloaded.state_dict()[name])


@pytest.mark.slow
def test_the_data_takes_the_gguf_tokenizer_with_a_fingerprint_every_process_agrees_on():
    tokenizer = load_tokenizer(str(GGUF))
    assert len(tokenizer) == 49152 and tokenizer.chat_template is not None
    assert tokenizer("Hello")["input_ids"] == AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)(
        "Hello")["input_ids"]
    code = ("import sys; from lit_prunedpo.data.tokenize import load_tokenizer, tokenizer_fingerprint; "
            "print(tokenizer_fingerprint(load_tokenizer(sys.argv[1])))")
    other = subprocess.run([sys.executable, "-c", code, str(GGUF)], capture_output=True, text=True, check=True,
                           timeout=300)
    assert other.stdout.strip().splitlines()[-1] == tokenizer_fingerprint(tokenizer)


@pytest.mark.slow
def test_a_policy_trained_from_a_gguf_file_exports_and_reloads(tmp_path):
    build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
               "--model.policy", "lit_prunedpo.models.Pretrained", f"--model.policy.init_args.name_or_path={GGUF}",
               f"--data.init_args.tokenizer={GGUF}", "--data.init_args.max_rows=4", "--data.init_args.val_fraction=0",
               "--data.init_args.batch_size=2", "--data.init_args.max_length=16",
               "--data.init_args.max_prompt_length=8", "--model.optimizer.class_path=torch.optim.SGD",
               "--trainer.max_steps=1", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"])
    ckpt = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    out = export(str(ckpt), str(tmp_path / "hf"))
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out)
    trained = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert torch.equal(model.state_dict()["model.norm.weight"], trained["policy.model.norm.weight"])
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == 49152 and tokenizer.chat_template is not None
