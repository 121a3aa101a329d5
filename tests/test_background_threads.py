"""The agent's background threads: asleep unless a setting asks, and never in the program's way.

A thread that wakes every second costs every process it runs in (a laptop's battery, a node
running hundreds of workers): the agent's threads wake only for what was asked (a trace's
background writes at their interval, a stall watch).  The program's own faulthandler
watchdog stays the program's, however the agent was started.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import clean_env, program, write_script

WAKEUPS = program("background_wakeups")
OWN_WATCHDOG = program("background_own_watchdog")


def run(tmp: Path, text: str, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    script = write_script(tmp, "program.py", text)
    return subprocess.run([sys.executable, str(script), *args], env=clean_env(**env), cwd=tmp,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("settings", [{}, {"CHAINER_PROF_TRACE": "t.json",
                                           "CHAINER_PROF_FLUSH_INTERVAL": "30"}],
                         ids=["defaults", "trace"])
def test_no_thread_of_the_agent_wakes_while_nothing_asks(tmp_path, settings):
    proc = run(tmp_path, WAKEUPS, [], CHAINER_PROF_ENABLE="1", **settings)
    assert proc.returncode == 0, proc.stderr
    woke = json.loads(proc.stdout)
    if settings:
        assert "chainer_autoprof monitor" in woke  # the background writes' thread, asleep
    assert woke and all(n == 0 for n in woke.values()), woke


def test_install_with_a_stall_setting_keeps_the_programs_own_watchdog(tmp_path):
    proc = run(tmp_path, OWN_WATCHDOG, ["30"])
    assert "hanging" in proc.stdout, proc.stderr
    assert "not ended by its own watchdog" not in proc.stdout, proc.stderr
    assert "Timeout (0:00:05)!" in proc.stderr
    assert proc.returncode == 1, proc.stderr  # faulthandler's exit=True
