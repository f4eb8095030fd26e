"""Reference caches named by their fingerprint: a path template (``{model}``, ``{fingerprint}``) or a folder gives
another model, data set or precision another file and the same settings their own file again (no rebuild); a plain
file path is used as named and refused when the settings change; the model and the data are hashed once per set-up;
under DDP every rank derives the same name, or every rank refuses; ``lit-prunedpo-cache`` prints the file ``fit``
then loads, through the real CLI with the shipped config's template."""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import socket

import pytest
import torch
import yaml
from helpers import REPO, TINY_LLAMA

import lit_prunedpo.reference.cached as rc
import lit_prunedpo.reference.fingerprint as fp
from lit_prunedpo.cli import build_cli
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.models import FromConfig
from lit_prunedpo.reference import CachedReference, ReferenceRuntime
from lit_prunedpo.reference.store import read_fingerprint

TEMPLATE = "ref-{model}-{fingerprint}.safetensors"
NAME = re.compile(r"ref-llama-([0-9a-f]{12})\.safetensors")
FAST = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture
def builds(monkeypatch):
    """Counts calls of compute_reference_logps (each is one build of a cache or shard)."""
    calls = []
    real = rc.compute_reference_logps

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rc, "compute_reference_logps", counting)
    return calls


def synthetic(**kwargs):
    dm = SyntheticPreferenceData(**{**dict(vocab_size=32, num_train=24, num_val=8, batch_size=8, seed=3), **kwargs})
    dm.setup("fit")
    return dm


def llama(seed):
    return FromConfig(model_type="llama", config=TINY_LLAMA, seed=seed).build()


def prepare(path, policy, data=None, **runtime):
    ref = CachedReference(str(path))
    ref.prepare(policy, data if data is not None else synthetic(), ReferenceRuntime(**runtime))
    return ref


def test_two_models_get_two_files_and_the_same_settings_reuse_theirs(tmp_path, builds, caplog):
    caplog.set_level(logging.INFO)
    template, first = tmp_path / "cache" / TEMPLATE, llama(0)
    a, b = prepare(template, first), prepare(template, llama(1))
    assert len(builds) == 2 and a.cache_path != b.cache_path
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([a.cache_path.name, b.cache_path.name])
    for ref in (a, b):  # the name is the fingerprint the file holds
        assert NAME.fullmatch(ref.cache_path.name)[1] == fp.fingerprint_digest(read_fingerprint(ref.cache_path))
    assert f"reference cache: {a.cache_path}, named by the fingerprint" in caplog.text
    assert "none yet: building it" in caplog.text
    stamp = os.stat(a.cache_path).st_mtime_ns
    again = prepare(template, llama(0))  # the first model's settings come back: its file, not rebuilt
    assert len(builds) == 2 and again.builds == 0 and again.cache_path == a.cache_path
    assert (os.stat(a.cache_path).st_mtime_ns == stamp and "found, with this run's fingerprint: reusing "
                                                           "it" in caplog.text)
    other_data = prepare(template, first, synthetic(max_response_length=20))
    other_precision = prepare(template, first, precision="bf16-mixed")
    assert len({a.cache_path, b.cache_path, other_data.cache_path, other_precision.cache_path}) == 4
    assert len(builds) == 4


def test_a_folder_names_the_file_inside_it(tmp_path, builds):
    folder = tmp_path / "cache"
    made = prepare(f"{folder}/", llama(0))  # a trailing "/": a folder, even before it exists
    assert made.cache_path.parent == folder and NAME.fullmatch(made.cache_path.name)
    again = prepare(folder, llama(0))  # an existing directory is a folder too
    assert again.cache_path == made.cache_path and len(builds) == 1


def test_a_named_file_is_used_as_named_and_refused_for_another_model(tmp_path, builds, caplog):
    caplog.set_level(logging.INFO)
    path = tmp_path / "ref.safetensors"
    assert prepare(path, llama(0)).cache_path == path
    assert f"reference cache: {path}, the file model.reference.init_args.path names; none yet" in caplog.text
    with pytest.raises(ValueError, match=r"reference cache .*ref\.safetensors is stale.*reference\.weights"):
        prepare(path, llama(1))
    assert len(builds) == 1 and os.listdir(tmp_path) == ["ref.safetensors"]


@pytest.mark.parametrize("path, message", [
    ("c/{digest}.safetensors", r"path 'c/\{digest\}.safetensors' names \{digest\}; the placeholders are \{model\}"),
    ("c/ref-{model}.safetensors", r"has no \{fingerprint\}: every run would name the same file"),
    ("c/ref-{.safetensors", r"is not a valid template"),
])
def test_a_bad_template_is_refused_before_anything_runs(path, message):
    with pytest.raises(ValueError, match=message):
        CachedReference(path)


def test_a_template_has_no_file_until_the_run_is_fingerprinted():
    with pytest.raises(ValueError, match=r"is named by the run's fingerprint, known once prepare\(\) has hashed"):
        CachedReference(f"c/{TEMPLATE}").resolve_path(".")


def test_the_model_and_the_data_are_hashed_once_per_set_up(tmp_path, monkeypatch):
    hashed, data = [], synthetic()
    real_hash, real_data = fp.weights_hash, data.cache_fingerprint
    monkeypatch.setattr(fp, "weights_hash", lambda model: hashed.append("weights") or real_hash(model))
    monkeypatch.setattr(data, "cache_fingerprint", lambda: hashed.append("data") or real_data())
    policy = llama(0)
    prepare(tmp_path / TEMPLATE, policy, data)  # built
    assert sorted(hashed) == ["data", "weights"]
    prepare(tmp_path / TEMPLATE, policy, data)  # reused
    assert sorted(hashed) == ["data", "data", "weights", "weights"]


def test_model_slug_names_the_model():
    class Named(torch.nn.Module):
        def __init__(self, name_or_path="", model_type=""):
            super().__init__()
            self.name_or_path = name_or_path
            self.config = type("Config", (), {"model_type": model_type})()

    assert fp.model_slug(Named("HuggingFaceTB/SmolLM2-135M-Instruct")) == "SmolLM2-135M-Instruct"
    assert fp.model_slug(Named("/tmp/models/tiny gpt2/")) == "tiny-gpt2"
    assert fp.model_slug(Named("", "llama")) == "llama" == fp.model_slug(llama(0))
    assert fp.model_slug(torch.nn.Linear(2, 2)) == "Linear"


# ------------------------------------------------------------------------------------ DDP: two processes
def _rank(rank, port, seeds, folder, out):
    import torch.distributed as dist

    from lit_prunedpo.reference.base import _all_gather_objects

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        runtime = ReferenceRuntime(root_dir=str(folder), world_size=2, rank=rank, barrier=lambda name: dist.barrier(),
                                   gather=_all_gather_objects)
        ref = CachedReference(f"{folder}/")
        try:
            ref.prepare(llama(seeds[rank]), synthetic(), runtime)
            result = {"path": str(ref.cache_path), "builds": ref.builds, "rows": ref.store.num_rows}
        except ValueError as err:
            result = {"error": str(err)}
        out.put((rank, result))
    finally:
        dist.destroy_process_group()


def _two_ranks(seeds, folder):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, seeds, folder, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0, f"rank process ended with {p.exitcode}"
    return results


def test_ranks_derive_one_name_or_all_refuse(tmp_path):
    folder = tmp_path / "cache"
    results = _two_ranks((0, 0), folder)
    assert results[0]["path"] == results[1]["path"] and NAME.fullmatch(os.path.basename(results[0]["path"]))
    assert [results[r]["builds"] for r in (0, 1)] == [1, 1] and results[1]["rows"] == 32  # one shard each, merged
    assert os.listdir(folder) == [os.path.basename(results[0]["path"])]  # no shard left behind
    refused = _two_ranks((0, 1), tmp_path / "other")  # rank 1's reference weights differ
    for rank in (0, 1):
        assert re.search(r"rank 1 computed another fingerprint than rank 0.*reference\.weights \(rank 0: ",
                         refused[rank]["error"])
    assert not (tmp_path / "other").exists()


# ------------------------------------------------------------------------------------ the shipped configs, the CLI
@pytest.mark.parametrize("config", ["cached", "hh_rlhf"])
def test_the_shipped_caches_are_named_by_their_fingerprint(config):
    reference = yaml.safe_load((REPO / f"configs/{config}.yaml").read_text())["model"]["reference"]["init_args"]
    assert reference["path"] == f"runs/cache/{TEMPLATE}"


def test_the_cache_command_prints_the_file_fit_reuses(tmp_path, monkeypatch, capsys, builds):
    from lit_prunedpo.cli.cache import main

    monkeypatch.chdir(tmp_path)  # the shipped template is relative: runs/cache/ under the working directory
    args = ["--config", str(REPO / "configs/cached.yaml"), "--data.init_args.max_rows=64",
            f"--trainer.default_root_dir={tmp_path / 'run'}", *FAST]
    main(args)
    printed = re.search(r"^lit-prunedpo-cache: (\S+) built: 64 pairs.*; named by the run's fingerprint from "
                        r"runs/cache/ref-\{model\}-\{fingerprint\}\.safetensors$", capsys.readouterr().out, re.M)
    assert printed and NAME.fullmatch(os.path.basename(printed[1])) and len(builds) == 1
    fit = ["fit", *args, "--trainer.max_steps=1", "--trainer.limit_val_batches=0"]
    assert str(build_cli(fit).model.reference.cache_path) == printed[1] and len(builds) == 1  # reused
    other = build_cli([*fit, "--model.policy.init_args.seed=1"]).model.reference.cache_path  # another model
    assert str(other) != printed[1] and len(builds) == 2 and len(os.listdir(tmp_path / "runs/cache")) == 2
    with pytest.raises(ValueError, match=r"is stale.*reference\.weights"):  # a named file stays refused
        build_cli([*fit, "--model.policy.init_args.seed=1", f"--model.reference.init_args.path={printed[1]}"])
