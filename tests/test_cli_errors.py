"""The error that ends ``lit-prunedpo``'s output is the clear one: a constructor's own message, not jsonargparse's
"Does not validate against any of the Union subtypes" wrapper that dumps the whole config (lit_prunedpo.cli.main)."""

from __future__ import annotations

import pytest

from lit_prunedpo.cli import main

FAST = ["--trainer.max_steps=1", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data.init_args.tokenizer=/no/such/tokenizer"],
         r"^tokenizer '/no/such/tokenizer' \(argument data.init_args.tokenizer\): the local path does not exist"),
        (["--model.beta=0"], r"^beta must be > 0, got 0"),
        (["--data.init_args.max_prompt_length=80"], r"^max_prompt_length \(80\) must be < max_length \(64\)"),
    ],
    ids=["tokenizer", "beta", "max_prompt_length"],
)
def test_constructor_errors_end_the_output(tmp_path, args, message):
    with pytest.raises(ValueError, match=message) as caught:
        main(["fit", f"--trainer.default_root_dir={tmp_path}", *FAST, *args])
    error = caught.value  # printed alone, so its message is the output's last line
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_data_errors_end_the_output(tmp_path):
    bad = tmp_path / "pairs.jsonl"
    bad.write_bytes(b'{"prompt": "p", "chosen": "c", "rejected": "r"}\n{"prompt": "p", "chosen": \n')
    with pytest.raises(ValueError, match=rf"^{bad}: row 1 \(0-based\): field '<row>' could not be read"):
        main(["fit", f"--trainer.default_root_dir={tmp_path}", *FAST, f"--data.init_args.path={bad}"])


def test_a_misspelt_model_config_key_ends_the_output(tmp_path):
    with pytest.raises(ValueError, match=r"^FromConfig: unknown config key 'hiden_size' \(closest valid names: hidden_size") as caught:
        main(["fit", f"--trainer.default_root_dir={tmp_path}", *FAST, "--model.policy.init_args.config.hiden_size=128"])
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert not list(tmp_path.rglob("config*.yaml"))  # refused before the run config is written
