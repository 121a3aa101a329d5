"""The package's layers run one way (docs/DESIGN.md): the import contract in pyproject.toml."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(),
                                reason="import-linter is installed with the test extra on "
                                       "Python 3.11 and newer")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` over the package found in ``root``, with the project's contract."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config",
                           str(REPO / "pyproject.toml")],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": ""},
                          capture_output=True, text=True, timeout=120)


def test_every_import_runs_down_the_layers():
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout


def test_an_arrow_back_up_fails_even_inside_a_function(tmp_path):
    """The recorder (measuring) reaching into the summary (reporting) breaks the build."""
    shutil.copytree(REPO / "chainer_autoprof", tmp_path / "chainer_autoprof",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    recorder = tmp_path / "chainer_autoprof" / "sinks" / "recorder.py"
    recorder.write_text(recorder.read_text() + "\n\ndef _later():\n"
                        "    from ..report import summary  # noqa: F401\n")
    run = lint_imports(tmp_path)
    assert run.returncode == 1
    assert "chainer_autoprof.sinks is not allowed to import chainer_autoprof.report" in run.stdout


def test_a_module_outside_every_layer_fails(tmp_path):
    """A new top-level module must be placed in a layer (the contract is exhaustive)."""
    shutil.copytree(REPO / "chainer_autoprof", tmp_path / "chainer_autoprof",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (tmp_path / "chainer_autoprof" / "stray.py").write_text('"""Not in any layer."""\n')
    run = lint_imports(tmp_path)
    assert run.returncode == 1
    assert "stray" in run.stdout


#: The package's import cycles, module by module, each import counted wherever it stands (at
#: the top, inside a function, under ``if TYPE_CHECKING``): printed as JSON, one list of the
#: modules of each cycle.
_CYCLES = r"""
import json, sys
import grimp

graph = grimp.build_graph("chainer_autoprof", cache_dir=None)
index, low, on_stack, stack, cycles = {}, {}, set(), [], []
for root in sorted(graph.modules):
    if root in index:
        continue
    work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
        module, edges = work[-1]
        for other in edges:
            if other not in index:
                index[other] = low[other] = len(index)
                stack.append(other)
                on_stack.add(other)
                work.append((other, iter(sorted(graph.find_modules_directly_imported_by(other)))))
                break
            if other in on_stack:
                low[module] = min(low[module], index[other])
        else:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                members = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    members.append(top)
                    if top == module:
                        break
                if len(members) > 1:
                    cycles.append(sorted(members))
json.dump(sorted(cycles), sys.stdout)
"""


def import_cycles(root: Path) -> list[list[str]]:
    """The import cycles of the package found in ``root`` (each a sorted list of modules)."""
    run = subprocess.run([sys.executable, "-c", _CYCLES], cwd=root,
                         env={"PYTHONPATH": str(root), "PATH": ""},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_no_import_cycle_even_through_a_function_local_import():
    """Modules import each other one way only, also where an import is put off into a
    function (a cycle there is one all the same: it only fails later, or in another order)."""
    assert import_cycles(REPO) == []


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    shutil.copytree(REPO / "chainer_autoprof", tmp_path / "chainer_autoprof",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    paths = tmp_path / "chainer_autoprof" / "common" / "paths.py"
    paths.write_text(paths.read_text() + "\n\ndef _later():\n"
                     "    from . import settings  # noqa: F401\n")
    cycles = import_cycles(tmp_path)
    assert len(cycles) == 1
    assert {"chainer_autoprof.common.paths", "chainer_autoprof.common.settings"} <= set(cycles[0])
