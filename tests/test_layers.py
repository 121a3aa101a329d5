"""The package's layers run one way (docs/DESIGN.md): the import contract in pyproject.toml."""

from __future__ import annotations

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
