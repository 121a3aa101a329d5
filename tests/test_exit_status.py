"""Ctrl-C ends a profiled program as it ends a plain one: killed by SIGINT, after the summary.

CPython dies by SIGINT (shell status 130) when a KeyboardInterrupt goes
uncaught; the agent's exit-time work must not change that, whether the
interrupt is raised by the script, comes from a real ``kill -INT`` during
training, or is raised in a Trainer extension; under the launcher and
activated from the environment alone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env, program, write_script

from chainer_autoprof.report.tracefile import stats_from_trace

SCRIPTS = {
    "raise": program("exit_status_raise"),
    "signal": program("exit_status_signal"),
    "extension": program("exit_status_extension"),
}

MODES = {
    "plain": ([], {}),
    "launcher": (["-m", "chainer_autoprof"], {}),
    "env": ([], {"CHAINER_PROF_ENABLE": "1"}),
    # the watchdog, the background writes of the trace so far and the dump server running
    "watching": (["-m", "chainer_autoprof"], {"CHAINER_PROF_STALL": "30",
                                              "CHAINER_PROF_TRACE": "run.json",
                                              "CHAINER_PROF_FLUSH_INTERVAL": "0.05"}),
}


def _run(tmp_path: Path, script: str, mode: str) -> subprocess.CompletedProcess:
    path = write_script(tmp_path, f"ctrl_c_{script}.py", SCRIPTS[script])
    prefix, extra = MODES[mode]
    env = clean_env(**extra)
    cmd = [sys.executable, *prefix, str(path)]
    if script != "signal":
        return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "training\n"
        proc.send_signal(signal.SIGINT)  # a real Ctrl-C while iterations run
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, "training\n" + out, err)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("mode", ["launcher", "env", "watching"])
def test_ctrl_c_exit_status_is_the_plain_one(tmp_path: Path, script: str, mode: str):
    plain = _run(tmp_path, script, "plain")
    assert plain.returncode == -signal.SIGINT, plain.stderr  # python dies by SIGINT: 130
    assert "KeyboardInterrupt" in plain.stderr
    got = _run(tmp_path, script, mode)
    assert got.returncode == plain.returncode, got.stderr
    assert got.stdout == plain.stdout
    assert "KeyboardInterrupt" in got.stderr
    assert "chainer_autoprof summary" in got.stderr  # the summary was printed, then SIGINT
    if mode == "watching":  # the final trace written, the trace so far gone
        assert (tmp_path / "run.json").exists()
        assert not (tmp_path / "run.json.partial").exists()


INTERRUPTED_SUMMARY = program("exit_status_interrupted_summary")


def test_ctrl_c_while_the_summary_is_written_ends_quietly(tmp_path: Path):
    """One line, no traceback, and the process ends as a Ctrl-C'd one does."""
    path = write_script(tmp_path, "again.py", INTERRUPTED_SUMMARY)
    run = subprocess.run([sys.executable, "-m", "chainer_autoprof", str(path)],
                         env=clean_env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.stdout == "done\n"
    assert run.returncode == -signal.SIGINT, run.stderr
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr
    assert run.stderr.splitlines() == ["chainer_autoprof: interrupted while finishing: the "
                                       "summary or the trace may be missing"]


EXEC_SELF = program("exit_status_exec_self")


@pytest.mark.parametrize("how", ["execv", "execlpe"])
def test_a_program_that_execs_itself_keeps_each_images_profile(tmp_path: Path, how: str):
    """Restart wrappers replace the process (os.exec*): no atexit runs.  Each image prints its
    summary; the first image's trace lies beside the one asked for (.exec1), the last image's
    at the path itself; no trace so far is left behind."""
    script = write_script(tmp_path, "restart.py", EXEC_SELF)
    env = clean_env(CHAINER_PROF_ENABLE="1", CHAINER_PROF_TRACE="t.json",
                    CHAINER_PROF_FLUSH_INTERVAL="0.05")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([sys.executable, str(script), "1", how], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "image 1\nimage 2\n"
    counted = re.findall(r"iterations\s+(\d+) counted, (\d+) warm-up", proc.stderr)
    assert counted == [("2", "3"), ("4", "3")], proc.stderr  # image 1's, then image 2's
    first = stats_from_trace(str(tmp_path / "t.exec1.json"))
    last = stats_from_trace(str(tmp_path / "t.json"))
    assert (first.iterations, last.iterations) == (2, 4)
    assert sorted(p.name for p in tmp_path.iterdir() if "json" in p.name) == \
        ["t.exec1.json", "t.json"]
