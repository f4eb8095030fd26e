"""The study's tasks: a task that reads files takes their paths as arguments, its defaults are found beside the
repository wherever the command runs, and a missing file is refused naming the path."""

from __future__ import annotations

import dataclasses

import pytest

from lit_prunedpo_lab.study import tasks
from lit_prunedpo_lab.study.cli import main
from lit_prunedpo_lab.study.tasks import HHRLHFTask

from helpers import REPO


def test_default_paths_are_beside_the_repository_not_the_working_directory(tmp_path, monkeypatch):
    assert tasks.HH_RLHF_DATA == REPO.parent / "shared/data/hh-rlhf/harmless-base-test.jsonl.gz"
    assert tasks.GPT2_TOKENIZER == REPO.parent / "shared/tokenizers/gpt2"
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "none.jsonl.gz"
    monkeypatch.setattr(tasks, "HH_RLHF_DATA", missing)
    with pytest.raises(FileNotFoundError, match=f"data file '{missing}' not found.*--data-path"):
        HHRLHFTask().datamodule(tmp_path)


def test_a_missing_data_file_or_tokenizer_is_named(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=f"hh-rlhf task: data file '{tmp_path / 'x.jsonl'}' not found"):
        HHRLHFTask(path=str(tmp_path / "x.jsonl")).datamodule(tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    monkeypatch.setattr(tasks, "GPT2_TOKENIZER", tmp_path / "gpt2")
    with pytest.raises(FileNotFoundError,
                       match=f"hh-rlhf task: tokenizer '{tmp_path / 'gpt2'}' not found.*--tokenizer"):
        HHRLHFTask(path=str(pairs)).datamodule(tmp_path)


def test_study_command_takes_the_data_path(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl.gz"
    with pytest.raises(SystemExit):
        main(["--task", "hh-rlhf", "--data-path", str(missing), "--quiet"])
    assert f"hh-rlhf task: data file '{missing}' not found" in capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(SystemExit):
        main(["--task", "quickstart", "--data-path", str(missing), "--quiet"])
    assert ("--data-path: task quickstart has no such setting (it generates its pairs)"
            in capsys.readouterr().err.strip().splitlines()[-1])


@pytest.mark.parametrize("argv, message", [
    (["--task", "hh-rlhf", "--model", "m.gguf"], "--model: task hh-rlhf has no such setting (it reads a data file with "
                                                 "a tokenizer and a model built from a config)"),
    (["--task", "smollm2-hh", "--tokenizer", "gpt2"], "--tokenizer: task smollm2-hh has no such setting (it reads a "
                                                      "data file with a pretrained model's tokenizer)"),
    (["--task", "smollm2-hh", "--max-length", "128", "--max-prompt-length", "128"],
     "--max-prompt-length 128 must be below --max-length 128 (task smollm2-hh)"),
    (["--task", "smollm2-hh", "--max-length", "100"], "--max-prompt-length 128 must be below --max-length 100"),
])
def test_study_settings_a_task_does_not_have_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        main([*argv, "--quiet"])
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_pretrained_task_takes_its_model_and_lengths_from_the_command_line():
    from lit_prunedpo_lab.study.arguments import build_parser
    from lit_prunedpo_lab.study.cli import task_of

    args = build_parser().parse_args(["--task", "smollm2-hh", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct",
                                      "--max-length", "1024", "--max-prompt-length", "512"])
    task = task_of(args, tasks.TASKS["smollm2-hh"])
    assert (task.model, task.max_length, task.max_prompt_length) == ("HuggingFaceTB/SmolLM2-135M-Instruct", 1024, 512)
    assert task_of(build_parser().parse_args(["--task", "smollm2-hh"]), tasks.TASKS["smollm2-hh"]) == tasks.TASKS[
        "smollm2-hh"]


def test_the_pretrained_task_reads_hh_as_chat_messages_with_the_models_own_tokenizer(tmp_path):
    from lit_prunedpo.models import Pretrained
    from lit_prunedpo_lab.study.tasks import PretrainedHHTask, with_family

    task = tasks.TASKS["smollm2-hh"]
    assert isinstance(task, PretrainedHHTask) and task.model == str(tasks.SMOLLM2_GGUF)
    dm = dataclasses.replace(task, max_rows=20).datamodule(tmp_path)
    assert dm.dialogues == "messages" and len(dm.train_dataset) + len(dm.val_dataset) <= 20
    assert len(dm.val_dataset) >= 3  # a fifth held out
    prompt = dm.tokenizer.decode(dm.train_dataset[0]["prompt_ids"])
    assert "<|im_start|>user" in prompt and "Human:" not in prompt  # SmolLM2's ChatML, not HH's raw turns
    source = task.policy(seed=0)
    assert isinstance(source, Pretrained) and source.name_or_path == task.model
    with pytest.raises(ValueError, match="trains a pretrained model.*not 'qwen2'"):
        with_family(task, "qwen2")
    with pytest.raises(FileNotFoundError, match="smollm2-hh task: data file .*x.jsonl' not found"):
        PretrainedHHTask(path=str(tmp_path / "x.jsonl")).datamodule(tmp_path)
