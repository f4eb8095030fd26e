"""lit_prunedpo: DPO with random pruning of the computation graph, on PyTorch Lightning.

The names below are imported on first use (PEP 562 ``__getattr__``): ``import lit_prunedpo``, which every command
does first, imports neither torch nor lightning, so ``lit-prunedpo --help`` answers at once
(``tests/test_startup.py``). ``from lit_prunedpo import PrunedDPO`` works as ever.

Run from a source checkout, it maps ``lit_prunedpo.callbacks`` and ``lit_prunedpo.configs`` to the repository's
top-level ``callbacks/`` and ``configs/`` (:class:`_SourceCheckoutFinder`; docs/architecture.md, "Packaging"). The
modules that moved into the room folders keep their old names for a release (:mod:`lit_prunedpo.moved`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from typing import TYPE_CHECKING, Any

from lit_prunedpo import moved as _moved

if TYPE_CHECKING:  # for type checkers and readers; at run time __getattr__ imports them
    from lit_prunedpo.batch import PreferenceBatch, collate_pairs
    from lit_prunedpo.module import PrunedDPO

__all__ = ["PreferenceBatch", "PrunedDPO", "collate_pairs"]
__version__ = "0.1.0"

#: public name -> the module that defines it
_LAZY = {"PreferenceBatch": "lit_prunedpo.batch", "collate_pairs": "lit_prunedpo.batch",
         "PrunedDPO": "lit_prunedpo.module"}


#: the subpackages whose source is a top-level folder of the repository, beside this one
_TOP_LEVEL_FOLDERS = ("callbacks", "configs")


class _SourceCheckoutFinder:
    """Finds ``lit_prunedpo.callbacks`` and ``lit_prunedpo.configs`` in the checkout's top-level folders.

    The one place that maps them when the package runs from its source; the wheel has them inside the package.
    How and why: docs/architecture.md, "Packaging: callbacks/ and configs/".
    """

    def __init__(self, repo: str):
        self.repo = repo

    def find_spec(self, name: str, path=None, target=None):
        package, _, leaf = name.rpartition(".")
        if package != __name__ or leaf not in _TOP_LEVEL_FOLDERS:
            return None
        return importlib.machinery.PathFinder.find_spec(name, [self.repo])  # looks for <repo>/<leaf>


def _map_top_level_folders() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    repo = os.path.dirname(here)
    built = os.path.isdir(os.path.join(here, "callbacks"))  # an installed wheel: the folders are in the package
    if not built and os.path.isfile(os.path.join(repo, "callbacks", "__init__.py")):
        # first on the meta path: an editable install of another checkout must not lend this one its folders
        sys.meta_path.insert(0, _SourceCheckoutFinder(repo))


_map_top_level_folders()
_moved.install()


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
