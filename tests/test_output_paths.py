"""What the agent writes only ever replaces a regular file.

A trace path (and ``merge -o``, ``report --html``) naming a device, a FIFO, a
directory or a path under /proc or /sys, or a template that expands to an
empty path, is refused with one line before the script runs (launcher: exit
status 2; environment only: the agent stays off and the program runs).  A
symlink is written through to its target.  If the path turns into something
else while the program runs, the trace is not written and the node stays.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env, program, write_script

TRAIN = program("output_paths_train")

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _python(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=clean_env(**env), cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _make(kind: str, tmp: Path) -> tuple[str, Path | None]:
    """A trace path of ``kind``; returns (path as given, node that must stay as it is)."""
    if kind == "fifo":
        os.mkfifo(tmp / "fifo")
        return str(tmp / "fifo"), tmp / "fifo"
    if kind == "device":
        if not IS_ROOT:
            pytest.skip("making a device node needs root")
        os.mknod(tmp / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of ours
        return str(tmp / "null"), tmp / "null"
    if kind == "directory":
        (tmp / "out").mkdir()
        return str(tmp / "out"), tmp / "out"
    if kind == "symlink to a fifo":
        os.mkfifo(tmp / "fifo")
        (tmp / "link.json").symlink_to("fifo")
        return str(tmp / "link.json"), tmp / "fifo"
    if kind == "under /proc":
        return "/proc/chainer_autoprof_trace.json", None
    if kind == "under /sys":
        return "/sys/kernel/chainer_autoprof_trace.json", None
    if kind == "empty expansion":
        return "%q{CHAINER_AUTOPROF_TEST_UNSET}", None
    raise AssertionError(kind)


def _kind_of(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


KINDS = ["fifo", "device", "directory", "symlink to a fifo", "under /proc", "under /sys",
         "empty expansion"]


@pytest.mark.parametrize("kind", KINDS)
def test_launcher_refuses_before_the_script_runs(tmp_path: Path, kind: str):
    path, node = _make(kind, tmp_path)
    before = _kind_of(node) if node else None
    script = write_script(tmp_path, "train.py", TRAIN)
    run = _python(["-m", "chainer_autoprof", "--trace", path, str(script)], tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""  # the script never ran
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "--trace" in lines[0], run.stderr
    if node is not None:
        assert _kind_of(node) == before  # nothing replaced


@pytest.mark.parametrize("kind", ["fifo", "device", "under /proc", "empty expansion"])
def test_environment_only_leaves_the_agent_off(tmp_path: Path, kind: str):
    path, node = _make(kind, tmp_path)
    before = _kind_of(node) if node else None
    script = write_script(tmp_path, "train.py", TRAIN)
    run = _python([str(script)], tmp_path, CHAINER_PROF_TRACE=path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "trained\n"
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "CHAINER_PROF_TRACE" in lines[0] and "off" in lines[0], run.stderr
    if node is not None:
        assert _kind_of(node) == before


def test_a_symlink_is_written_through_to_its_target(tmp_path: Path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "run.json").symlink_to(tmp_path / "traces" / "real.json")  # dangling for now
    script = write_script(tmp_path, "train.py", TRAIN)
    for _ in range(2):  # first creates the target, then replaces it
        run = _python(["-m", "chainer_autoprof", "--summary", "0", "--trace", "run.json",
                       str(script)], tmp_path)
        assert run.returncode == 0 and run.stderr == "", run.stderr
        assert (tmp_path / "run.json").is_symlink()
        data = json.loads((tmp_path / "traces" / "real.json").read_text())
        assert any(ev.get("name") == "iteration" for ev in data["traceEvents"])
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["real.json"]


def test_a_path_that_becomes_a_fifo_while_running_is_not_replaced(tmp_path: Path):
    source = TRAIN + "import os\nos.mkfifo('run.json')\n"
    script = write_script(tmp_path, "train.py", source)
    run = _python(["-m", "chainer_autoprof", "--summary", "0", "--trace", "run.json",
                   str(script)], tmp_path)
    assert run.returncode == 0, run.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "run.json").st_mode)
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "FIFO" in lines[0] and "trace" in lines[0], run.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "symlink to a fifo"])
def test_merge_and_html_outputs_only_replace_regular_files(tmp_path: Path, kind: str,
                                                          made_trace: Path):
    shutil.copy(made_trace, tmp_path / "t.json")
    path, node = _make(kind, tmp_path)
    before = _kind_of(node)
    merged = _python(["-m", "chainer_autoprof", "merge", "t.json", "-o", path], tmp_path)
    assert merged.returncode == 2 and len(merged.stderr.splitlines()) == 1, merged.stderr
    assert _kind_of(node) == before
    html = _python(["-m", "chainer_autoprof", "report", "t.json", "--html", path], tmp_path)
    assert html.returncode == 2 and len(html.stderr.splitlines()) == 1, html.stderr
    assert html.stdout == ""
    assert _kind_of(node) == before


def test_report_html_never_overwrites_its_input(tmp_path: Path, made_trace: Path):
    shutil.copy(made_trace, tmp_path / "t.json")
    (tmp_path / "alias.json").symlink_to("t.json")
    original = (tmp_path / "t.json").read_text()
    for out in ("t.json", "alias.json"):
        got = _python(["-m", "chainer_autoprof", "report", "t.json", "--html", out], tmp_path)
        assert got.returncode == 2 and len(got.stderr.splitlines()) == 1, got.stderr
        merged = _python(["-m", "chainer_autoprof", "merge", "t.json", "-o", out], tmp_path)
        assert merged.returncode == 2 and len(merged.stderr.splitlines()) == 1, merged.stderr
    assert (tmp_path / "t.json").read_text() == original


def test_a_relative_trace_path_is_taken_from_where_the_run_started(tmp_path: Path):
    """The program changes directory: the trace still goes where the path was checked."""
    (tmp_path / "elsewhere").mkdir()
    script = write_script(tmp_path, "train.py", TRAIN + "import os\nos.chdir('elsewhere')\n")
    run = _python(["-m", "chainer_autoprof", "--summary", "0", "--trace", "run.json",
                   str(script)], tmp_path)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert (tmp_path / "run.json").is_file()
    assert not (tmp_path / "elsewhere" / "run.json").exists()


@pytest.mark.parametrize("template", ["run-%q{CAPROF_UNSET}.json", "%q{CAPROF_UNSET}/run.json",
                                      "run-%q{CAPROF_SET}-%q{CAPROF_UNSET}.json"])
def test_an_unset_variable_in_the_path_is_refused(tmp_path: Path, template: str):
    """``%q{VAR}`` with VAR unset would expand to nothing (every process the same name)."""
    script = write_script(tmp_path, "train.py", TRAIN)
    run = _python(["-m", "chainer_autoprof", "--trace", template, str(script)], tmp_path,
                  CAPROF_SET="x")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines() == [
        f"python -m chainer_autoprof: error: --trace={template!r} is not valid: accepted: a "
        "path whose %q{VAR} variables are all set (CAPROF_UNSET is not set)"]
    env_only = _python([str(script)], tmp_path, CHAINER_PROF_TRACE=template, CAPROF_SET="x")
    assert env_only.returncode == 0 and env_only.stdout == "trained\n"
    assert env_only.stderr.splitlines() == [
        f"chainer_autoprof: CHAINER_PROF_TRACE={template!r} is not valid: accepted: a path "
        "whose %q{VAR} variables are all set (CAPROF_UNSET is not set); the agent stays off"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
    set_now = _python(["-m", "chainer_autoprof", "--summary", "0", "--trace", template,
                       str(script)], tmp_path, CAPROF_SET="x", CAPROF_UNSET="y")
    if "/" not in template:
        assert set_now.returncode == 0 and set_now.stderr == "", set_now.stderr
        assert len(list(tmp_path.glob("run-*.json"))) == 1
