"""Modules that moved into the room folders (``docs/house.md``) or took a name with one meaning: their old import
FutureWarning naming the new one, until the release after 0.1.0.

Only the public modules (``public_api.PUBLIC_MODULES``) are kept here, the others were never promised, and the
console scripts' module, which an install made before the move still names. The old name
is the new module itself (``sys.modules`` maps both to one object), so a class imported either way is the same class
and ``isinstance`` agrees.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module name -> new module name
MOVED: dict[str, str] = {
    "lit_prunedpo.plan": "lit_prunedpo.step.plan",
    "lit_prunedpo.execute": "lit_prunedpo.step.execute",
    "lit_prunedpo.estimate": "lit_prunedpo.step.estimate",
    "lit_prunedpo.step_io": "lit_prunedpo.step.io",
    # one meaning per word: "stats" had two (this module's intervals and the data's length statistics)
    "lit_prunedpo.stats": "lit_prunedpo.intervals",
    # not public, but the console scripts of an install made before the move import it: they keep working (with
    # the warning) until the package is installed again
    "lit_prunedpo.console": "lit_prunedpo.cli.console",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module name with the new module, once, warning."""

    def find_spec(self, name: str, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} is now {new}; import from there (the old name goes in the release after 0.1.0)",
                      FutureWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the old name's spec carries the new one to exec_module
        return module

    def exec_module(self, module) -> None:
        # the new module ran when it was imported; the import system has just given it the old name's spec, which
        # it always overwrites: give back its own, so that the module still knows where it lives
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Put the finder last on the meta path, once (the files are gone, so no other finder answers these names)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
