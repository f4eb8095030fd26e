"""Resume does what the command line says (lit_prunedpo.checkpoint, lit_prunedpo.optim), through the real CLI:
a larger max_steps extends the schedule, ``--ckpt_path last`` finds the previous run's newest readable checkpoint
(or refuses, naming where it looked), a changed optimizer or scheduler argument is applied (or refused), a
failed save falls back to the step checkpoint beside it, and runs without a logger never share a checkpoint folder."""

from __future__ import annotations

import csv
import errno
import logging
import re
from pathlib import Path

import pytest
import torch

from lit_prunedpo.checkpoint import AtomicCheckpointIO
from lit_prunedpo.cli import build_cli

from helpers import REPO

QUICK = ["--config", str(REPO / "configs/quickstart.yaml"), "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--trainer.val_check_interval=1000", "--trainer.log_every_n_steps=1",
         "--data.init_args.max_rows=48", "--data.init_args.batch_size=8",
         "--model.scheduler.init_args.warmup_steps=0"]  # the cosine decay starts at once: 0 at the last step


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory, monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets_cache"))


def _fit(root: Path, *extra: str, logger: bool = True):
    # the logger is chosen here: the default one depends on whether tensorboard is installed
    chosen = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={root}",
              "--trainer.callbacks+=LearningRateMonitor", "--trainer.callbacks.logging_interval=step"] if logger \
        else ["--trainer.logger=false"]
    return build_cli(["fit", *QUICK, f"--trainer.default_root_dir={root}", *chosen, *extra])


def _rates(version: Path) -> dict[int, float]:
    with open(version / "metrics.csv") as f:
        return {int(row["step"]): float(row["lr-AdamW"]) for row in csv.DictReader(f) if row.get("lr-AdamW")}


def _weights(cli) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in cli.model.policy.state_dict().items()}


def test_resume_last_with_a_larger_max_steps_extends_the_schedule_and_trains(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    first = _fit(tmp_path, "--trainer.max_steps=3")
    before = _weights(first)
    logs = tmp_path / "lightning_logs"
    checkpoint = logs / "version_0/checkpoints/last.ckpt"
    # read before the resume, which goes on in this folder and saves its own last.ckpt there
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)["num_tokens"]
    assert _rates(logs / "version_0")[2] > 0
    # the finished schedule ended at rate 0: continuing it would train at 0, so the default resume is refused
    with pytest.raises(ValueError, match=r"had ended at rate 0 at step 3: continued, .*on_extension=stretch to re-fit"):
        _fit(tmp_path, "--trainer.max_steps=6", "--ckpt_path=last")
    resumed = _fit(tmp_path, "--trainer.max_steps=6", "--ckpt_path=last",
                   "--model.scheduler.init_args.on_extension=stretch")
    # the resumed run goes on in the run folder of the checkpoint it resumed from, and says so
    assert f"resume (ckpt_path=last): resuming from {checkpoint}, the newest readable checkpoint" in caplog.text
    assert f"resume: this run logs into {logs / 'version_0'}, the run folder of {checkpoint}" in caplog.text
    assert resumed.trainer.global_step == 6 and sorted(p.name for p in logs.iterdir()) == ["version_0"]
    assert "resume: WarmupCosineLR schedule extended from 3 to 6 steps (total_steps follows the trainer's " \
           "max_steps): " \
           "the whole schedule re-fitted to 6 steps" in caplog.text
    rates = _rates(logs / "version_0")
    assert sorted(rates) == [0, 1, 2, 3, 4, 5], rates  # both parts in one metrics.csv
    assert all(rates[step] > 0 for step in (3, 4, 5)), rates  # was 0.0 at every later step
    assert rates[3] == pytest.approx(0.002 * 0.5)  # half-way through the cosine of 6 steps
    after = _weights(resumed)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # TRL's num_tokens goes on counting from the checkpoint's
    assert saved == first.model.num_tokens > 0 and resumed.model.num_tokens > saved


def test_resume_last_with_nothing_to_resume_is_refused_naming_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"resume \(ckpt_path=last\): no checkpoint of a previous run in "
                                                rf"{tmp_path / 'lightning_logs' / '[*]' / 'checkpoints'}, "
                                                rf"{tmp_path / 'checkpoints[*]'}\. Pass --ckpt_path"):
        _fit(tmp_path, "--trainer.max_steps=1", "--ckpt_path=last")
    assert not (tmp_path / "lightning_logs").exists()  # the refused run leaves no empty version_0 (nor its root)


def test_an_explicit_total_steps_shorter_than_the_run_is_kept_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match=r"model.scheduler.init_args.total_steps=2 is less than this run's 3 optimizer "
                                         r"steps.*Leave total_steps unset"):
        cli = _fit(tmp_path, "--trainer.max_steps=3", "--model.scheduler.init_args.total_steps=2")
    assert cli.trainer.lr_scheduler_configs[0].scheduler.total_steps == 2


def test_changed_optimizer_and_scheduler_arguments_are_applied_on_resume(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    _fit(tmp_path, "--trainer.max_steps=2")
    resumed = _fit(tmp_path, "--trainer.max_steps=4", "--ckpt_path=last", "--model.optimizer.init_args.lr=1e-5",
                   "--model.optimizer.init_args.weight_decay=0.1", "--model.scheduler.init_args.min_lr_ratio=0.5")
    for line in ("resume: model.optimizer.init_args.lr is 1e-05 (the checkpoint's: 0.002): applied",
                 "resume: model.optimizer.init_args.weight_decay is 0.1 (the checkpoint's: 0.0): applied",
                 "resume: model.scheduler.init_args.min_lr_ratio is 0.5 (the checkpoint's: 0.0): applied"):
        assert line in caplog.text
    group = resumed.trainer.optimizers[0].param_groups[0]
    scheduler = resumed.trainer.lr_scheduler_configs[0].scheduler
    assert (group["initial_lr"], scheduler.base_lrs, group["weight_decay"]) == (1e-5, [1e-5], 0.1)
    assert scheduler.min_lr_ratio == 0.5
    # the 2-step schedule ended at its floor, now 0.5 of the new rate 1e-5: the extension continues there (not at
    # the checkpoint's rate 0 and floor 0)
    assert _rates(tmp_path / "lightning_logs/version_0")[2] == pytest.approx(1e-5 * 0.5)  # the resumed part's


def test_another_optimizer_class_on_resume_is_refused(tmp_path):
    floor = "--model.scheduler.init_args.min_lr_ratio=0.1"  # so that the finished schedule may go on (at its floor)
    _fit(tmp_path, "--trainer.max_steps=1", floor)
    with pytest.raises(ValueError, match=r"resume: the checkpoint was trained with model.optimizer "
                                         r"torch.optim.adamw.AdamW, this run has torch.optim.sgd.SGD: the checkpoint's "
                                         r"optimizer state cannot be carried over to another class"):
        _fit(tmp_path, "--trainer.max_steps=2", "--ckpt_path=last", "--model.optimizer=torch.optim.SGD",
             "--model.optimizer.init_args.lr=0.01", floor)


def test_a_failed_save_of_last_falls_back_to_the_step_checkpoint_beside_it(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    save = AtomicCheckpointIO.save_checkpoint

    def disk_full(self, checkpoint, path, storage_options=None):
        if Path(path).name == "last.ckpt":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return save(self, checkpoint, path, storage_options)

    checkpoints = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=2",
                   "--trainer.callbacks.save_last=true"]
    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", disk_full)
    with pytest.raises(OSError, match="No space left"):
        _fit(tmp_path, "--trainer.max_steps=3", *checkpoints)
    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save)
    folder = tmp_path / "lightning_logs/version_0/checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=2.ckpt"]  # no last.ckpt: its save failed
    resumed = _fit(tmp_path, "--trainer.max_steps=3", *checkpoints, "--ckpt_path=last")
    assert f"Restored all states from the checkpoint at {folder / 'epoch=0-step=2.ckpt'}" in caplog.text
    assert resumed.model.sampler_rng.step == 3  # one step trained after the two of the checkpoint, not three afresh


def test_runs_without_a_logger_never_share_a_checkpoint_folder(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    _fit(tmp_path, "--trainer.max_steps=1", logger=False)
    first = tmp_path / "checkpoints/last.ckpt"
    kept = first.read_bytes()
    second = _fit(tmp_path, "--trainer.max_steps=2", logger=False)
    assert first.read_bytes() == kept  # was overwritten by the second run
    assert second.trainer.checkpoint_callback.dirpath == str((tmp_path / "checkpoints-1").resolve())
    assert (tmp_path / "checkpoints-1/last.ckpt").is_file() and (tmp_path / "config-1.yaml").is_file()
    assert (f"{tmp_path} holds other runs' outputs (logger: false): this run's checkpoints go to "
            f"{tmp_path / 'checkpoints-1'} and its config is {tmp_path / 'config-1.yaml'}") in caplog.text
    third = _fit(tmp_path, "--trainer.max_steps=3", "--ckpt_path=last",
                 "--model.scheduler.init_args.on_extension=stretch",
                 logger=False)  # the 2-step schedule ended at rate 0: continuing it is refused
    assert f"resuming from {tmp_path / 'checkpoints-1/last.ckpt'}, the newest readable checkpoint" in caplog.text
    assert third.model.sampler_rng.step == 3 and (tmp_path / "checkpoints-2/last.ckpt").is_file()


def test_a_checkpoint_of_another_policy_is_refused_in_one_line_before_its_weights_load(tmp_path):
    _fit(tmp_path, "--trainer.max_steps=1")
    checkpoint = tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt"
    fix = "resume with the config it was trained with (config.yaml in its run folder), or leave --ckpt_path out"
    with pytest.raises(ValueError, match=rf"^checkpoint {checkpoint} holds a llama model, but this run's model.policy "
                                         rf"is a qwen2 model: {re.escape(fix)}"):
        _fit(tmp_path, "--trainer.max_steps=2", f"--ckpt_path={checkpoint}",
             "--model.policy.init_args.model_type=qwen2")
    with pytest.raises(ValueError, match=rf"^checkpoint {checkpoint}: its policy's weights do not fit this run's "
                                         r"model.policy \(\d+ of other shapes, e.g. .* config fields that differ: "
                                         r"head_dim 16 -> 8, hidden_size 64 -> 32\): " + re.escape(fix)):
        _fit(tmp_path, "--trainer.max_steps=2", f"--ckpt_path={checkpoint}",
             "--model.policy.init_args.config.hidden_size=32")
    lora = ["--config", str(REPO / "configs/lora.yaml"), f"--trainer.default_root_dir={tmp_path}"]
    with pytest.raises(ValueError, match=rf"^checkpoint {checkpoint} holds a full model's weights \(trained without "
                                         rf"LoRA\), but this run's model.policy is a LoRA: {re.escape(fix)}.*; to "
                                         rf"train adapters on the model it holds, export it \(lit-prunedpo export "
                                         rf"--ckpt_path {checkpoint} --out DIR\)"):
        _fit(tmp_path, *lora, "--trainer.max_steps=2", f"--ckpt_path={checkpoint}")
    _fit(tmp_path / "lora", *lora[:2], f"--trainer.default_root_dir={tmp_path / 'lora'}", "--trainer.max_steps=1")
    adapters = tmp_path / "lora/lightning_logs/version_0/checkpoints/last.ckpt"
    with pytest.raises(ValueError, match=rf"^checkpoint {adapters} holds LoRA adapters, but this run's model.policy "
                                         rf"is a full model \(no LoRA\): {re.escape(fix)}"):
        _fit(tmp_path, "--trainer.max_steps=2", f"--ckpt_path={adapters}")
