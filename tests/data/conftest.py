"""Fixtures for the data tests: the shared data beside the checkout and an isolated datasets cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Nothing here may reach a hub; set before datasets/transformers read them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def shared_dir() -> Path:
    """``shared/`` beside the repository root (``<root>/../shared``), as in every checkout and CI clone."""
    return Path(__file__).resolve().parents[3] / "shared"


def _shared_file(*parts: str) -> Path:
    path = shared_dir().joinpath(*parts)
    if not path.exists():
        pytest.fail(f"{path} is missing: the tests expect the shared/ folder beside the checkout")
    return path


@pytest.fixture
def hh_rlhf_path() -> Path:
    """The real HH-RLHF harmless-base test split (2,312 implicit-prompt pairs)."""
    return _shared_file("data", "hh-rlhf", "harmless-base-test.jsonl.gz")


@pytest.fixture
def gpt2_path() -> Path:
    """The real GPT-2 tokenizer files."""
    return _shared_file("tokenizers", "gpt2")


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test's Arrow caches out of ~/.cache, and apart from other tests."""
    import datasets.config

    cache = tmp_path_factory.mktemp("hf_datasets_cache")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache
