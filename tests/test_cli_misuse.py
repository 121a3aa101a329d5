"""The subcommands misused: one line and exit status 2, or a quiet end; never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env, program, write_script


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    script = write_script(tmp, "train.py", program("output_paths_train"))
    run = subprocess.run([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                          "--trace", "t.json", str(script)], env=clean_env(), cwd=tmp,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return tmp / "t.json"


def _cli(args: list[str], cwd: Path, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chainer_autoprof", *args], env=clean_env(),
                          cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60)


def _one_line(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
    assert all(word in run.stderr for word in words), run.stderr


def test_merge_refuses_the_same_trace_twice(trace: Path):
    _one_line(_cli(["merge", "t.json", "./t.json", "-o", "m.json"], trace.parent), "twice")
    assert not (trace.parent / "m.json").exists()


def test_report_refuses_a_device_instead_of_reading_forever(trace: Path):
    _one_line(_cli(["report", "/dev/zero"], trace.parent), "/dev/zero", "device")


def test_merge_refuses_a_stream_it_would_read_twice(trace: Path):
    os.mkfifo(trace.parent / "pipe.json")
    _one_line(_cli(["merge", "pipe.json", "-o", "m.json"], trace.parent), "regular file")


@pytest.mark.parametrize("args", [["report", "t.json"], ["merge", "t.json", "-o", "m.json"],
                                  ["--help"]])
def test_a_reader_that_went_away_is_no_traceback(trace: Path, args: list[str]):
    """``report t.json | head -0``: the pipe is closed before the summary is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        run = _cli(args, trace.parent, stdout=write)
    finally:
        os.close(write)
    assert run.returncode == 128 + 13, run.stderr  # as a writer killed by SIGPIPE
    assert run.stderr == ""
