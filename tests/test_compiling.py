"""torch.compile of the step's model bodies (lit_prunedpo.compiling, callbacks.CompileModel, the bench's --compile):
the bodies of the policy and the online reference are compiled in place and once, the state dict keeps its keys, the
compiled step gives the eager step's objective and gradients over steps of changing shapes and pruning modes with no
graph compiled after the first steps, the callback does so in a CLI run and logs the graphs, and bad options are
refused naming the option.

Tracing a model costs seconds even on a one-layer model: the tests that run a compiled model are in the slow suite
(``inductor`` where the numbers are checked; ``aot_eager``, tracing without code generation, where only the wiring
is); the default suite checks the wiring that runs nothing."""

from __future__ import annotations

import csv
import json
from functools import partial
from pathlib import Path

import pytest
import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo_lab.bench.batches import make_batches
from lit_prunedpo_lab.bench.presets import MODES, get_preset
from lit_prunedpo.callbacks import CompileModel
from lit_prunedpo.cli import build_cli
from lit_prunedpo.compiling import CompileOptions, compile_bodies, graphs_compiled
from lit_prunedpo.models import FromConfig
from lit_prunedpo.rng import SamplerRNG
from lit_prunedpo.scoring import split_causal_lm

from helpers import REPO, csv_logger

ONE_LAYER = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo's cache is per process and keyed by code, not by module or backend: a test would be served another
    test's graphs (and count none of its own)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _module() -> PrunedDPO:
    module = PrunedDPO(policy=FromConfig("llama", ONE_LAYER, seed=0), beta=0.1,
                       optimizer=partial(torch.optim.AdamW, lr=1e-3))
    module.train()
    return module


@pytest.mark.parametrize("kwargs, words", [
    ({"mode": "fastest"}, "compile mode: one of"),
    ({"recompile_limit": 0}, "recompile_limit: an integer >= 1"),
])
def test_bad_options_are_refused_naming_the_option(kwargs, words):
    with pytest.raises(ValueError, match=words):
        CompileOptions(**kwargs)
    with pytest.raises(ValueError, match=words):
        CompileModel(**kwargs)
    with pytest.raises(ValueError, match="warn_after_steps"):
        CompileModel(warn_after_steps=0)


def test_the_bodies_of_policy_and_reference_are_compiled_in_place_once_and_keep_their_keys(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", torch._dynamo.config.recompile_limit)
    module = _module()
    keys = list(module.state_dict())
    models = [module.policy, *module.reference.models()]
    assert len(models) == 2
    compiled = compile_bodies(models, CompileOptions(backend="eager", recompile_limit=5))
    assert compiled == [split_causal_lm(m)[0] for m in models]
    assert all(body._compiled_call_impl is not None for body in compiled)
    assert torch._dynamo.config.recompile_limit == 5
    assert compile_bodies(models, CompileOptions(backend="eager")) == []  # already compiled: left as it is
    assert list(module.state_dict()) == keys  # no _orig_mod. prefix: checkpoints are an eager run's


def _steps(module: PrunedDPO, optimizer, batches, mode: str) -> list[tuple[float, list[torch.Tensor]]]:
    out = []
    module.use_samplers(*MODES[mode]())
    for batch in batches:
        objective = module.step(batch).estimate.objective
        objective.backward()
        out.append((float(objective), [p.grad.clone() for p in module.policy.parameters()]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return out


@pytest.mark.slow
def test_the_compiled_step_is_the_eager_step_and_stops_compiling_after_the_first():
    torch.set_num_threads(1)
    preset = get_preset("small")
    batches = make_batches(preset.__class__(**{**vars(preset), "model": ONE_LAYER}), 6, seed=1)
    assert len({b.response_ids.shape for b in batches}) > 1  # shapes change from step to step
    eager, compiled = _module(), _module()
    compile_bodies([compiled.policy, *compiled.reference.models()], CompileOptions(backend="inductor"))
    optimizers = [m.configure_optimizers() for m in (eager, compiled)]
    graphs = []
    for mode in ("vanilla", "all"):
        for m in (eager, compiled):
            m.run_state.sampler_rng = SamplerRNG(seed=3)  # the same draws
        want = _steps(eager, optimizers[0], batches, mode)
        start = graphs_compiled()
        got = _steps(compiled, optimizers[1], batches[:1], mode)
        graphs.append(graphs_compiled() - start)
        got += _steps(compiled, optimizers[1], batches[1:], mode)
        graphs.append(graphs_compiled() - start - graphs[-1])  # after the first step of the mode
        for (loss_e, grads_e), (loss_c, grads_c) in zip(want, got):
            assert loss_c == pytest.approx(loss_e, abs=1e-5)
            for ge, gc in zip(grads_e, grads_c):  # kernel rounding, carried along by the optimizer: 1e-3 of the scale
                assert float((gc - ge).abs().max()) <= 1e-3 * float(ge.abs().max()) + 1e-8
    assert graphs[0] > 0 and graphs[1] == 0 and graphs[3] == 0  # vanilla's first step compiled; nothing after


@pytest.mark.slow
def test_the_callback_compiles_a_cli_run_and_logs_its_graphs(tmp_path):
    build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), f"--trainer.default_root_dir={tmp_path}",
               *csv_logger(tmp_path), "--trainer.enable_progress_bar=false", "--trainer.max_steps=6",
               "--trainer.log_every_n_steps=1", "--trainer.limit_val_batches=0", "--data.init_args.max_rows=64",
               "--data.init_args.batch_size=8", "--model.policy.init_args.config.num_hidden_layers=1",
               "--trainer.callbacks+=lit_prunedpo.callbacks.CompileModel",
               "--trainer.callbacks.init_args.backend=aot_eager", "--trainer.callbacks.init_args.warn_after_steps=2"])
    (metrics,) = tmp_path.glob("lightning_logs/*/metrics.csv")
    rows = [row for row in csv.DictReader(metrics.open()) if row.get("compile/graphs")]
    graphs = [float(row["compile/graphs"]) for row in rows]
    assert len(graphs) == 6 and graphs[0] > 0 and graphs[-1] == graphs[1]  # all compiled in the first step


@pytest.mark.slow
def test_the_bench_compares_compiled_and_eager_steps(tmp_path, capsys):
    from lit_prunedpo_lab.bench.cli import main

    assert main(["--preset", "small", "--modes", "vanilla,branch", "--compile", "--compile-backend", "aot_eager",
                 "--steps", "3", "--warmup", "1", "--threads", "1", "--out", str(tmp_path), "--quiet"]) == 0
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert [r["mode"] for r in payload["rows"]] == ["vanilla", "branch"]
    assert payload["graphs"]["after_warmup"] == 0 and payload["graphs"]["total"] > 0
    for row in payload["rows"]:
        assert row["max_objective_difference"] < 1e-5 and row["max_grad_relative_difference"] < 1e-4
        assert row["speedup"] == pytest.approx(row["eager_s"] / row["compiled_s"])
    assert "| vanilla |" in (tmp_path / "bench.md").read_text()
    with pytest.raises(SystemExit):
        main(["--preset", "small", "--compile", "--peer", "trl"])
    assert "--peer does not go with --compile" in capsys.readouterr().err
