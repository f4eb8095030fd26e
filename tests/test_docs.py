"""The documentation: the MkDocs site builds with --strict, and the README stays a short front door.

The build is the check that no link, anchor or navigation entry in docs/ is broken (mkdocs.yml turns each into a
warning and --strict into a failure). The README is read as text: its length, the two quickstart commands that CI
and a newcomer run verbatim, and every relative link in it pointing at a file of the repository.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTART_COMMANDS = (
    "pip install -e . && lit-prunedpo fit --config configs/quickstart.yaml",
    'pip install -e ".[test]" && pytest',
)
MAX_README_LINES = 250
# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def test_docs_build_strict(tmp_path):
    # Not a skip: the `test` extra installs mkdocs-material, so a missing theme is a broken install, said as such.
    missing = [name for name in ("mkdocs", "material") if importlib.util.find_spec(name) is None]
    assert not missing, f"{', '.join(missing)} not installed: pip install -e \".[test]\" installs the docs build"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d",
         str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "time-to-quality" / "index.html").is_file()


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (f"README.md has {len(lines)} lines; at most {MAX_README_LINES} "
                                            "(move detail to docs/)")


def test_readme_keeps_the_quickstart_commands_verbatim():
    lines = README.read_text(encoding="utf-8").splitlines()
    for command in QUICKSTART_COMMANDS:
        assert command in lines, f"README.md lacks the line {command!r} (CI and the quickstart run it as written)"


def readme_relative_links(text: str) -> list[str]:
    """Relative link targets of a markdown text, without their #anchors (web and mail links left out)."""
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_readme_link_pattern_finds_links_and_images():
    text = 'See [a](docs/a.md#x), ![p](docs/p.png "t"), [w](https://x.org), [s](#top) and [m](mailto:a@b.c).'
    assert readme_relative_links(text) == ["docs/a.md", "docs/p.png"]


def test_readme_relative_links_resolve():
    targets = readme_relative_links(README.read_text(encoding="utf-8"))
    assert any(target.startswith("docs/") for target in targets), "README.md links into docs/"
    missing = sorted({target for target in targets if not (ROOT / target).exists()})
    assert not missing, f"README.md links to files that do not exist: {missing}"
