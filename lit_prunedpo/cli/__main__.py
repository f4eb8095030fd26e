"""``python -m lit_prunedpo.cli`` is the ``lit-prunedpo`` command, as ``python -m lit_prunedpo`` is."""

from lit_prunedpo.cli import command

if __name__ == "__main__":
    command()
