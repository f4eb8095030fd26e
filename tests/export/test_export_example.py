"""The generation example of ``docs/export.md`` ("Generate from the export"), run as written on exported models: it
writes text. The default suite runs it on a quickstart of 20 steps; ``-m slow`` on the whole 240-step quickstart (the
model a user has after the README) and on SmolLM2-135M-Instruct exported after one step, with ``chat`` either way."""

from __future__ import annotations

import ast
import re

import pytest

from helpers import REPO
from lit_prunedpo.cli import build_cli
from lit_prunedpo.export import export

GGUF = REPO.parent / "shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def example() -> str:
    """The first ``python`` block under the page's "Generate from the export" heading."""
    page = (REPO / "docs/export.md").read_text()
    section = page.split("## Generate from the export\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_example(folder, monkeypatch, capsys, code: str | None = None) -> str:
    """The generated text the example prints, run from ``folder`` (which holds ``model/``)."""
    monkeypatch.chdir(folder)
    exec(compile(code or example(), "docs/export.md", "exec"), {"__name__": "__main__"})  # noqa: S102
    return ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])


def fit_and_export(root, *extra: str):
    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={root}", *QUIET,
                     *extra], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    export(str(root / "lightning_logs/version_0/checkpoints/last.ckpt"), str(root / "model"))


def test_the_example_sets_the_folder_and_the_prompt_it_documents():
    code = example()
    assert 'out = Path("model")' in code and "chat = False" in code and "add_special_tokens=False" in code


def test_the_example_writes_text_from_a_short_quickstart(tmp_path, monkeypatch, capsys):
    fit_and_export(tmp_path, "--trainer.max_steps=20", "--trainer.val_check_interval=20",
                   "--trainer.limit_val_batches=1", "--data.init_args.max_rows=64",
                   "--data.init_args.val_fraction=0.25",
                   "--data.init_args.batch_size=8", "--model.scheduler.init_args.warmup_steps=4",
                   "--trainer.log_every_n_steps=5")
    text = run_example(tmp_path, monkeypatch, capsys)
    assert re.match(r"[a-z]{3}", text), text  # letters, as the task's responses


@pytest.mark.slow
def test_the_example_writes_text_from_the_quickstart(tmp_path, monkeypatch, capsys):
    fit_and_export(tmp_path)  # the quickstart as the README runs it: 240 steps
    text = run_example(tmp_path, monkeypatch, capsys)
    assert text.strip(), text
    # the plain call's ids (EOS appended by ByT5) are what made it write nothing
    plain = example().replace("tok(prompt, add_special_tokens=False)", "tok(prompt)")
    assert run_example(tmp_path, monkeypatch, capsys, plain) == ""


@pytest.mark.slow
def test_the_example_writes_text_from_smollm2_either_way(tmp_path, monkeypatch, capsys):
    if not GGUF.exists():
        pytest.fail(f"{GGUF} is missing: the tests expect the shared/ folder beside the checkout")
    fit_and_export(tmp_path, "--model.policy", "lit_prunedpo.models.Pretrained",
                   f"--model.policy.init_args.name_or_path={GGUF}", f"--data.init_args.tokenizer={GGUF}",
                   "--data.init_args.max_rows=4", "--data.init_args.val_fraction=0", "--data.init_args.batch_size=2",
                   "--data.init_args.max_length=16", "--data.init_args.max_prompt_length=8",
                   "--model.optimizer.class_path=torch.optim.SGD", "--trainer.max_steps=1")
    for chat in (False, True):
        code = example().replace("chat = False", f"chat = {chat}")
        text = run_example(tmp_path, monkeypatch, capsys, code)
        assert text.strip(), (chat, text)
