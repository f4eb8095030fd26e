"""The user-facing examples (what a user copies): a custom sampler from the user's own module is unbiased (checked
with the public helper, as a user would) and trains through the CLI with no change to the package; so does a custom
loss, whose pruned step's gradient is the exact one's in expectation; and training from Python runs the same
objects without the command line. The measuring scripts are the lab's (``lab/scripts/``,
``tests/lab/test_scripts.py``)."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo.cli import build_cli
from lit_prunedpo.testing import check_position_sampler, check_unbiased

from helpers import REPO


@pytest.fixture
def custom_sampler(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import custom_sampler

    return custom_sampler


def test_custom_sampler_is_unbiased(custom_sampler):
    report = check_position_sampler(custom_sampler.TailWeightedPositions(0.2, 0.8), lengths=(1, 2, 5, 9),
                                    num_draws=6000)
    assert report.exact_checks == 12
    check_unbiased(position=custom_sampler.TailWeightedPositions(0.3, 0.9), num_draws=1500)


def test_custom_sampler_arguments_checked(custom_sampler):
    with pytest.raises(ValueError, match="first"):
        custom_sampler.TailWeightedPositions(first=0.0)


def test_custom_sampler_config_trains(custom_sampler, tmp_path):
    cli = build_cli(["fit", "--config", str(REPO / "examples/custom_sampler.yaml"),
                     f"--trainer.default_root_dir={tmp_path}",
                     "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                     "--data.init_args.max_rows=64", "--trainer.enable_progress_bar=false"])
    assert type(cli.model.position_sampler).__name__ == "TailWeightedPositions"
    assert cli.trainer.global_step == 2


@pytest.fixture
def custom_loss(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import custom_loss

    return custom_loss


def test_custom_loss_is_the_squared_hinge_and_its_derivative_autograds(custom_loss):
    loss = custom_loss.SquaredHingeLoss(scale=2.0)
    margin = torch.tensor([-3.0, 0.0, 5.0, 10.0, 20.0])
    assert torch.allclose(loss.value(margin, 0.1), 2.0 * torch.tensor([1.3**2, 1.0, 0.5**2, 0.0, 0.0]))
    assert torch.allclose(loss.derivative(margin, 0.1), -2 * 2.0 * 0.1 * torch.tensor([1.3, 1.0, 0.5, 0.0, 0.0]))
    assert loss.margin_only
    with pytest.raises(ValueError, match="scale"):
        custom_loss.SquaredHingeLoss(scale=0.0)


def test_custom_loss_gradient_under_pruning_is_the_exact_ones_in_expectation(custom_loss, tiny_source, small_batch):
    """The custom loss in the module's real step: the mean gradient of branch-pruned steps matches the exact
    step's, within Monte Carlo error (the loss's coefficient is a function of the exact margin here: one draw of
    the branches changes only which branch is back-propagated)."""
    from lit_prunedpo import PrunedDPO
    from lit_prunedpo.samplers import BothBranches, RandomBranch

    module = PrunedDPO(tiny_source, loss=custom_loss.SquaredHingeLoss())  # margin 0 at first: inside the hinge
    params = [p for p in module.policy.parameters() if p.requires_grad]

    def gradient(branch, seed: int) -> torch.Tensor:
        out = module.step(small_batch, module.parts_with(branch=branch), torch.Generator().manual_seed(seed))
        grads = torch.autograd.grad(out.estimate.objective, params, allow_unused=True)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])

    exact = gradient(BothBranches(), 0)
    draws = torch.stack([gradient(RandomBranch(), seed) for seed in range(200)])
    error = draws.std(0) / 200 ** 0.5
    assert exact.norm() > 0
    assert ((draws.mean(0) - exact).abs() <= 5 * error + 1e-6).all()


def test_custom_loss_config_trains(custom_loss, tmp_path):
    cli = build_cli(["fit", "--config", str(REPO / "examples/custom_loss.yaml"),
                     f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=2",
                     "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                     "--data.init_args.max_rows=64", "--trainer.enable_progress_bar=false"])
    assert type(cli.model.loss).__name__ == "SquaredHingeLoss"
    assert cli.trainer.global_step == 2


def test_training_from_python_runs_and_validates_the_exact_objective(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    from train_from_python import main

    trainer = main(["--steps", "3", "--max-rows", "64", "--batch-size", "8", "--branch-pruning", "--out",
                    str(tmp_path)])
    assert trainer.global_step == 3 and type(trainer.lightning_module.branch_sampler).__name__ == "RandomBranch"
    assert "'val/loss'" in capsys.readouterr().out
