"""The house's limits (docs/house.md): no module of the package over 400 lines, no function over 60, and no issue
numbers in its code; a module or function that grows past them is split by meaning, not by a higher limit here."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from helpers import REPO

MODULE_LINES, FUNCTION_LINES = 400, 60
SOURCES = sorted([*(REPO / "lit_prunedpo").rglob("*.py"), *(REPO / "callbacks").rglob("*.py"),
                  *(REPO / "lab" / "lit_prunedpo_lab").rglob("*.py")])
#: where issue numbers are looked for: the package and everything around it that is code
CODE = sorted({*SOURCES, *(REPO / "tests").rglob("*.py"), *(REPO / "examples").rglob("*.py"),
               *(REPO / "configs").rglob("*.yaml"), *(REPO / "lab" / "scripts").iterdir()})


def test_the_sources_are_found():
    assert len(SOURCES) > 100 and REPO / "lit_prunedpo" / "module.py" in SOURCES


def test_no_module_is_over_the_limit():
    long = {str(p.relative_to(REPO)): n for p in SOURCES if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines (split them by meaning): {long}"


def long_functions(source: str) -> dict[str, int]:
    """``{name: lines}`` of every function (methods and nested ones too) longer than the limit, decorators excluded."""
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LINES}


def test_the_function_check_counts_lines():
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == {"f": FUNCTION_LINES + 1}
    assert long_functions(f"def f():\n{body[:-len(f'    x{FUNCTION_LINES - 1} = {FUNCTION_LINES - 1}') - 1]}\n") == {}


def test_no_function_is_over_the_limit():
    long = {f"{p.relative_to(REPO)}:{name}": n for p in SOURCES for name, n in long_functions(p.read_text()).items()}
    assert not long, f"functions over {FUNCTION_LINES} lines (split them into named steps): {long}"


def test_the_code_names_no_issue_numbers():
    # the code says what it does and why; which issue asked for it belongs to the history (git log, CHANGELOG.md)
    pattern = re.compile(r"\bissues? #?\d+|\(#\d+\)", re.IGNORECASE)
    found = [f"{p.relative_to(REPO)}:{i}" for p in CODE if p.is_file()
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"issue numbers in the code: {found}"


def test_no_line_is_over_the_limit():
    """ruff reads the limit from pyproject.toml ([tool.ruff] line-length): a wider line is re-wrapped, not allowed."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "E501", "--no-cache", str(REPO)],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"lines over the limit:\n{result.stdout}{result.stderr}"
