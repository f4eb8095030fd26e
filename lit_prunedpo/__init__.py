"""lit_prunedpo: DPO with random pruning of the computation graph, on PyTorch Lightning."""

from lit_prunedpo.batch import PreferenceBatch, collate_pairs
from lit_prunedpo.module import PrunedDPO

__all__ = ["PreferenceBatch", "PrunedDPO", "collate_pairs"]
__version__ = "0.1.0"
