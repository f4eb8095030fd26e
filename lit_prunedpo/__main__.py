"""``python -m lit_prunedpo`` is the ``lit-prunedpo`` command."""

from lit_prunedpo.cli import command

if __name__ == "__main__":
    command()
