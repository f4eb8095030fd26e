"""Every checkpoint test that builds data writes its datasets cache into a folder of its own."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path_factory, monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets_cache"))
