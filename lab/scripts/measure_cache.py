"""Measure the cached per-token reference: size on disk, build time, and step time against the online reference.

Two setups:

* ``quickstart``: configs/quickstart.yaml's tiny Llama and data (the generated task, 4,096 pairs, ByT5 bytes);
* ``hh``: HH-RLHF lengths: the shared harmless-base test file (2,312 pairs), the real GPT-2 tokenizer,
  ``max_length`` 512, and a *tiny random GPT-2-shaped* model (50,257-token vocabulary; sizes set by
  ``--hh-embd``/``--hh-layers``), since nothing can be downloaded here. Its step-time ratio is therefore
  that of a small body with a large vocabulary head, not GPT-2 small's.

For each setup it builds the cache once (timed), saves it (size on disk, per million response tokens),
then times training steps (plan, policy forwards, reference, IPW estimate, backward, AdamW step) for the
``vanilla`` and ``branch`` samplers with the online reference (A, a frozen copy of the initial policy) and
the cached one (B), alternated A B A B on the same batches and draws in one process; the median of
``--steps`` steps after ``--warmup`` warm-up steps each. Run from the repository root::

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python lab/scripts/measure_cache.py

Prints the figures; nothing is written outside a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
import yaml  # noqa: E402

from lit_prunedpo import PrunedDPO  # noqa: E402
from lit_prunedpo.data import PreferenceDataModule  # noqa: E402
from lit_prunedpo.models import FromConfig  # noqa: E402
from lit_prunedpo.modes import load_mode  # noqa: E402
from lit_prunedpo.step.plan import plan_step  # noqa: E402
from lit_prunedpo.reference import (  # noqa: E402
    CachedReference,
    ReferenceLogpStore,
    compute_reference_logps,
)

SHARED = Path(__file__).resolve().parents[3] / "shared"
# the quickstart's model, read from its config so that the two cannot drift apart
QUICKSTART_POLICY = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/quickstart.yaml").read_text())[
    "model"]["policy"]["init_args"]
MODES = ("vanilla", "branch")  # shipped overlays, configs/modes/<name>.yaml


def quickstart_setup(args):
    # configs/quickstart.yaml's data: the generated task through the text pipeline, ByT5 bytes
    dm = PreferenceDataModule(tokenizer="byt5", max_length=64, max_prompt_length=24, batch_size=16)
    dm.setup("fit")
    return FromConfig(**QUICKSTART_POLICY), dm, 16


def hh_setup(args):
    dm = PreferenceDataModule(
        str(SHARED / "data/hh-rlhf/harmless-base-test.jsonl.gz"), tokenizer=str(SHARED / "tokenizers/gpt2"),
        max_length=512, max_prompt_length=256, batch_size=args.hh_batch_size,
    )
    dm.setup("fit")
    config = dict(vocab_size=50257, n_embd=args.hh_embd, n_layer=args.hh_layers, n_head=max(1, args.hh_embd // 64),
                  n_positions=1024)
    return FromConfig(model_type="gpt2", config=config, seed=0), dm, args.hh_batch_size


def timed_step(module, optimizer, batch, seed):
    """One training step of ``module`` on ``batch`` with draws from ``seed``; returns seconds."""
    start = time.perf_counter()
    plan = plan_step(batch, module.prefix_sampler, module.position_sampler, module.branch_sampler,
                     torch.Generator().manual_seed(seed))  # the same draws for A and B
    est = module.execute_and_estimate(batch, plan)
    est.objective.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def measure(name, source, dm, batch_size, args):
    torch.manual_seed(0)
    model = source.build()
    start = time.perf_counter()
    store = compute_reference_logps(model, dm.reference_batches(batch_size))
    build_s = time.perf_counter() - start
    del model
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ref.safetensors"
        store.save(path)
        size = path.stat().st_size
        store = ReferenceLogpStore.load(path)
    print(f"[{name}] cache: {store.num_rows} pairs, {store.num_tokens} response tokens, {size} bytes on disk "
          f"= {size / store.num_tokens:.3f} MB per million tokens; build {build_s:.2f} s "
          f"({store.num_tokens / build_s:.0f} tokens/s, one no-grad pass, CPU, {torch.get_num_threads()} threads)")

    loader = iter(dm.train_dataloader())
    batches = [next(loader) for _ in range(args.warmup + args.steps)]
    for sampler_name in MODES:
        modules = {
            "online": PrunedDPO(policy=source, **load_mode(sampler_name).module_kwargs()),
            "cached": PrunedDPO(policy=source, reference=CachedReference.from_store(store),
                                **load_mode(sampler_name).module_kwargs()),
        }
        optimizers = {k: torch.optim.AdamW(m.policy.parameters(), lr=1e-6) for k, m in modules.items()}
        times = {k: [] for k in modules}
        for i, batch in enumerate(batches):
            for key in ("online", "cached"):  # A B A B: same batch, same draws
                t = timed_step(modules[key], optimizers[key], batch, seed=i)
                if i >= args.warmup:
                    times[key].append(t)
        online, cached = statistics.median(times["online"]), statistics.median(times["cached"])
        print(f"[{name}] {sampler_name:7s}: median step online {online * 1e3:.1f} ms, cached {cached * 1e3:.1f} ms, "
              f"cached/online = {cached / online:.3f} ({args.steps} steps after {args.warmup} warm-up)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", nargs="+", default=["quickstart", "hh"], choices=["quickstart", "hh"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--hh-embd", type=int, default=64)
    parser.add_argument("--hh-layers", type=int, default=2)
    parser.add_argument("--hh-batch-size", type=int, default=8)
    args = parser.parse_args()
    for name in args.setups:
        source, dm, batch_size = (quickstart_setup if name == "quickstart" else hh_setup)(args)
        measure(name, source, dm, batch_size, args)


if __name__ == "__main__":
    main()
