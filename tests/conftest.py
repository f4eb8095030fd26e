"""Shared fixtures. Hubs are switched off before anything imports transformers or datasets."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from helpers import TINY_LLAMA, make_batch  # noqa: E402
from lit_prunedpo.models import FromConfig  # noqa: E402


@pytest.fixture
def tiny_source() -> FromConfig:
    return FromConfig(model_type="llama", config=TINY_LLAMA, seed=0)


@pytest.fixture
def small_batch():
    return make_batch([3, 1, 4], [5, 2, 7], [4, 6, 1])
