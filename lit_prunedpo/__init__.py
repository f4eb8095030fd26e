"""lit_prunedpo: DPO with random pruning of the computation graph, on PyTorch Lightning.

The names below are imported on first use (PEP 562 ``__getattr__``): ``import lit_prunedpo``, which every command
does first, imports neither torch nor lightning, so ``lit-prunedpo --help`` answers at once
(``tests/test_startup.py``). ``from lit_prunedpo import PrunedDPO`` works as ever.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and readers; at run time __getattr__ imports them
    from lit_prunedpo.batch import PreferenceBatch, collate_pairs
    from lit_prunedpo.module import PrunedDPO

__all__ = ["PreferenceBatch", "PrunedDPO", "collate_pairs"]
__version__ = "0.1.0"

#: public name -> the module that defines it
_LAZY = {"PreferenceBatch": "lit_prunedpo.batch", "collate_pairs": "lit_prunedpo.batch",
         "PrunedDPO": "lit_prunedpo.module"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
