"""The pruning modes: each one defined once, as a shipped overlay ``configs/modes/<name>.yaml``.

A mode is the three samplers an overlay sets on ``PrunedDPO`` (``model.prefix_sampler``, ``position_sampler``,
``branch_sampler``); a sampler the overlay leaves out is the module's default, the unpruned one
(:func:`lit_prunedpo.step.plan.exact_samplers`). The benchmark, the study, the examples and the tests read the modes
here, so that a figure they report is a figure of the configuration a user runs with
``lit-prunedpo fit --config configs/quickstart.yaml --config configs/modes/<name>.yaml``.

The overlays are parsed with jsonargparse against the samplers' base classes, as the CLI parses them, and every
:func:`load_mode` call instantiates new sampler objects, so that two users of a mode never share one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional

import yaml
from jsonargparse import ArgumentParser, Namespace

from lit_prunedpo.step.plan import exact_samplers
from lit_prunedpo.samplers import BranchSampler, PositionSampler, PrefixSampler

__all__ = ["Mode", "SAMPLER_KEYS", "Samplers", "load_mode", "load_modes", "mode_names", "modes_dir", "samplers_of"]

Samplers = tuple[PrefixSampler, PositionSampler, BranchSampler]
SAMPLER_KEYS = ("prefix_sampler", "position_sampler", "branch_sampler")


@dataclass(frozen=True)
class Mode:
    """One pruning mode: its name, its overlay and the samplers that overlay sets (fresh objects).

    Attributes:
        name: the overlay's file name without ``.yaml``.
        path: the overlay.
        description: the overlay's comment below its command line, joined into one paragraph.
        prefix_sampler, position_sampler, branch_sampler: the samplers ``PrunedDPO`` gets from the overlay.
    """

    name: str
    path: Path
    description: str
    prefix_sampler: PrefixSampler
    position_sampler: PositionSampler
    branch_sampler: BranchSampler

    @property
    def samplers(self) -> Samplers:
        """``(prefix, position, branch)``, the order ``plan_step`` takes them in."""
        return self.prefix_sampler, self.position_sampler, self.branch_sampler

    def module_kwargs(self) -> dict[str, PrefixSampler | PositionSampler | BranchSampler]:
        """The samplers as ``PrunedDPO`` keyword arguments."""
        return dict(zip(SAMPLER_KEYS, self.samplers, strict=True))


def modes_dir() -> Path:
    """The shipped ``configs/modes/`` folder (package data of ``lit_prunedpo.configs``)."""
    return Path(str(resources.files("lit_prunedpo.configs").joinpath("modes")))


def mode_names() -> tuple[str, ...]:
    """The names of the shipped modes, sorted."""
    return tuple(sorted(p.stem for p in modes_dir().glob("*.yaml")))


def load_mode(name: str) -> Mode:
    """The shipped mode ``name``, with new sampler objects.

    Raises:
        ValueError: naming the shipped modes, for an unknown ``name``; naming the file and the key, for an overlay
            that sets anything but the three samplers or a sampler of the wrong kind.
    """
    path = modes_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown mode {name!r}: no {path}; the shipped modes are {', '.join(mode_names())}")
    parsed = _parse(path)
    parser = _parser()
    # jsonargparse 4.49 renamed instantiate_classes to instantiate; the package supports both
    built = (getattr(parser, "instantiate", None) or parser.instantiate_classes)(parsed.clone())
    exact = exact_samplers()
    prefix, position, branch = (built[k] if built[k] is not None else d for k, d in zip(SAMPLER_KEYS, exact))
    return Mode(name, path, _description(path), prefix, position, branch)


def load_modes() -> dict[str, Mode]:
    """Every shipped mode by name (sorted), each with new sampler objects."""
    return {name: load_mode(name) for name in mode_names()}


def samplers_of(name: str) -> Samplers:
    """The samplers of the shipped mode ``name``, new objects at every call."""
    return load_mode(name).samplers


@functools.cache
def _parser() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    for key, kind in zip(SAMPLER_KEYS, (PrefixSampler, PositionSampler, BranchSampler)):
        parser.add_argument(f"--{key}", type=Optional[kind], default=None)
    return parser


@functools.cache
def _parse(path: Path) -> Namespace:
    text = yaml.safe_load(path.read_text()) or {}
    model = text.get("model") if isinstance(text, dict) else None
    others = sorted(set(text) - {"model"}) if isinstance(text, dict) else ["(not a mapping)"]
    if not isinstance(model, dict) or others:
        raise ValueError(f"{path}: a mode overlay holds only model.{{{','.join(SAMPLER_KEYS)}}}; "
                         f"found top-level keys {sorted(text) if isinstance(text, dict) else text!r}")
    extra = sorted(set(model) - set(SAMPLER_KEYS))
    if extra:
        raise ValueError(f"{path}: a mode overlay sets only the samplers ({', '.join(SAMPLER_KEYS)}); "
                         f"found model.{', model.'.join(extra)}")
    try:
        return _parser().parse_object(model)
    except Exception as error:  # jsonargparse's ArgumentError: which key, which class, why
        raise ValueError(f"{path}: {error}") from error


def _description(path: Path) -> str:
    lines = path.read_text().splitlines()
    comment = []
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    return " ".join(c for c in comment if c)
