"""Paths are taken as the kernel reads them, and shown on one line.

A trace path that names a directory (``dir/``), whose directory the kernel
cannot reach as written (``missing/../x.json``: never normalized away), or
with white space at either end (never dropped) is refused with one line
before the script runs (launcher: exit 2; environment only: the agent stays
off); so is such an output of ``merge -o`` and ``report --html``.  A script
name with a newline keeps the summary's header on one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env, program, write_script

from chainer_autoprof.common.one_line import command_line, one_line

BAD = [
    ("dir/", "names a directory, not a file"),
    ("out/.", "names a directory, not a file"),
    ("ü/../x.json", "ü does not exist"),
    ("run.json ", "begins or ends with white space"),
    (" run.json", "begins or ends with white space"),
    ("run\n.json", "holds a control character"),
]

TRAIN = program("output_paths_train")


def _python(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=clean_env(**env), cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _left(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name != "train.py")


@pytest.mark.parametrize(("path", "why"), BAD)
def test_the_launcher_refuses_a_path_the_kernel_reads_otherwise(tmp_path: Path, path: str,
                                                                 why: str):
    (tmp_path / "out").mkdir()
    script = write_script(tmp_path, "train.py", TRAIN)
    run = _python(["-m", "chainer_autoprof", "--trace", path, str(script)], tmp_path)
    assert run.returncode == 2 and run.stdout == "", run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and f"--trace={path!r} is not valid" in lines[0], run.stderr
    assert why in lines[0], lines[0]
    assert _left(tmp_path) == ["out"] and not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(("path", "why"), BAD)
def test_environment_only_leaves_the_agent_off(tmp_path: Path, path: str, why: str):
    (tmp_path / "out").mkdir()
    script = write_script(tmp_path, "train.py", TRAIN)
    run = _python([str(script)], tmp_path, CHAINER_PROF_TRACE=path)
    assert run.returncode == 0 and run.stdout == "trained\n", run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and f"CHAINER_PROF_TRACE={path!r} is not valid" in lines[0], lines
    assert why in lines[0] and lines[0].endswith("the agent stays off"), lines[0]
    assert _left(tmp_path) == ["out"] and not any((tmp_path / "out").iterdir())


def test_a_variable_that_ends_the_path_with_a_slash_is_refused(tmp_path: Path):
    script = write_script(tmp_path, "train.py", TRAIN)
    run = _python(["-m", "chainer_autoprof", "--trace", "%q{CAPROF_RUN}", str(script)],
                  tmp_path, CAPROF_RUN="results/")
    assert run.returncode == 2 and "names a directory" in run.stderr, run.stderr
    assert _left(tmp_path) == []


@pytest.mark.parametrize(("path", "why"), BAD[:4])
def test_merge_and_html_outputs_follow_the_same_rules(tmp_path: Path, path: str, why: str,
                                                      made_trace: Path):
    shutil.copy(made_trace, tmp_path / "t.json")
    (tmp_path / "out").mkdir()
    for args in (["merge", "t.json", "-o", path], ["report", "t.json", "--html", path]):
        run = _python(["-m", "chainer_autoprof", *args], tmp_path)
        assert run.returncode == 2 and run.stdout == "", run.stderr
        assert len(run.stderr.splitlines()) == 1 and why in run.stderr, run.stderr
    assert _left(tmp_path) == ["out", "t.json"] and not any((tmp_path / "out").iterdir())


def test_dot_dot_after_a_real_directory_is_what_the_kernel_reads(tmp_path: Path):
    """``out/../x.json`` is fine where ``out`` exists: the trace goes to ``x.json``."""
    (tmp_path / "out").mkdir()
    script = write_script(tmp_path, "train.py", TRAIN)
    run = _python(["-m", "chainer_autoprof", "--summary", "0", "--trace", "out/../x.json",
                   str(script)], tmp_path)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert json.loads((tmp_path / "x.json").read_text())["traceEvents"]


def test_a_script_name_with_a_newline_keeps_the_header_on_one_line(tmp_path: Path):
    script = write_script(tmp_path, "a\nb.py", TRAIN)
    run = _python(["-m", "chainer_autoprof", "--trace", "t.json", str(script)], tmp_path)
    assert run.returncode == 0 and run.stdout == "trained\n", run.stderr
    header, following = run.stderr.splitlines()[:2]
    quoted = "$'" + str(script).replace("\n", "\\n") + "'"
    assert header.startswith("chainer_autoprof summary (pid ") and header.endswith(quoted)
    assert following.startswith("  ")  # the summary's own lines follow
    meta = json.loads((tmp_path / "t.json").read_text())["otherData"]["chainer_autoprof"]
    assert meta["command"].endswith(quoted) and "\n" not in meta["command"]
    report = _python(["-m", "chainer_autoprof", "report", "t.json"], tmp_path)
    assert report.returncode == 0, report.stderr
    title, following = report.stdout.splitlines()[:2]
    assert title.startswith("chainer_autoprof report of t.json: ") and title.endswith(quoted)
    assert following.startswith("  ")


def test_a_command_line_is_shown_as_a_shell_reads_it_back():
    argv = ["python", "train.py", "--name", "a b", "it's", "a\nb", "\x1b[2J", "tab\there"]
    shown = command_line(argv)
    assert "\n" not in shown and "\x1b" not in shown and "\t" not in shown
    assert shown == ("python train.py --name 'a b' 'it'\"'\"'s' $'a\\nb' $'\\x1b[2J' "
                     "$'tab\\there'")
    if os.path.exists("/bin/bash"):  # a real shell reads it back as the same arguments
        echoed = subprocess.run(["/bin/bash", "-c", f"printf '%s\\0' {shown}"],
                                capture_output=True, check=True).stdout
        assert echoed.decode().split("\0")[:-1] == argv
    assert one_line("a\nb\u2028c") == "a\\nb\\u2028c"
