"""SIGTERM stays the program's: its own handler runs, the default action kills at once.

Preemption (SLURM, Kubernetes, spot instances) sends SIGTERM, then SIGKILL after a grace
period: a program that saves a checkpoint in its SIGTERM handler must keep doing so under
the agent, however the agent was activated and whenever the program installs its handler
(before the agent, after it, "if default", chaining to the handler it found).  Where the
default action is in force, a process blocked in C dies at once, as without the agent; the
agent writes its summary only where that holds nothing up.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import clean_env, program, write_script

HEADER = "chainer_autoprof summary"
PROGRAMS = {"signals_checkpoint": program("signals_checkpoint"),
            "signals_blocked_in_c": program("signals_blocked_in_c")}


def start(tmp: Path, name: str, args: list[str], activation: str, **env: str
          ) -> subprocess.Popen[str]:
    script = write_script(tmp, f"{name}.py", PROGRAMS[name])
    settings = {"CHAINER_PROF_TRACE": str(tmp / "t.json"), **env}
    if activation == "launcher":
        cmd = [sys.executable, "-m", "chainer_autoprof", str(script), *args]
    else:  # the .pth line (env), or the program's own install() (the variables give settings)
        cmd = [sys.executable, str(script), *args]
        if activation == "env":
            settings["CHAINER_PROF_ENABLE"] = "1"
    return subprocess.Popen(cmd, env=clean_env(**settings), cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def terminate(proc: subprocess.Popen[str], after: str, wait: float = 60.0
              ) -> tuple[int | None, float, str, str]:
    """Wait for the line ``after``, send SIGTERM; (status or None if alive ``wait`` s later,
    seconds it took to end, stdout, stderr)."""
    lines = []
    try:
        while True:
            line = proc.stdout.readline()
            assert line, f"ended before {after!r}: {proc.communicate()}"
            lines.append(line)
            if line == after + "\n":
                break
        time.sleep(0.2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            status: int | None = proc.wait(wait)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - sent
    finally:
        proc.kill()
        out, err = proc.communicate()
    return status, took, "".join(lines) + out, err


@pytest.mark.parametrize("activation", ["launcher", "env", "install"])
@pytest.mark.parametrize("pattern, status", [("before", 143), ("if default", 143),
                                             ("chained", -signal.SIGTERM)])
def test_the_programs_sigterm_handler_saves_its_checkpoint(tmp_path, activation, pattern,
                                                           status):
    checkpoint = tmp_path / "model.ckpt"
    proc = start(tmp_path, "signals_checkpoint", [pattern, str(checkpoint), activation],
                 activation)
    got, _took, out, err = terminate(proc, "training")
    assert checkpoint.read_text() == "weights\n", err
    assert got == status, err
    if status == 143:  # it ended by sys.exit: the agent's end ran too
        assert err.count(HEADER) == 1, err
    if pattern == "chained":  # the agent changed nothing the program could see
        assert out.startswith("default\n"), out


@pytest.mark.parametrize("activation", ["launcher", "env"])
@pytest.mark.parametrize("trains", ["trains", "never trains"])
def test_blocked_in_c_dies_at_once_by_sigterm(tmp_path, activation, trains):
    proc = start(tmp_path, "signals_blocked_in_c", [trains.split()[0]], activation)
    status, took, out, err = terminate(proc, "blocked", wait=3.0)
    assert status == -signal.SIGTERM, err
    assert took < 1.0
    assert out == "default\nblocked\n"  # no handler of the agent's, even once it trains


def test_sigterm_in_a_training_loop_still_gets_the_summary(tmp_path):
    """The default action, with the agent's end first: summary, trace, killed by SIGTERM."""
    proc = start(tmp_path, "signals_checkpoint", ["none", str(tmp_path / "c"), "env"], "env")
    status, _took, out, err = terminate(proc, "training")
    assert status == -signal.SIGTERM, err
    assert err.count(HEADER) == 1, err
    assert (tmp_path / "t.json").exists() and not (tmp_path / "t.json.partial").exists()
    assert out.startswith("default\n")


def test_forked_children_die_by_sigterm_at_once_and_pools_end(tmp_path):
    """SIGTERM sent right after a fork (a pool's terminate, a supervisor) finds the default
    action in the child, never a handler inherited from the parent's agent; the control
    sockets of the children it killed do not stay behind once the run has ended."""
    script = write_script(tmp_path, "pool.py", program("signals_pool"))
    tmp = tmp_path / "tmp"  # where the run's control sockets go (none of other runs there)
    tmp.mkdir()
    proc = subprocess.run([sys.executable, str(script), "40", "20"],
                          env=clean_env(CHAINER_PROF_ENABLE="1", TMPDIR=str(tmp),
                                        XDG_RUNTIME_DIR="",
                                        CHAINER_PROF_TRACE=str(tmp_path / "t.json")),
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["alive 0", "pools done"], proc.stderr
    sockets = [p for p in tmp.glob("chainer_autoprof-*/*") if p.is_socket()]
    assert sockets == []
    assert list(tmp.glob("chainer_autoprof-*"))  # (the run listened there)
