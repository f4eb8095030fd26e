"""A hub that does not answer is said at once, naming the name and what to do (lit_prunedpo.hub)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from lit_prunedpo import hub


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE off as huggingface_hub reads it (the test conftest sets it for the whole process)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_unreachable_hub_without_a_cached_copy_fails_naming_name_argument_and_remedy(
    online: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=hub.PROBE_TIMEOUT_S: "ConnectError: no route")
    with pytest.raises(hub.HubUnreachable, match=r"^'gpt2' \(data.init_args.tokenizer\) is not a local path, so it is "
                                                 r"a Hugging Face Hub name, but the hub \(.*\) does not answer "
                                                 r"\(ConnectError: no route\) and the local cache \(.*\) does not hold "
                                                 r"it: give a local path .* or set HF_HUB_OFFLINE=1 with a cache"):
        hub.hub_or_cache("gpt2", "data.init_args.tokenizer", cached=lambda: False)


def test_unreachable_hub_with_a_cached_copy_reads_the_cache(online: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=hub.PROBE_TIMEOUT_S: "ConnectError: no route")
    assert hub.hub_or_cache("gpt2", "data.init_args.tokenizer", cached=lambda: True) is True


def test_reachable_hub_loads_from_it(online: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=hub.PROBE_TIMEOUT_S: None)
    assert hub.hub_or_cache("gpt2", "data.init_args.tokenizer", cached=lambda: pytest.fail("not asked")) is False


def test_offline_mode_probes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=hub.PROBE_TIMEOUT_S: pytest.fail("probed while offline"))
    assert hub.hub_or_cache("gpt2", "data.init_args.tokenizer", cached=lambda: False) is True
    assert "HF_HUB_OFFLINE=1 is set, so 'gpt2' was looked up only in the local cache" in hub.offline_hint("gpt2")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert hub.offline_hint("gpt2") == ""


def test_probe_reports_a_refused_connection(online: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    assert "ConnectError" in hub.probe_hub(timeout=2.0)


def test_in_hub_cache_looks_for_the_repository_snapshots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert not hub.in_hub_cache("org/data", "dataset")
    (tmp_path / "datasets--org--data" / "snapshots").mkdir(parents=True)
    assert hub.in_hub_cache("org/data", "dataset") and not hub.in_hub_cache("org/data", "model")


def test_hub_names_fail_in_seconds_when_the_hub_does_not_answer(tmp_path: Path) -> None:
    """The real loaders (tokenizer, data, model) with HF_HUB_OFFLINE unset and an endpoint nothing answers: without the
    probe, transformers and datasets retry for 47 s and 23 s. The bound is about correctness (no retries), not speed."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    script = """
import time
from lit_prunedpo.data.sources import load_split
from lit_prunedpo.data.tokenize import load_tokenizer
from lit_prunedpo.models import Pretrained
for load in (lambda: load_tokenizer("gpt2"), lambda: load_split("Anthropic/hh-rlhf", "test"),
             lambda: Pretrained("gpt2").build()):
    start = time.monotonic()
    try:
        load()
    except Exception as err:
        print(f"{time.monotonic() - start:.1f}", type(err).__name__, err)
"""
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout + done.stderr
    arguments = ("data.init_args.tokenizer", "data.init_args.path", "model.policy.init_args.name_or_path")
    for line, name, argument in zip(lines, ("gpt2", "Anthropic/hh-rlhf", "gpt2"), arguments):
        seconds, kind, message = line.split(" ", 2)
        assert kind == "HubUnreachable" and float(seconds) < 20, line
        assert message.startswith(f"'{name}' ({argument}) is not a local path, so it is a Hugging Face "
                                  "Hub name, but the hub (http://127.0.0.1:9) does not answer (ConnectError"), line
        assert "set HF_HUB_OFFLINE=1 with a cache that holds it" in message


@pytest.mark.parametrize(
    ("name", "path"),
    [("gpt2", False), ("openai-community/gpt2", False), ("Qwen/Qwen2.5-0.5B", False), ("base", False),
     ("/models/base", True), ("./base", True), ("../base", True), ("~/base", True), ("runs/lora/base", True)],
)
def test_names_that_can_only_be_local_paths(name: str, path: bool) -> None:
    # a hub name is "name" or "owner/name", each starting with a letter, digit or "_": a gone folder written as
    # a path must be said to be gone, not looked up on the hub
    assert hub.written_as_path(name) is path
