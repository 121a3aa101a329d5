"""Processes that never trained print nothing; a second install() with other settings says so.

With a ``CHAINER_PROF_*`` variable exported in the shell, the agent starts in
every Python process (the ``.pth`` line): ``python -c 'import json'`` and a
script that imports Chainer without calling anything instrumented must print
nothing and write no trace (a trace of such a process would replace the
training's trace of the same name).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import program, run_python, write_script


@pytest.mark.parametrize("code", ["import json", "import chainer",
                                  "import chainer, numpy; chainer.Variable(numpy.ones(2))"])
def test_a_process_that_never_trained_prints_nothing(tmp_path: Path, code: str):
    (tmp_path / "run.json").write_text("the training's trace\n")
    run = run_python(tmp_path, ["-c", code], env={"CHAINER_PROF_SYNC": "1",
                                                  "CHAINER_PROF_TRACE": "run.json"})
    assert run.returncode == 0, run.stderr
    assert (run.stdout, run.stderr) == ("", "")
    assert (tmp_path / "run.json").read_text() == "the training's trace\n"


def test_a_process_that_trained_still_reports(tmp_path: Path):
    code = ("import chainer, numpy, chainer.links as L; "
            "L.Linear(2, 2)(numpy.ones((1, 2), numpy.float32))")
    run = run_python(tmp_path, ["-c", code], env={"CHAINER_PROF_ENABLE": "1"})
    assert run.returncode == 0, run.stderr
    assert "chainer_autoprof summary" in run.stderr  # an inference pass was recorded


SECOND_INSTALL = program("quiet_second_install")


def test_a_second_install_with_other_settings_warns_once(tmp_path: Path):
    script = write_script(tmp_path, "second.py", SECOND_INSTALL)
    run = run_python(tmp_path, [str(script)], nvtx=False)  # no variable: no start-up agent
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["True", "True", "True", "1 link"]
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert "already installed" in lines[0] and "sync_level=2" in lines[0], lines[0]
    assert "granularity" not in lines[0]  # only what differs
