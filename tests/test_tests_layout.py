"""The tests' own layout: no test module imports another; each program file is one a test runs.

What test modules share lies in helper modules (support.py, streams.py, traces.py, ...) and
conftest.py; the programs the tests run are files in tests/programs/, read by
``support.program(name)``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
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


#: What a test names when it depends on which hot path is under test (conftest.py).
HOT_PATH_NAMES = frozenset({"twin", "implementation", "twins", "twin_env", "native_under_test",
                            "ENV_TEST_NATIVE"})


def _is_skipif(decorator: ast.expr) -> bool:
    call = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(call, ast.Attribute) and call.attr == "skipif"


def _names_in(function: ast.FunctionDef) -> set[str]:
    """The names ``function`` reads or binds: variables, attributes, parameters (a
    ``skipif`` left out: a test that skips on one hot path does not depend on it)."""
    found: set[str] = set()
    parts = [function.args, *function.body,
             *(d for d in function.decorator_list if not _is_skipif(d))]
    for sub in (n for part in parts for n in ast.walk(part)):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.arg):
            found.add(sub.arg)
    return found


def _reads_the_hot_path() -> set[str]:
    """``module::test`` of every test that names the hot path under test, itself or through
    a fixture of its module's."""
    readers = set()
    for path in sorted(TESTS.glob("test_*.py")):
        functions = [node for node in ast.parse(path.read_text(), str(path)).body
                     if isinstance(node, ast.FunctionDef)]
        uses = {f.name: _names_in(f) for f in functions}
        reading = {name for name, names in uses.items() if names & HOT_PATH_NAMES}
        while True:  # fixtures that take a reading fixture read too
            more = {name for name, names in uses.items() if names & reading} - reading
            if not more:
                break
            reading |= more
        readers |= {f"{path.name}::{name}" for name in reading if name.startswith("test_")}
    return readers


def test_the_pure_python_pass_runs_exactly_the_tests_that_depend_on_the_hot_path():
    """CI's second pass (``CHAINER_AUTOPROF_TEST_NATIVE=0 ... -m hotpath``) selects every test
    that names the hot path under test, and no other: a new test on the twins is never left
    to the native pass alone, and the pass stays small."""
    ci = (TESTS.parent / ".ci" / "run").read_text()
    assert re.search(r"^CHAINER_AUTOPROF_TEST_NATIVE=0 \.venv/bin/python -m pytest -q -m hotpath$",
                     ci, re.M)
    env = {**os.environ, "CHAINER_AUTOPROF_TEST_NATIVE": "0"}
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "hotpath",
                          "-p", "no:cacheprovider", str(TESTS)], cwd=TESTS.parent, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    selected = {line.split("[")[0].removeprefix("tests/") for line in run.stdout.splitlines()
                if "::" in line}
    readers = _reads_the_hot_path()
    assert selected - readers == set(), "selected, yet never names the hot path"
    assert readers - selected == set(), "names the hot path: mark it @pytest.mark.hotpath"
