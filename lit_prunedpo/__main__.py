"""``python -m lit_prunedpo`` is the ``lit-prunedpo`` command."""

from lit_prunedpo.cli import main

if __name__ == "__main__":
    main()
