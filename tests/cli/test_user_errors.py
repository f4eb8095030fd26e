"""The error that ends ``lit-prunedpo``'s output is the clear one: a constructor's own message, not jsonargparse's
"Does not validate against any of the Union subtypes" wrapper that dumps the whole config (lit_prunedpo.cli.main)."""

from __future__ import annotations

import sys

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
    with pytest.raises(ValueError, match=r"^FromConfig: unknown config key 'hiden_size' \(closest valid names: "
                                         r"hidden_size") as caught:
        main(["fit", f"--trainer.default_root_dir={tmp_path}", *FAST, "--model.policy.init_args.config.hiden_size=128"])
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert not list(tmp_path.rglob("config*.yaml"))  # refused before the run config is written


@pytest.mark.slow  # two CLI runs in subprocesses
def test_the_command_prints_its_own_checks_as_one_line_and_keeps_other_tracebacks(tmp_path):
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "lit_prunedpo", "fit", f"--trainer.default_root_dir={tmp_path}",
               "--ckpt_path=last"]
    env = {**os.environ, "LIT_PRUNEDPO_TRACEBACK": "0"}
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1].startswith("error: resume (ckpt_path=last): no checkpoint of a previous "
                                                          "run")
    run = subprocess.run(command, cwd=tmp_path, env={**env, "LIT_PRUNEDPO_TRACEBACK": "1"}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 1 and "Traceback" in run.stderr and "FileNotFoundError: resume" in run.stderr


def test_only_errors_raised_by_the_package_are_shortened():
    import torch

    from lit_prunedpo.optim import WarmupCosineLR
    from lit_prunedpo.cli.user_errors import raised_here

    def caught(fn):
        try:
            fn()
        except Exception as err:  # noqa: BLE001
            return err
        raise AssertionError("no error")

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    assert raised_here(caught(lambda: WarmupCosineLR(opt, warmup_steps=-1)))  # the package's own check
    assert not raised_here(caught(lambda: torch.zeros(2) @ torch.zeros(3)))  # torch's: keeps its traceback
    assert not raised_here(caught(lambda: {}["x"]))  # raised outside the package (here, a test)
    assert not raised_here(KeyboardInterrupt())


def test_ctrl_c_outside_a_fit_ends_with_one_line_and_status_130(capsys, monkeypatch):
    from lit_prunedpo.cli.user_errors import run_command

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.delenv("LIT_PRUNEDPO_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as stopped:
        run_command(interrupted)
    assert stopped.value.code == 130 and capsys.readouterr().err == "interrupted (Ctrl-C)\n"

    def bug():
        raise ValueError("raised outside the package")

    with pytest.raises(ValueError, match="outside the package"):  # not the package's own check: its traceback stays
        run_command(bug)


def test_an_interrupted_fit_closes_with_what_the_fit_said_it_kept(monkeypatch):
    # the closing line said "the checkpoints already written are kept" under the fit's "no checkpoint was written"
    from lit_prunedpo.callbacks import final_checkpoint
    from lit_prunedpo.cli import kept_when_interrupted

    monkeypatch.setattr(sys, "argv", ["lit-prunedpo", "fit", "--config", "quickstart"])
    monkeypatch.setattr(final_checkpoint, "KEPT_AFTER_INTERRUPT", "interrupted by Ctrl-C at step 16, without saving "
                        "it; no checkpoint was written before: the 16 steps trained are lost")
    assert kept_when_interrupted() == "no checkpoint was written before: the 16 steps trained are lost"
    monkeypatch.setattr(final_checkpoint, "KEPT_AFTER_INTERRUPT", "interrupted by Ctrl-C before training started: "
                        "nothing was trained, nothing saved")
    assert kept_when_interrupted() == "nothing was trained, nothing saved"
    monkeypatch.setattr(final_checkpoint, "KEPT_AFTER_INTERRUPT", None)
    assert kept_when_interrupted().startswith("the checkpoints already written are kept")
