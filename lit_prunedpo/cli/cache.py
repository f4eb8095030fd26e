"""The ``lit-prunedpo-cache`` command: build a run's reference-logprob cache ahead of training.

It reads the same YAML (and the same overrides) as ``lit-prunedpo fit``, instantiates the model, data and
trainer through :func:`lit_prunedpo.cli.build_cli` without running anything, and builds the cache of
the config's :class:`~lit_prunedpo.reference.CachedReference` (``model.reference``) with the
trainer's device and precision. The following ``fit`` finds the file, checks its fingerprint and trains
without ever loading the reference model::

    lit-prunedpo-cache --config configs/cached.yaml
    lit-prunedpo fit --config configs/cached.yaml

The file is the one ``fit`` chooses: a path template (``runs/cache/ref-{model}-{fingerprint}.safetensors``, as the
shipped configs name it) or a folder is filled in from the run's fingerprint, so the command prints the same path
the following ``fit`` loads. A cache that is already up to date is left alone; a stale one is refused, naming the fields
that differ, unless ``--model.reference.init_args.recompute=true``. The build runs in this one process (one device);
multi-device builds happen inside ``fit``, sharded over its ranks. It logs its progress (every tenth of the pairs,
at most a line every 10 s) and holds one chunk of logits at a time, not a batch's
(:mod:`lit_prunedpo.reference.cached`).

A disk that fills while the cache is written ends the command with one line naming the file and saying so
(``lit-prunedpo-cache: reference cache PATH: disk full (ENOSPC: ...) while writing it ...``, exit status 1); nothing
half-written is left under the cache's name (see :mod:`lit_prunedpo.reference.store`).
"""

from __future__ import annotations

import sys
import time

from lit_prunedpo.cli import build_cli
from lit_prunedpo.reference import CachedReference, ReferenceRuntime
from lit_prunedpo.full_disk import DiskFull


def main(args: list[str] | None = None) -> None:
    """Entry point of ``lit-prunedpo-cache`` and ``python -m lit_prunedpo.cli.cache``.

    Args:
        args: the ``fit`` arguments without the subcommand (``--config X.yaml`` and overrides); default
            ``sys.argv[1:]``.

    Raises:
        SystemExit: the config's ``model.reference`` is not a ``CachedReference``, or the disk filled while the
            cache was written (the message names the file).
    """
    given = sys.argv[1:] if args is None else list(args)
    if given and given[0] == "fit":
        given = given[1:]  # accept `lit-prunedpo-cache fit --config ...` too
    cli = build_cli(given, run=False)
    reference = cli.model.reference
    if not isinstance(reference, CachedReference):
        raise SystemExit(
            f"lit-prunedpo-cache: the config's model.reference is {type(reference).__name__}, not "
            "lit_prunedpo.reference.CachedReference: there is no cache to build"
        )
    datamodule = cli.datamodule
    datamodule.prepare_data()
    datamodule.setup("fit")
    runtime = ReferenceRuntime.of(cli.trainer)
    start = time.perf_counter()
    try:
        reference.prepare(cli.model.policy, datamodule, runtime)
    except DiskFull as err:  # a user's problem with one cause: the message alone, no traceback
        raise SystemExit(f"lit-prunedpo-cache: {err}") from None
    store, path = reference.store, reference.cache_path  # a template's name is known once prepare hashed the run
    template, derived = reference.path_template(runtime.root_dir)
    named = f"; named by the run's fingerprint from {template}" if derived else ""
    action = "built" if reference.builds else "up to date, reused"
    # a file written before the log-sum-exps were cached serves every sampler but ReferenceLogSumExp: say so here
    old = "" if store.lse is not None else (
        "; it holds no log-sum-exps (written before they were cached): ReferenceLogSumExp needs it rebuilt, "
        "--model.reference.init_args.recompute=true")
    print(
        f"lit-prunedpo-cache: {path} {action}: {store.num_rows} pairs, {store.num_tokens} response tokens, "
        f"{path.stat().st_size} bytes, {time.perf_counter() - start:.1f}s{named}{old}"
    )


if __name__ == "__main__":
    main()
