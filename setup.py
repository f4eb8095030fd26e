"""Which packages the wheel ships: found on disk, so that a new subpackage cannot be left out.

Everything else about the build is in pyproject.toml. This one setting cannot be there: its
``[tool.setuptools.packages.find]`` names each package after its folder, and two top-level folders ship
under another name, which a static ``packages`` list could do only by listing every package by hand
(the list once missed ``lit_prunedpo.reference`` and every command of the installed wheel failed).
``tests/test_packaging.py`` builds the wheel and checks that every file of those folders is in it.
"""

from setuptools import find_namespace_packages, setup

# Installed package name -> source folder. The design card puts callbacks/ at the top level; configs/ holds
# the YAML files (configs/losses, configs/modes: data only, no __init__.py) the CLI loads as its defaults.
PACKAGE_DIR = {
    "lit_prunedpo": "lit_prunedpo",
    "lit_prunedpo.callbacks": "callbacks",
    "lit_prunedpo.configs": "configs",
}


def _packages(name: str, folder: str) -> list[str]:
    """``name`` and every folder under ``folder`` as its subpackage (namespace folders too: configs/losses)."""
    found = find_namespace_packages(where=folder, exclude=["__pycache__", "*.__pycache__"])
    return [name, *(f"{name}.{sub}" for sub in found)]


setup(
    package_dir=PACKAGE_DIR,
    packages=sorted(package for name, folder in PACKAGE_DIR.items() for package in _packages(name, folder)),
)
