"""``torch.compile`` for a step's model bodies: what is compiled, with which options, and how many graphs it made.

What is compiled is each causal LM's **body** (:func:`~lit_prunedpo.scoring.split_causal_lm`: the decoder stack the
layout feeds), the policy's and an online reference's frozen model, in place (``nn.Module.compile``): every path that
calls the body (training steps, validation, the conformance probe) runs the compiled one, and the state dict keeps
its keys (no ``_orig_mod.`` prefix), so checkpoints, exports and resumes are those of an eager run. What stays eager:
the plan (the samplers' draws), the gathers of scored positions, the LM head on those rows and the estimate. Their
shapes are drawn anew every step and they hold the step's data-dependent control flow; the body holds the FLOPs.

Bounded recompilation. The packed layout's width changes every step (it is the batch's longest kept sequence), and
pruning changes the number of rows. With ``dynamic=True`` (the default) dynamo traces the body once with symbolic
sizes instead of once per shape; a few graphs more come from genuinely different calls (a gradient forward, a no-grad
forward, one reading the prompt cache of the forward before it, the probe's). ``recompile_limit`` caps the graphs
kept per code object (``torch._dynamo.config.recompile_limit``): past it dynamo runs that frame eagerly, with a
warning, instead of compiling again. :func:`graphs_compiled` counts graphs so that a caller can report how many were
made after the first step (:class:`lit_prunedpo.callbacks.CompileModel` logs it; the bench's ``--compile`` reports
it per mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from lit_prunedpo.scoring import split_causal_lm

__all__ = ["CompileOptions", "compile_bodies", "graphs_compiled"]


@dataclass(frozen=True)
class CompileOptions:
    """The arguments of ``torch.compile`` for the bodies, and the cap on graphs per code object.

    Attributes:
        backend: ``torch.compile``'s backend (``inductor``; ``aot_eager`` traces without generating kernels).
        mode: ``None``, ``default``, ``reduce-overhead``, ``max-autotune`` or ``max-autotune-no-cudagraphs``.
        dynamic: trace with symbolic sizes (``True``, the default: the packed width changes every step), or per
            shape (``False``), or let dynamo decide after a second shape (``None``).
        fullgraph: refuse graph breaks inside the body instead of running around them.
        recompile_limit: graphs kept per code object before dynamo runs it eagerly.

    Raises:
        ValueError: for a ``mode`` torch does not take, or a ``recompile_limit`` below 1.
    """

    backend: str = "inductor"
    mode: str | None = None
    dynamic: bool | None = True
    fullgraph: bool = False
    recompile_limit: int = 8

    def __post_init__(self) -> None:
        modes = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        if self.mode not in modes:
            raise ValueError(f"compile mode: one of {', '.join(map(str, modes))}, got {self.mode!r}")
        if not (isinstance(self.recompile_limit, int) and self.recompile_limit >= 1):
            raise ValueError(f"compile recompile_limit: an integer >= 1, got {self.recompile_limit!r}")

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.compile``."""
        return {"backend": self.backend, "mode": self.mode, "dynamic": self.dynamic, "fullgraph": self.fullgraph}


def compile_bodies(models: list[nn.Module], options: CompileOptions,
                   before: Callable[[], Any] | None = None) -> list[nn.Module]:
    """Compile the body of each causal LM of ``models`` in place (a body compiled already is left as it is) and set
    dynamo's recompile limit; returns the bodies compiled now. ``before`` is called first: a module's
    ``resolved_layout`` (the conformance probe's forwards, run once, then run eagerly instead of each compiling a graph
    of its own that no step would use again).

    Raises:
        ValueError: for a model that is not a ``transformers`` causal LM with a separable body and head.
    """
    if before is not None:
        before()
    torch._dynamo.config.recompile_limit = options.recompile_limit
    compiled = []
    for model in models:
        body, _ = split_causal_lm(model)
        if getattr(body, "_compiled_call_impl", None) is None:
            body.compile(**options.kwargs())
            compiled.append(body)
    return compiled


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (every backend, every compiled code)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
