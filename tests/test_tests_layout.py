"""The tests' own layout: no test module imports another; each program file is one a test runs.

What test modules share lies in helper modules (support.py, streams.py, traces.py, ...) and
conftest.py; the programs the tests run are files in tests/programs/, read by
``support.program(name)``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support import INCLUDE, PROGRAMS

TESTS = Path(__file__).resolve().parent


def _test_sources() -> list[Path]:
    """The Python files of the test suite, its programs left out."""
    return [path for path in sorted(TESTS.rglob("*.py")) if PROGRAMS not in path.parents]


def test_no_test_module_imports_another():
    found = []
    for path in _test_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                imported = [node.module or ""]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{path.relative_to(TESTS)}:{node.lineno}: {name}" for name in imported
                      if name.split(".")[0].startswith("test_")]
    assert found == []


def test_every_program_file_is_run_by_a_test():
    named: set[str] = set()
    for path in _test_sources():
        named |= set(re.findall(r'\bprogram\(\s*"([^"]+)"\s*\)', path.read_text()))
    for path in PROGRAMS.iterdir():  # a program's shared part, included by others
        named |= set(INCLUDE.findall(path.read_text()))
    files = {path.stem if path.suffix == ".py" else path.name for path in PROGRAMS.iterdir()
             if path.is_file()}
    assert named - files == set(), "named but missing"
    assert files - named == set(), "files no test runs"
