"""The wheel's packages: found on disk, with the top-level callbacks/ and configs/ shipped inside the package.

Everything else about the build is in pyproject.toml. The packages are found here, not by
``[tool.setuptools.packages.find]``, which names each package after its folder; a hand-written list once missed
``lit_prunedpo.reference`` and every command of the installed wheel failed (``tests/test_packaging.py`` checks that
every file of these folders is in the wheel). Why the two folders sit outside the package, and how a source
checkout imports them: docs/architecture.md, "Packaging: callbacks/ and configs/".
"""

from setuptools import find_namespace_packages, setup

# Installed package name -> source folder (configs/losses, configs/modes: YAML only, no __init__.py).
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
