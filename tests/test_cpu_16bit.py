"""A 16-bit precision on a CPU without 16-bit matmul instructions runs, exactly, but hundreds of times slower: set-up
says so (lit_prunedpo.cpu_16bit). The rule on given rates, the real timing on this machine, and a real Trainer's
set-up with the CPU's rates given (slow, fast), so the test means the same on any CPU."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch

import lit_prunedpo.cpu_16bit as cpu_16bit
from lit_prunedpo import PrunedDPO
from lit_prunedpo.cpu_16bit import SLOWER, matmul_rate, slow_16bit_message, warn_if_slow_16bit
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.models import FromConfig

from helpers import TINY_LLAMA

GFLOP = 1e9


def test_the_rule_warns_only_for_a_16_bit_precision_slower_than_float32_by_more_than_the_margin():
    message = slow_16bit_message("bf16-mixed", 136 * GFLOP, 0.3 * GFLOP)
    assert message.startswith("precision bf16-mixed on this CPU (torch capability ")
    assert "a bfloat16 matmul ran 453x slower than a float32 one here (0.30 against 136.0 GFLOP/s" in message
    assert message.endswith("Train in float32 (--trainer.precision 32-true) or on a GPU.")
    assert "a float16 matmul" in slow_16bit_message("16-mixed", 100 * GFLOP, 1 * GFLOP)
    assert slow_16bit_message("bf16-true", 100 * GFLOP, 100 * GFLOP / SLOWER) is None  # at the margin: no warning
    assert slow_16bit_message("bf16-true", 100 * GFLOP, 0.99 * 100 * GFLOP / SLOWER) is not None
    assert slow_16bit_message("32-true", 100 * GFLOP, 0.1 * GFLOP) is None
    assert slow_16bit_message("64-true", 100 * GFLOP, 0.1 * GFLOP) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_matmul_rate_is_measured(dtype):
    rate = matmul_rate(dtype, size=64, repeats=2)
    assert 0 < rate < 1e15  # a real timing: positive, and below a petaflop on one CPU


def _fit(precision: str, tmp_path) -> None:
    module = PrunedDPO(policy=FromConfig("llama", TINY_LLAMA, seed=0))
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, precision=precision,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        default_root_dir=tmp_path)
    trainer.fit(module, datamodule=SyntheticPreferenceData(vocab_size=32, num_train=8, num_val=4, batch_size=4))


def test_a_trainers_set_up_warns_on_a_cpu_whose_bfloat16_is_slow_and_not_on_one_whose_is_fast(tmp_path,
                                                                                                monkeypatch):
    timed = []

    def rates(slow: bool):
        def rate(dtype, *args, **kwargs):
            timed.append(dtype)
            return 0.5 * GFLOP if slow and dtype != torch.float32 else 100 * GFLOP
        return rate

    monkeypatch.setattr(cpu_16bit, "matmul_rate", rates(slow=True))
    with pytest.warns(UserWarning, match=r"precision bf16-mixed on this CPU .* a bfloat16 matmul ran 200x slower"):
        _fit("bf16-mixed", tmp_path / "slow")
    assert timed == [torch.float32, torch.bfloat16]
    monkeypatch.setattr(cpu_16bit, "matmul_rate", rates(slow=False))
    timed.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _fit("bf16-true", tmp_path / "fast")
    assert not [w for w in seen if "on this CPU" in str(w.message)]
    assert timed == [torch.float32, torch.bfloat16]
    timed.clear()
    _fit("32-true", tmp_path / "wide")
    assert timed == []  # float32: nothing timed


def test_a_trainer_on_a_gpu_is_not_timed():
    class Trainer:  # a GPU trainer's two attributes the check reads (no GPU here to build a real one)
        def __init__(self, precision, device):
            self.precision = precision
            self.strategy = type("S", (), {"root_device": torch.device(device)})()

    assert warn_if_slow_16bit(Trainer("bf16-mixed", "cuda")) is None
