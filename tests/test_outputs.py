"""Every file the agent writes is replaced whole or not at all, through one writer; the trace's
path is composed in one function."""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, clean_env

from chainer_autoprof.common import outputs
from chainer_autoprof.lifecycle import processes

GPU_TRACE = REPO / "tests" / "data" / "gpu" / "traces" / "gpu_bound_b512_sync0_phase.json"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("the old one")
    with pytest.raises(RuntimeError), outputs.atomic_text(str(target)) as out:
        out.write("half of the new one")
        raise RuntimeError("disk full, say")
    assert target.read_text() == "the old one"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path):
    old = os.umask(0o027)
    try:
        with outputs.atomic_bytes(str(tmp_path / "a.bin")) as out:
            out.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o640


def test_a_symlink_is_written_through_and_a_directory_refused(tmp_path):
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    with outputs.atomic_text(str(tmp_path / "link.json")) as out:
        out.write("new")
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real.json").read_text() == "new"
    with pytest.raises(ValueError, match="is a directory, not a regular file"), \
            outputs.atomic_text(str(tmp_path)):
        pass


def test_a_file_another_program_writes_is_renamed_into_place_only_when_whole(tmp_path):
    target = tmp_path / "lib.so"
    target.write_text("the old build")
    with pytest.raises(RuntimeError), outputs.replaced_by(str(target)) as tmp:
        Path(tmp).write_text("half a build")
        raise RuntimeError("the compiler failed")
    assert target.read_text() == "the old build" and len(list(tmp_path.iterdir())) == 1
    with outputs.replaced_by(str(target)) as tmp:
        Path(tmp).write_text("the new build")
    assert target.read_text() == "the new build" and len(list(tmp_path.iterdir())) == 1


def _small_files() -> None:
    """In the child: files may not grow past 20 kB (a full disk, as the writer sees it)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))


def test_an_html_report_that_cannot_be_written_whole_leaves_the_previous_one(tmp_path):
    page = tmp_path / "run.html"
    page.write_text("<!DOCTYPE html> the previous report")
    run = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report", str(GPU_TRACE),
                          "--html", str(page)], env=clean_env(), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, preexec_fn=_small_files)
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.splitlines()) == 1 and f"cannot write {page}" in run.stderr
    assert page.read_text() == "<!DOCTYPE html> the previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["run.html"]


def test_the_trace_path_is_the_template_for_this_process_from_the_start_directory(
        tmp_path, monkeypatch):
    monkeypatch.delenv(processes.ROOT_PID_VAR, raising=False)
    monkeypatch.setenv("JOB", "j7")
    assert processes.trace_path("run-%q{JOB}.json", str(tmp_path)) == \
        str(tmp_path / "run-j7.json")
    assert processes.trace_path("/abs/run.json", str(tmp_path)) == "/abs/run.json"
    monkeypatch.setenv(processes.ROOT_PID_VAR, str(os.getpid() + 1))  # a child process
    assert processes.trace_path("run.json", str(tmp_path)) == \
        str(tmp_path / f"run.{os.getpid()}.json")
