"""The real CLI: every shipped YAML instantiates, every mode trains end to end, the quickstart learns,
``python -m lit_prunedpo`` works, and a resumed run draws what an uninterrupted one would have."""

from __future__ import annotations

import csv
import re
import subprocess
import sys

import pytest
import torch

from lit_prunedpo.cli import build_cli
from lit_prunedpo.models import FromConfig
from lit_prunedpo.module import PrunedDPO

from helpers import MODES, REPO, TINY_LLAMA, config_args, csv_logger

SHARED = REPO.parent / "shared"
HH_RLHF = SHARED / "data/hh-rlhf/harmless-base-test.jsonl.gz"
GPT2_TOKENIZER = SHARED / "tokenizers/gpt2"

YAMLS = sorted(p for d in ("configs", "examples") for p in (REPO / d).rglob("*.yaml"))
RUNNABLE = ["quickstart", *MODES]
FAST = [
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.log_every_n_steps=1",
    "--data.init_args.max_rows=128",
    "--data.init_args.val_fraction=0.25",
]


@pytest.fixture
def examples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))


def test_every_yaml_is_found():
    names = {p.relative_to(REPO).as_posix() for p in YAMLS}
    assert {f"configs/modes/{m}.yaml" for m in MODES} | {"configs/quickstart.yaml"} <= names
    assert {"examples/custom_sampler.yaml", "examples/custom_loss.yaml"} <= names


#: A ChatML template (SmolLM2's, without its system message) for the GPT-2 tokenizer standing in for SmolLM2's.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def offline_overrides(path, tmp_path):
    """Configs for real users name hub models and tokenizers; here they point at local copies instead: a tiny random
    model of the same architecture, the GPT-2 tokenizer (with a chat template where the config renders chats)."""
    if path.name not in ("hh_rlhf.yaml", "smollm2_hh.yaml"):
        return []
    data = [f"--data.init_args.path={HH_RLHF}", f"--data.init_args.tokenizer={GPT2_TOKENIZER}",
            "--data.init_args.val_split=null"]
    if path.name == "smollm2_hh.yaml":
        tiny, template = tmp_path / "tiny-llama", tmp_path / "chatml.jinja"
        FromConfig("llama", dict(TINY_LLAMA, vocab_size=50257)).build().save_pretrained(tiny)
        template.write_text(CHATML)
        return [f"--model.policy.init_args.name_or_path={tiny}", *data, f"--data.init_args.chat_template={template}"]
    tiny = tmp_path / "tiny-gpt2"
    FromConfig("gpt2", dict(vocab_size=50257, n_embd=32, n_layer=1, n_head=2,
                            n_positions=1024)).build().save_pretrained(tiny)
    return [f"--model.policy.init_args.name_or_path={tiny}", *data]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_yaml_instantiates_through_the_cli(path, tmp_path, examples_importable):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and "--config" in first, f"{path} must open with the command that runs it"
    # Overlays (configs/modes/, configs/losses/) are composed after the configs their command names: load them the same
    # way.
    configs = re.findall(r"--config (\S+)", first)
    assert configs[-1] == path.relative_to(REPO).as_posix(), f"{path}'s first line must be the command that runs it"
    composed = [arg for config in configs for arg in ("--config", str(REPO / config))]
    cli = build_cli([*composed, f"--trainer.default_root_dir={tmp_path}", *offline_overrides(path, tmp_path)],
                    run=False)
    assert isinstance(cli.model, PrunedDPO)


def metrics_of(root):
    rows = list(csv.DictReader(next(root.rglob("metrics.csv")).open()))
    merged = {}
    for row in rows:
        merged.update({k: float(v) for k, v in row.items() if v})
    return merged


@pytest.mark.parametrize("mode", RUNNABLE)
def test_fit_a_few_steps(mode, tmp_path):
    build_cli(["fit", *config_args(mode), f"--trainer.default_root_dir={tmp_path}", *csv_logger(tmp_path),
               "--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=1", *FAST])
    metrics = metrics_of(tmp_path)
    for key in ("train/loss", "train/rewards/accuracies", "train/work/tokens_executed_frac",
                "val/loss", "val/rewards/margins", "val/logps/rejected"):
        assert key in metrics, key
    assert list(tmp_path.rglob("*.ckpt")), "no checkpoint written"
    if mode in ("branch", "all"):
        assert metrics["train/pruning/branches_backpropagated_frac"] == 0.5
    if mode in ("vanilla", "quickstart"):
        # nothing pruned: the samplers' shares are exactly 1; the shared prompt (on by default) runs each prompt
        # once and no left padding, and the margin loss leaves the responses' common start unscored: less work
        for share in ("response_tokens_kept_frac", "positions_scored_frac", "branches_backpropagated_frac"):
            assert metrics[f"train/pruning/{share}"] == 1.0, share
        assert 0.5 < metrics["train/work/tokens_executed_frac"] < 1.0


def test_quickstart_learns(tmp_path):
    """A shortened quickstart (80 of its 240 steps) already separates chosen from rejected on held-out pairs."""
    build_cli(["fit", f"--trainer.default_root_dir={tmp_path}", *csv_logger(tmp_path), "--trainer.max_steps=80",
               "--trainer.val_check_interval=80", "--trainer.enable_progress_bar=false"])
    assert metrics_of(tmp_path)["val/rewards/accuracies"] >= 0.9


def test_python_dash_m_prints_config(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lit_prunedpo", "fit", "--print_config"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "lit_prunedpo.models.FromConfig" in out.stdout and "PreferenceDataModule" in out.stdout


def test_resume_draws_and_weights_match_uninterrupted_run(tmp_path):
    common = [*config_args("all"), "--trainer.val_check_interval=3",
              "--trainer.limit_val_batches=1", *FAST]
    full = build_cli(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'full'}", "--trainer.max_steps=6"])
    first = build_cli(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'half'}", "--trainer.max_steps=3"])
    ckpt = next((tmp_path / "half").rglob("*.ckpt"))
    resumed = build_cli(["fit", *common, f"--trainer.default_root_dir={tmp_path / 'resumed'}",
                         "--trainer.max_steps=6", f"--ckpt_path={ckpt}"])
    assert first.model.sampler_rng.step == 3 and resumed.model.sampler_rng.step == full.model.sampler_rng.step == 6
    for a, b in zip(full.model.policy.state_dict().values(), resumed.model.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # bitwise, single process


def test_corrupt_checkpoint_is_refused_naming_the_file(tmp_path):
    bad = tmp_path / "broken.ckpt"
    bad.write_bytes(b"this is not a checkpoint")
    with pytest.raises(RuntimeError, match=f"could not read checkpoint {bad}"):
        build_cli(["fit", f"--trainer.default_root_dir={tmp_path}", f"--ckpt_path={bad}", *FAST])


def test_quickstart_trains_on_a_users_jsonl(tmp_path):
    """`lit-prunedpo fit --config configs/quickstart.yaml --data.path pairs.jsonl` (the README's own-data contract)."""
    import json

    pairs = tmp_path / "pairs.jsonl"
    with pairs.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"prompt": f"Q{i}: say yes", "chosen": "yes" * (1 + i % 3), "rejected": "no"}) + "\n")
    cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--data.path={pairs}",
                     f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=2",
                     "--trainer.val_check_interval=2",
                     "--data.init_args.batch_size=4", *FAST])
    assert cli.trainer.global_step == 2
    stats = cli.datamodule.stats  # FAST holds out a quarter for validation
    assert (stats["train"]["pairs"], stats["val"]["pairs"]) == (30, 10)


@pytest.mark.parametrize("subcommand", ["validate", "test"])
def test_validate_and_test_subcommands(subcommand, tmp_path):
    cli = build_cli([subcommand, *config_args("all"), f"--trainer.default_root_dir={tmp_path}",
                     "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2", *FAST])
    prefix = "val" if subcommand == "validate" else "test"
    assert {f"{prefix}/loss", f"{prefix}/rewards/accuracies"} <= set(cli.trainer.callback_metrics)


@pytest.mark.parametrize("logger", ["CSVLogger", "TensorBoardLogger"])
def test_a_chosen_logger_without_save_dir_writes_under_the_default_root_dir(logger, tmp_path, caplog):
    if logger == "TensorBoardLogger":
        pytest.importorskip("tensorboard", reason="TensorBoardLogger needs tensorboard (CSVLogger: the same path)")
    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
                     f"--trainer.logger=lightning.pytorch.loggers.{logger}"], run=False)
    assert type(cli.trainer.logger).__name__ == logger and cli.trainer.logger.save_dir == str(tmp_path)
    assert f"{logger} save_dir not set, using trainer.default_root_dir: {tmp_path}" in caplog.text


def test_a_chosen_loggers_own_save_dir_is_kept(tmp_path):
    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
                     "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
                     f"--trainer.logger.save_dir={tmp_path / 'mine'}"], run=False)
    assert cli.trainer.logger.save_dir == str(tmp_path / "mine")


def test_lightning_clis_optimizer_keeps_the_packages_scheduler(tmp_path, caplog):
    # LightningCLI's --optimizer would replace PrunedDPO.configure_optimizers and drop model.scheduler unsaid
    cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
                     "--optimizer=torch.optim.SGD", "--optimizer.lr=0.05", "--trainer.max_steps=1", *FAST])
    (optimizer,), (scheduler,) = cli.trainer.optimizers, cli.trainer.lr_scheduler_configs
    assert type(optimizer).__name__ == "SGD" and optimizer.param_groups[0]["initial_lr"] == 0.05
    assert type(scheduler.scheduler).__name__ == "WarmupCosineLR" and scheduler.interval == "step"
    assert "--optimizer torch.optim.SGD: used as --model.optimizer, so model.scheduler" in caplog.text


def test_lightning_clis_lr_scheduler_becomes_the_models(tmp_path):
    cli = build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
                     "--lr_scheduler=torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size=7"], run=False)
    scheduler = cli.model.scheduler_factory(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR) and scheduler.step_size == 7
    with pytest.raises(ValueError, match="ReduceLROnPlateau: PrunedDPO steps its scheduler every optimizer step"):
        build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
                   "--lr_scheduler=lightning.pytorch.cli.ReduceLROnPlateau", "--lr_scheduler.monitor=val/loss"],
                  run=False)


def test_top_level_help_lists_export(capsys):
    from lit_prunedpo.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    listed = re.findall(r"^    (\w+) ", capsys.readouterr().out, re.M)
    assert {"fit", "validate", "test", "export", "configs"} <= set(listed)
    assert "predict" not in listed  # PrunedDPO has no predict step: the command is not offered


def test_predict_is_an_invalid_choice_naming_the_commands(capsys):
    from lit_prunedpo.cli import main

    with pytest.raises(SystemExit):
        main(["predict", "--config", "configs/quickstart.yaml"])
    err = capsys.readouterr().err
    assert "predict" in err and "fit" in err


def test_a_cpu_run_keeps_torchs_thread_count(tmp_path, caplog):
    """The CLI leaves torch's threads alone (one per core unless OMP_NUM_THREADS or torch.set_num_threads say
    otherwise): a single-process CPU run once took one thread, 1.56x slower on a body-heavy model."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        build_cli(["--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}"],
                  run=False)
        assert torch.get_num_threads() == 2
        assert "torch threads" not in caplog.text
    finally:
        torch.set_num_threads(before)


def test_shipped_configs_by_name_from_an_empty_folder(tmp_path, monkeypatch, caplog):
    """After `pip install .` the working folder has no configs/: the README's `--config configs/quickstart.yaml` and a
    bare name (`--config modes/branch`) take the packaged files, and say so."""
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    cli = build_cli(["--config", "configs/quickstart.yaml", "--config", "modes/branch",
                     f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert type(cli.model.branch_sampler).__name__ == "RandomBranch"  # the overlay composed after the quickstart
    assert "config: configs/quickstart.yaml not in the working folder: using the packaged quickstart" in caplog.text
    assert f"config: using the packaged modes/branch {REPO / 'configs/modes/branch.yaml'}" in caplog.text


@pytest.mark.parametrize("layout", ["RightPaddedLayout", "LeftPaddedLayout", "SharedPromptLayout"])
def test_the_layout_is_chosen_by_class_path_and_said_in_one_line(layout, tmp_path, caplog):
    caplog.set_level("INFO")
    cli = build_cli(["fit", *config_args("quickstart"), f"--trainer.default_root_dir={tmp_path}", *csv_logger(tmp_path),
                     f"--model.layout=lit_prunedpo.layout.{layout}", "--trainer.max_steps=2",
                     "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1", *FAST])
    assert type(cli.model.resolved_layout()).__name__ == layout
    assert f"layout: {layout} for LlamaForCausalLM" in caplog.text


def test_an_unknown_layout_class_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_cli(["fit", *config_args("quickstart"), f"--trainer.default_root_dir={tmp_path}",
                   "--model.layout=lit_prunedpo.layout.NoSuchLayout"], run=False)
    assert "NoSuchLayout" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the control-variate overlays
CONTROL_VARIATES = {"stratified-coupled-exact-targets": "configs/quickstart.yaml",
                    "stratified-coupled-reference-lse": "configs/cached.yaml"}


@pytest.mark.parametrize("overlay", CONTROL_VARIATES)
def test_control_variate_overlays_train_with_the_config_their_command_names(overlay, tmp_path):
    """Each overlay trains a few steps composed after the config its first line names (the cached one for the
    reference's log-sum-exps), scoring the whole head on the drawn positions only."""
    base = CONTROL_VARIATES[overlay]
    cache = [f"--model.reference.init_args.path={tmp_path / 'ref.safetensors'}"] if base.endswith("cached.yaml") else []
    cli = build_cli(["fit", "--config", str(REPO / base), "--config", str(REPO / f"configs/modes/{overlay}.yaml"),
                     f"--trainer.default_root_dir={tmp_path}", *cache, *csv_logger(tmp_path), "--trainer.max_steps=2",
                     "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1", *FAST])
    assert cli.trainer.global_step == 2
    metrics = metrics_of(tmp_path)
    assert metrics["train/work/positions_scored_frac"] < 0.5 and torch.isfinite(torch.tensor(metrics["train/loss"]))


def test_reference_lse_with_the_online_reference_is_refused_at_set_up(tmp_path):
    with pytest.raises(ValueError, match=r"ReferenceLogSumExp needs the reference's log-sum-exp .* OnlineReference "
                                         r"cannot give .*use the cached reference \(model\.reference: "
                                         r"lit_prunedpo\.reference\.CachedReference\), or the ExactTargetLogits"):
        build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--config",
                   str(REPO / "configs/modes/stratified-coupled-reference-lse.yaml"),
                   f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=1", *FAST])


@pytest.mark.parametrize("content, why", [
    ({"a": 1, "weights": [1.0]}, "it holds a dict with the keys a, weights, without the state_dict of a Lightning"),
    (torch.nn.Linear(2, 2), "it holds Python objects other than tensors and plain values, which a checkpoint does not"),
])
def test_ckpt_path_at_a_file_that_is_no_checkpoint_says_so(content, why, tmp_path):
    other = tmp_path / "model.pt"
    torch.save(content, other)
    with pytest.raises(RuntimeError) as raised:
        build_cli(["fit", f"--trainer.default_root_dir={tmp_path}", f"--ckpt_path={other}", *FAST])
    message = str(raised.value)
    assert message.startswith(f"could not read checkpoint {other}: not a lit_prunedpo checkpoint ({why}")
    assert "weights_only" not in message and "\n" not in message


def test_a_mode_overlay_given_alone_says_to_add_it_after_a_base_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        build_cli(["fit", "--config", "modes/branch"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: --config modes/branch sets none of the required model.policy, data: this is an overlay: add it after a "
        "base config, e.g. --config quickstart --config modes/branch")
