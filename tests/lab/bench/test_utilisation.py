"""Utilisation in the benchmark's records: a TRL peer's FLOPs on hand-computed padded shapes, the measured peak, the
rates of a record, the peers' columns and paragraphs in the report, and the refusal of an unknown peer."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import make_batch

from lit_prunedpo_lab.bench import cost
from lit_prunedpo_lab.bench.cli import main
from lit_prunedpo_lab.bench.harness import run_benchmark
from lit_prunedpo_lab.bench.peer_trl import PeerForward
from lit_prunedpo_lab.bench.presets import get_preset
from lit_prunedpo_lab.bench.report import to_markdown
from lit_prunedpo_lab.bench.report import peak_lines
from lit_prunedpo_lab.bench.utilisation import (higher_peak, measure_peak, peer_step_flops, rate_fields,
                                             typical_tokens)

DIMS = cost.ModelDims(body_params=1000, hidden_size=8, vocab_size=100, num_layers=2, attention_dim=8)
# TRL's rows: 2 pairs -> 4 rows padded to 7 columns; on the CPU its head projects every shifted position, 4 x 6 = 24.
#   body 2*1000*4*7 = 56000, attention 4*2*8*7^2*4 = 12544, head 2*8*100*24 = 38400 -> F = 106944
F, HEAD = 106_944, 38_400


def test_a_peer_step_is_an_unpruned_step_over_its_padded_rows():
    policy = PeerForward(rows=4, width=7, positions=24, grad=True, reference=False)
    precomputed = peer_step_flops(DIMS, [policy])
    # forward F, backward 2F, TRL's chunked head recomputed in backward, no reference forward
    assert (precomputed.policy_forward, precomputed.policy_backward, precomputed.head_recompute,
            precomputed.reference_forward) == (F, 2 * F, HEAD, 0)
    assert precomputed.total == 359_232
    online = peer_step_flops(DIMS, [policy, PeerForward(4, 7, 24, grad=False, reference=True)])
    assert online.reference_forward == F and online.total == 466_176
    # Triton on CUDA scores only the completion positions: the head shrinks, the padded body does not
    compact = peer_step_flops(DIMS, [PeerForward(4, 7, 10, grad=True, reference=False)])
    assert compact.total == 3 * (56_000 + 12_544 + 16_000) + 16_000


def test_rates_of_a_record():
    steps = [cost.StepFlops(10, 20, 0, 0), cost.StepFlops(20, 40, 0, 30)]
    assert rate_fields(steps, 0.5, 180.0) == {"flops": 60.0, "achieved_flops_per_s": 120.0, "utilisation": 120 / 180}
    assert rate_fields(steps, 0.5, None)["utilisation"] is None
    assert rate_fields(steps, 0.5, math.nan)["utilisation"] is None


def test_the_peak_is_a_positive_finite_rate_of_the_shape_asked_for():
    peak = measure_peak(64, 32, 96, torch.float32, torch.device("cpu"), repeats=3)
    assert math.isfinite(peak["flops_per_s"]) and peak["flops_per_s"] > 0
    assert peak["shape"] == [64, 32, 96] and peak["dtype"] == "float32" and peak["device"] == "cpu"
    assert len(peak["times_s"]) == 3 and peak["threads"] == torch.get_num_threads()
    assert measure_peak(16, 8, 8, torch.bfloat16, torch.device("cpu"), repeats=1)["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="tokens"):
        measure_peak(0, 32, 96, torch.float32, torch.device("cpu"))


def test_the_higher_of_two_peak_readings_is_kept_with_both_and_the_report_says_when_they_differ():
    low = {"flops_per_s": 169e9, "shape": [8, 4, 4], "dtype": "bfloat16", "device": "cpu", "threads": 2,
           "times_s": [1.0]}
    high = {**low, "flops_per_s": 409e9, "times_s": [0.4]}
    for before, after in ((low, high), (high, low)):
        peak = higher_peak(before, after)
        assert peak["flops_per_s"] == 409e9 and peak["times_s"] == [0.4]
        assert peak["readings_flops_per_s"] == [before["flops_per_s"], after["flops_per_s"]]
    lines = peak_lines({"peak_measure": higher_peak(low, high)})
    assert "the higher of the readings before (169) and after (409) the rounds" in lines[0]
    assert "differ by more than 20 %" in lines[1]
    assert len(peak_lines({"peak_measure": higher_peak(high, {**high, "flops_per_s": 400e9})})) == 1


def test_typical_tokens_are_a_padded_forwards():
    # prompts padded to 4, responses to 7: 2 pairs x 2 branches x (4 + 7 - 1) columns
    batch = make_batch([3, 4], [5, 7], [6, 2])
    assert typical_tokens([batch]) == 2 * 2 * (4 + 7 - 1)


def test_an_unknown_peer_is_refused_naming_the_argument(capsys):
    with pytest.raises(SystemExit):
        main(["--peer", "trl,bogus"])
    err = capsys.readouterr().err
    assert "--peer" in err and "bogus" in err and "trl-online" in err
    with pytest.raises(ValueError, match=r"peer: unknown \['nope'\]"):
        run_benchmark(get_preset("small"), modes=["vanilla"], peer="trl,nope")


def _payload(peers):
    row = dict(mode="vanilla", reference="online", scorer="plain", prompt="shared", step_time_s=0.1, flops=2e9,
               achieved_flops_per_s=2e10, utilisation=0.25)
    for name, speedup in peers:
        row[f"speedup_vs_{name}"] = speedup
    rows = [dict(name=name, reference=f"the reference of {name}", step_time_s=0.1 * s, tokens_executed=100,
                 reference_tokens_executed=100 if name == "trl-online" else 0, flops=3e9,
                 achieved_flops_per_s=3e10 / s, utilisation=0.375 / s) for name, s in peers]
    return {"preset": "test", "device": "cpu", "results": [row], "peers": rows,
            "peak_measure": {"flops_per_s": 8e10, "shape": [10, 20, 30], "dtype": "float32", "device": "cpu",
                             "threads": 2, "times_s": [1.0, 1.0, 1.0]}}


def test_the_report_names_each_peer_and_its_reference():
    md = to_markdown(_payload([("trl", 2.0), ("trl-online", 3.0)]))
    header = next(line for line in md.splitlines() if line.startswith("| mode"))
    assert header.endswith("| GFLOP/step | GFLOP/s | utilisation | vs trl | vs trl-online |")
    assert "| 2 | 20 | 25.0% | 2.00x | 3.00x |" in md
    assert "Peer `trl` (TRL DPOTrainer.compute_loss with the reference of trl," in md
    assert "Peer `trl-online` (TRL DPOTrainer.compute_loss with the reference of trl-online," in md
    assert "and 100 in its reference forward" in md and "(12.5% of the peak)" in md
    assert "[10 x 20] @ [20 x 30] float32 matmuls" in md and "80 GFLOP/s" in md


def test_a_single_peer_payload_keeps_its_vs_peer_column():
    old = {"preset": "test", "device": "cpu", "peer": {"name": "trl", "step_time_s": 0.2, "tokens_executed": 10},
           "results": [dict(mode="vanilla", reference="cached", scorer="plain", step_time_s=0.1,
                            speedup_vs_peer=2.0)]}
    md = to_markdown(old)
    assert md.splitlines()[-3].endswith("| 2.00x |") and "| vs peer |" in md and "Peer `trl`" in md
