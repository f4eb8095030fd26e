"""The bench's ``--precision``, with Lightning's meaning, alike for every configuration and TRL peer: under
``bf16-mixed`` the parameters stay float32 while each step's forward runs under a bfloat16 autocast (backward and
the optimizer outside it), in the timed and the memory rounds."""

from __future__ import annotations

import contextlib
import importlib.util
import json

import pytest
import torch

from lit_prunedpo_lab.bench import precision as precision_module
from lit_prunedpo_lab.bench.cli import main
from lit_prunedpo_lab.bench.harness import run_benchmark
from lit_prunedpo_lab.bench.precision import resolve_precision
from lit_prunedpo_lab.bench.presets import get_preset
from lit_prunedpo_lab.bench.rounds import build_rounds, run_rounds, train_step

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the [peer] extra (trl)")

#: bfloat16 keeps 8 significant bits: a value rounded to it once moves by up to 2**-8 of itself (relative). A loss
#: near ln 2 whose forward ran in bfloat16 is within that of float32's (measured: 5e-5 apart on the small preset,
#: 50x inside), while two float32 runs of the same step agree to ~1e-7: apart by more than 1e-6 means the autocast
#: took effect.
BF16_REL = 2.0**-8
DIFFERS = 1e-6


def _linear_dtypes(model: torch.nn.Module, seen: list) -> None:
    """Record ``(input dtype, output dtype, profiled)`` of every ``nn.Linear`` forward of ``model`` (profiled: inside
    a memory round's tensor meter)."""
    def hook(module, args, output):
        seen.append((args[0].dtype, output.dtype, torch.autograd._profiler_enabled()))

    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(hook)


def _perturb(model: torch.nn.Module) -> None:
    """Move ``model`` away from its reference (the same move for every precision): the loss then is not ln 2."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.dtype))


def test_resolve_precision_and_dtype():
    assert resolve_precision(None, None) == resolve_precision("32-true", "float32")
    mixed = resolve_precision("bf16-mixed", "float32")  # float32 parameters: no conflict
    assert (mixed.weights, mixed.autocast, mixed.compute_dtype) == ("float32", "bfloat16", torch.bfloat16)
    assert resolve_precision(None, "bfloat16").name == "bf16-true"
    assert resolve_precision("16-mixed", None).compute_dtype == torch.float16
    with pytest.raises(ValueError, match=r"^--dtype bfloat16 conflicts with --precision bf16-mixed, whose parameters "
                                         r"are float32: give --precision alone \(--dtype bfloat16 alone is --precision "
                                         r"bf16-true\)$"):
        resolve_precision("bf16-mixed", "bfloat16")
    with pytest.raises(ValueError, match="precision: unknown 'fp8'"):
        resolve_precision("fp8", None)


def test_cli_refuses_a_conflicting_dtype_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--preset", "small", "--precision", "bf16-mixed", "--dtype", "bfloat16", "--quiet"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("lit-prunedpo-bench: error: --dtype bfloat16 conflicts with --precision bf16-mixed, whose "
                       "parameters are float32: give --precision alone (--dtype bfloat16 alone is --precision "
                       "bf16-true)")
    assert not any("Traceback" in line for line in err)


def test_an_autocast_torch_does_not_run_is_refused(monkeypatch):
    monkeypatch.setattr(precision_module.torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    with pytest.raises(ValueError, match=r"--precision 16-mixed: torch .* does not run torch.float16 autocast on cpu"):
        resolve_precision("16-mixed", None).stepper(torch.device("cpu"))


def test_bf16_mixed_configurations_forward_in_bf16_with_float32_parameters():
    """Every configuration's forwards (policy, online reference, chunked head) see bfloat16 activations from their
    Linears, in the timed rounds and the memory rounds alike; the parameters and the optimizer stay float32."""
    rounds = build_rounds(get_preset("small"), ["all"], ["online", "cached"], ["plain", "chunked"], ["shared"],
                          num_batches=2, warmup=1, dev=torch.device("cpu"), precision="bf16-mixed")
    assert rounds.meter.intrusive  # the CPU tensor meter: the measured round is replayed in a memory round
    policy, (frozen,) = rounds.module.policy, rounds.module.reference.models()
    seen, reference_seen = [], []
    _linear_dtypes(policy, seen)
    _linear_dtypes(frozen, reference_seen)
    records, _ = run_rounds(rounds)
    assert {out for _, out, _ in seen} == {out for _, out, _ in reference_seen} == {torch.bfloat16}
    assert {profiled for *_, profiled in seen} == {False, True}  # timed and memory rounds both ran in bfloat16
    assert all(p.dtype == torch.float32 for p in rounds.module.parameters())
    assert all(s.dtype == torch.float32 for state in rounds.optimizer.state.values() for s in state.values()
               if torch.is_tensor(s) and s.is_floating_point())
    assert all(len(r.losses) == 1 and r.step_peaks for r in records.values())


def test_float32_runs_no_autocast():
    rounds = build_rounds(get_preset("small"), ["vanilla"], ["online"], ["plain"], ["shared"], num_batches=1,
                          warmup=0, dev=torch.device("cpu"))
    seen = []
    _linear_dtypes(rounds.module.policy, seen)
    ((config, parts),) = rounds.parts.items()
    train_step(rounds.module, rounds.optimizer, rounds.batches[0], parts, rounds.rngs[config].next(), rounds.stepper)
    assert rounds.precision.name == "32-true" and {out for _, out, _ in seen} == {torch.float32}


def _one_step_loss(precision: str) -> float:
    rounds = build_rounds(get_preset("small"), ["vanilla"], ["online"], ["plain"], ["shared"], num_batches=1,
                          warmup=0, dev=torch.device("cpu"), precision=precision)
    _perturb(rounds.module.policy)
    ((config, parts),) = rounds.parts.items()
    out = train_step(rounds.module, rounds.optimizer, rounds.batches[0], parts, rounds.rngs[config].next(),
                     rounds.stepper)
    return float(out.estimate.objective.detach())


def test_one_bf16_mixed_step_loss_is_float32_s_to_bf16_precision():
    full, mixed = _one_step_loss("32-true"), _one_step_loss("bf16-mixed")
    assert mixed == pytest.approx(full, rel=BF16_REL)
    assert abs(mixed - full) > DIFFERS  # the autocast took effect


@pytest.mark.slow  # TRL's trainer
@needs_trl
def test_bf16_mixed_trl_peers_forward_in_bf16_and_their_loss_is_float32_s_to_bf16_precision():
    losses = {}
    for precision in ("32-true", "bf16-mixed"):
        rounds = build_rounds(get_preset("small"), ["vanilla"], ["cached"], ["plain"], ["shared"], num_batches=1,
                              warmup=0, dev=torch.device("cpu"), peer="trl,trl-online", precision=precision)
        for name, peer in rounds.peers.items():
            seen = []
            _linear_dtypes(peer.model, seen)
            if peer.reference is not None:
                _linear_dtypes(peer.reference, seen)
            _perturb(peer.model)
            losses[precision, name] = peer.step(peer.inputs(0))
            expected = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
            assert seen and {out for _, out, _ in seen} == {expected}
            assert all(p.dtype == torch.float32 for p in peer.model.parameters())
    for name in ("trl", "trl-online"):
        assert losses["bf16-mixed", name] == pytest.approx(losses["32-true", name], rel=BF16_REL)
        assert abs(losses["bf16-mixed", name] - losses["32-true", name]) > DIFFERS


def test_payload_and_report_record_the_precision(tmp_path):
    assert main(["--preset", "small", "--modes", "vanilla", "--references", "online", "--scorers", "plain",
                 "--precision", "bf16-mixed", "--steps", "1", "--warmup", "0", "--out", str(tmp_path), "--quiet"]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert (payload["precision"], payload["dtype"], payload["autocast_dtype"]) == ("bf16-mixed", "float32", "bfloat16")
    assert payload["peak_measure"]["dtype"] == "bfloat16"  # the matmuls run in bfloat16: so does the peak's
    assert ("precision bf16-mixed (parameters in float32, every step's forward under bfloat16 autocast)"
            in (tmp_path / "bench.md").read_text())
    true = run_benchmark(get_preset("small"), modes=["vanilla"], references=["cached"], scorers=["plain"], steps=1,
                         warmup=0, dtype="bfloat16")
    assert (true["precision"], true["dtype"], true["autocast_dtype"]) == ("bf16-true", "bfloat16", None)
    assert true["peak_measure"]["dtype"] == "bfloat16"


@pytest.mark.parametrize("slow", [True, False])
def test_a_16_bit_precision_the_cpu_runs_slowly_is_said_before_the_rounds(slow, tmp_path, capsys, monkeypatch):
    """The CPU's matmul rates given (slow or fast bfloat16), so that the test means the same on any CPU."""
    import lit_prunedpo.cpu_16bit as cpu_16bit

    monkeypatch.setattr(cpu_16bit, "matmul_rate",
                        lambda dtype, *a, **k: 1e8 if slow and dtype == torch.bfloat16 else 1e11)
    assert main(["--preset", "small", "--modes", "vanilla", "--references", "online", "--scorers", "plain",
                 "--precision", "bf16-true", "--steps", "1", "--warmup", "0", "--quiet"]) == 0
    err = capsys.readouterr().err
    said = "lit-prunedpo-bench: warning: precision bf16-true on this CPU" in err
    assert said == slow, err
    if slow:
        assert "a bfloat16 matmul ran 1000x slower than a float32 one here" in err
