"""The public API of lit_prunedpo: which modules' ``__all__`` names users and extension authors may rely on.

The public API is the names listed in the ``__all__`` of each module in :data:`PUBLIC_MODULES`, and those modules
themselves (``import lit_prunedpo.step.plan``). A module is public only if it has an explicit ``__all__``; any other
module, and any name a public module does not list, is the library's own business and may change.

The rule: the laboratory (:data:`LAB`: ``lit_prunedpo_lab.study``, the time-to-quality studies, and
``lit_prunedpo_lab.bench``, the benchmarks; its own distribution, ``lab/``) is a client of the library like any
user's code, the way torchtune's recipes are clients of its library: a lab module imports, from outside the lab,
only public modules and the names in their ``__all__``. What a study or a benchmark measures is then what a user
can build. ``tests/test_lab_boundary.py`` checks it; a name the lab needs is made public (listed in its module's
``__all__``, or exported by its package) rather than reached for inside a private module.

This module imports nothing: it is a table, read by the test and by anyone who asks what is public.
"""

__all__ = ["LAB", "PUBLIC_MODULES"]

#: the modules whose ``__all__`` is the public API (docs/*.md and examples/*.py import from these)
PUBLIC_MODULES: tuple[str, ...] = (
    "lit_prunedpo",  # PrunedDPO, PreferenceBatch, collate_pairs
    # the plug-ins a config chooses by class_path, and their seams
    "lit_prunedpo.samplers",
    "lit_prunedpo.losses",
    "lit_prunedpo.reference",
    "lit_prunedpo.models",
    "lit_prunedpo.data",
    "lit_prunedpo.callbacks",
    "lit_prunedpo.layout",
    "lit_prunedpo.scoring",
    "lit_prunedpo.chunked_scorer",
    "lit_prunedpo.optim",
    "lit_prunedpo.compiling",  # torch.compile of the model bodies (callbacks.CompileModel's, the bench's --compile)
    "lit_prunedpo.lora",
    "lit_prunedpo.distributed",
    "lit_prunedpo.checkpoint",
    # the pruning modes (configs/modes/*.yaml) as sampler objects
    "lit_prunedpo.modes",
    # one training step, stage by stage: its batch, plan, execute, estimate, and its typed input and output
    "lit_prunedpo.batch",
    "lit_prunedpo.step",  # the step package: its typed ends, StepParts and StepOutput
    "lit_prunedpo.step.plan",
    "lit_prunedpo.step.execute",
    "lit_prunedpo.step.estimate",
    "lit_prunedpo.step.io",
    "lit_prunedpo.rng",
    # measuring: gradient noise of a pruned step, the samplers' unbiasedness checks, small statistics
    "lit_prunedpo.gradient_noise",
    "lit_prunedpo.testing",
    "lit_prunedpo.intervals",
    "lit_prunedpo.cpu_16bit",  # whether a 16-bit precision runs fast on this CPU (set-up's warning, the bench's)
    # a full disk's errors, named as such
    "lit_prunedpo.full_disk",
    # the one runner of every command (Ctrl-C, SIGTERM, a full disk, errors in one line): the lab's commands use it
    "lit_prunedpo.cli.user_errors",
)

#: the lab's packages (``lab/``, its own distribution) -> the lab packages each may import besides itself, the
#: innermost first (the study prices its arms with the bench's cost model, ``lit_prunedpo_lab.bench.cost``; the bench
#: uses nothing of the study; the lab's command, ``lit_prunedpo_lab.console``, runs both)
LAB: dict[str, tuple[str, ...]] = {
    "lit_prunedpo_lab.study": ("lit_prunedpo_lab.bench",),
    "lit_prunedpo_lab.bench": (),
    "lit_prunedpo_lab": ("lit_prunedpo_lab.study", "lit_prunedpo_lab.bench"),
}
