"""Shared fixtures. Hubs are switched off before anything imports transformers or datasets."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the suite's tiny models step fastest on one thread, and tests run side by side; a user's run keeps torch's default
os.environ.setdefault("OMP_NUM_THREADS", "1")

import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# The lab (lab/lit_prunedpo_lab) is its own distribution, and `pip install -e ".[test]"` installs only the library:
# in a checkout the suite imports the lab from its folder, in this process and in every subprocess a test starts.
LAB = Path(__file__).resolve().parents[1] / "lab"
if importlib.util.find_spec("lit_prunedpo_lab") is None:
    sys.path.insert(0, str(LAB))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LAB), os.environ.get("PYTHONPATH")]))

import pytest  # noqa: E402

from helpers import TINY_LLAMA, make_batch  # noqa: E402
from lit_prunedpo.models import FromConfig  # noqa: E402


@pytest.fixture
def tiny_source() -> FromConfig:
    return FromConfig(model_type="llama", config=TINY_LLAMA, seed=0)


@pytest.fixture
def small_batch():
    return make_batch([3, 1, 4], [5, 2, 7], [4, 6, 1])


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: a ``mount -t tmpfs`` folder of ``size`` (``"256k"``), a real disk that fills; skipped where
    mounting is not permitted (not root, a container without CAP_SYS_ADMIN), where injected-ENOSPC tests cover the
    same paths; always unmounted."""
    import shutil
    import subprocess

    mounted = []

    def mount(size: str):
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no mount command: cannot make a small file system that fills")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip() or done.returncode})")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)
