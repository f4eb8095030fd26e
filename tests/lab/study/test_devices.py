"""Where a study trains: the device checked before any work (named in the error), the CPU clock refused on a GPU,
and a CUDA device asked for on a machine without one refused by the command while it parses."""

from __future__ import annotations

import pytest
import torch

from lit_prunedpo_lab.study.arguments import build_parser, resolve_options
from lit_prunedpo_lab.study.cli import main
from lit_prunedpo_lab.study.devices import check_clock_on, study_device, synchronize


def test_the_cpu_is_a_study_device_and_needs_no_synchronizing():
    assert study_device("cpu") == torch.device("cpu") == study_device(torch.device("cpu"))
    synchronize(torch.device("cpu"))  # nothing queued on the CPU: a no-op, not an error


@pytest.mark.parametrize("device, message", [
    ("tpu", "'tpu' is not a device torch knows"),
    ("meta", "a study trains on 'cpu' or 'cuda\\[:N\\]', got 'meta'"),
])
def test_a_device_a_study_cannot_train_on_is_named(device, message):
    with pytest.raises(ValueError, match=message):
        study_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_cuda_device_is_refused_before_any_work(capsys):
    with pytest.raises(ValueError, match="torch sees no CUDA device here"):
        study_device("cuda:0")
    with pytest.raises(SystemExit):
        main(["--task", "quickstart", "--device", "cuda", "--clock", "wall", "--quick"])
    assert "--device cuda: device: 'cuda' asked for, but torch sees no CUDA device" in capsys.readouterr().err


def test_the_cpu_clock_is_refused_on_a_gpu():
    with pytest.raises(ValueError, match="clock 'cpu' on device cuda:0: .* use the wall clock"):
        check_clock_on(torch.device("cuda:0"), "cpu")
    check_clock_on(torch.device("cuda:0"), "wall")
    check_clock_on(torch.device("cpu"), "cpu")


def test_the_device_reaches_the_options_and_defaults_to_the_cpu():
    assert resolve_options(build_parser().parse_args(["--task", "quickstart"])).device == "cpu"
    assert resolve_options(build_parser().parse_args(["--task", "quickstart", "--device", "cpu:0"])).device == "cpu:0"


def test_a_runs_training_state_counts_four_copies_of_what_trains_and_one_of_what_is_frozen():
    from lit_prunedpo_lab.study.devices import training_state_bytes

    module = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))  # 110 float32 weights each
    module[1].requires_grad_(False)
    assert training_state_bytes(module) == 4 * 110 * 4 + 110 * 4
    module.to(torch.bfloat16)
    assert training_state_bytes(module) == 4 * 110 * 2 + 110 * 2


def test_runs_that_cannot_fit_together_are_refused_with_the_figures_and_the_fix():
    from lit_prunedpo_lab.study.devices import RunsDoNotFit, available_bytes, check_runs_fit

    gib = 2**30
    check_runs_fit(6, 2 * gib, torch.device("cpu"), available=13 * gib)  # 12 GiB of 13: they fit
    message = (r"12 runs training at once need at least 26.0 GiB on cpu .* 2.17 GiB each.*and 24.0 GiB is free, room "
               r"for at most 11: train fewer seeds at once \(--seeds-at-once K")
    with pytest.raises(RunsDoNotFit, match=message):
        check_runs_fit(12, int(2.17 * gib), torch.device("cpu"), available=24 * gib)
    free = available_bytes(torch.device("cpu"))
    assert free is None or free > 0
