"""``python -m lit_prunedpo_lab`` is the ``lit-prunedpo-lab`` command."""

import sys

from lit_prunedpo_lab.console import lab

if __name__ == "__main__":
    sys.exit(lab())
