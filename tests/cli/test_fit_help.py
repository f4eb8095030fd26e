"""``lit-prunedpo fit --help``: the options a TRL user sets first, each one the real CLI accepts, with the quickstart's
values as the shipped YAML holds them; ``--help-all`` is LightningCLI's whole help."""

from __future__ import annotations

import json

import pytest
import yaml

from lit_prunedpo.cli import main
from lit_prunedpo.cli.fit_help import OPTIONS, brief_help
from lit_prunedpo.cli.packaged_configs import quickstart_config

#: a value for each option of the brief help, as a user would write it
VALUES = {
    "--model.policy": "lit_prunedpo.models.Pretrained", "--data.init_args.path": "pairs.jsonl",
    "--data.init_args.tokenizer": "gpt2", "--model.loss": "ipo", "--model.beta": "0.25",
    "--model.optimizer.init_args.lr": "5e-07", "--data.init_args.batch_size": "4",
    "--trainer.accumulate_grad_batches": "8", "--trainer.precision": "bf16-mixed", "--trainer.max_steps": "-1",
    "--trainer.max_epochs": "3", "--data.init_args.max_length": "512", "--data.init_args.max_prompt_length": "256",
    "--trainer.gradient_clip_val": "1.0", "--trainer.val_check_interval": "100", "--trainer.log_every_n_steps": "10",
    "--trainer.default_root_dir": "runs/mine", "--seed_everything": "7", "--ckpt_path": "last",
}


def test_the_brief_help_is_short_lists_every_option_and_reads_the_quickstarts_values(capsys):
    main(["fit", "--help"])
    text = capsys.readouterr().out
    assert text == brief_help() + "\n" and len(text.splitlines()) < 45
    assert all(len(line) <= 118 for line in text.splitlines())
    quickstart = yaml.safe_load(quickstart_config().read_text())
    assert f"(quickstart: {quickstart['model']['beta']})" in text
    assert f"(quickstart: {quickstart['data']['init_args']['batch_size']})" in text
    for option, trl, _ in OPTIONS:
        assert option in text and f"[{trl}]" in text


def test_every_option_of_the_brief_help_is_one_the_cli_takes(capsys):
    assert set(VALUES) == {option for option, _, _ in OPTIONS}
    argv = ["fit", *(word for option, value in VALUES.items() if option != "--ckpt_path" for word in (option, value)),
            "--model.policy.init_args.name_or_path", "gpt2", "--print_config=skip_null"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["model"]["policy"]["class_path"] == "lit_prunedpo.models.Pretrained"
    assert config["model"]["loss"] == "ipo" and config["model"]["beta"] == 0.25
    assert config["model"]["optimizer"]["init_args"]["lr"] == 5e-7
    assert config["data"]["init_args"]["batch_size"] == 4 and config["data"]["init_args"]["max_prompt_length"] == 256
    assert config["trainer"]["precision"] == "bf16-mixed" and config["trainer"]["max_epochs"] == 3
    assert config["trainer"]["accumulate_grad_batches"] == 8 and config["seed_everything"] == 7
    with pytest.raises(SystemExit):
        main(["fit", "--ckpt_path", "last", "--print_config"])
    assert json.dumps(yaml.safe_load(capsys.readouterr().out)["ckpt_path"]) == '"last"'


def test_help_all_is_lightningclis_whole_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", "--help-all"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) > 500 and "--trainer.max_steps" in text and "--model.beta" in text
