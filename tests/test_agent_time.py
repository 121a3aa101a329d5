"""The agent's own work on the program's thread is shown as the agent's, never as the program's.

Its run-time checks after the first update (the configuration, the parameters, a measured
matmul: most of a millisecond) run on the training thread between two iterations of a loop of
the program's own.  They are a range of their own in the trace (category ``agent``), the
summary's "agent's own work (overhead)" row and part of the overhead figure; the idle time
between iterations is the program's gaps only, and the verdict's loop leaves them out.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from support import program, run_python, write_script

from chainer_autoprof.analysis.stats import AGENT_OWN, IDLE
from chainer_autoprof.report.summary import fmt_ms
from chainer_autoprof.report.tracefile import stats_from_trace

LOOP = program("agent_time_loop")


@pytest.mark.parametrize("loop", ["loop", "trainer"])
def test_the_agents_checks_are_not_the_programs_idle_time(tmp_path: Path, twin: str, loop: str):
    script = write_script(tmp_path, "loop.py", LOOP)
    trace = tmp_path / "t.json"
    run = run_python(tmp_path, ["-m", "chainer_autoprof", "--warmup", "0", "--trace",
                                str(trace), str(script), loop], nvtx=False, check=True)
    events = [ev for ev in json.loads(trace.read_text())["traceEvents"] if ev.get("ph") == "X"]
    iterations = sorted((ev for ev in events if ev["name"] == "iteration"),
                        key=lambda ev: ev["ts"])
    assert len(iterations) == 12
    # the checks after the first update, and the counting hook's start and end
    checks = [ev for ev in events if ev["cat"] == "agent"]
    assert checks and all(ev["args"]["depth"] == 0 and ev["dur"] >= 0 for ev in checks)
    for check in checks:  # each in a gap between two iterations (never inside one)
        assert any(a["ts"] + a["dur"] <= check["ts"] and check["ts"] + check["dur"] <= b["ts"]
                   for a, b in zip(iterations, iterations[1:])), check
    first = min(checks, key=lambda ev: ev["ts"])
    assert first["ts"] < iterations[1]["ts"]

    stats = stats_from_trace(str(trace))
    check_ms = sum(ev["dur"] for ev in checks) / 1000
    assert check_ms > 0.01
    assert stats.outside_ms[AGENT_OWN] == pytest.approx(check_ms, abs=1e-3)
    gaps_ms = sum(b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(iterations, iterations[1:])) \
        / 1000
    # idle between iterations: the program's gaps, without the agent's checks
    assert stats.outside_ms.get(IDLE, 0.0) == pytest.approx(gaps_ms - check_ms, abs=1e-2)

    lines = run.stderr.splitlines()
    row = next(line for line in lines if "the agent's own work (overhead)" in line)
    assert fmt_ms(stats.outside_ms[AGENT_OWN]) in row
    at = next(i for i, line in enumerate(lines) if line.startswith("  agent overhead"))
    # the row and the lines a long one is wrapped into (indented under its label)
    rest = itertools.takewhile(lambda line: line.startswith(" " * 17), lines[at + 1:])
    overhead = " ".join(line.strip() for line in [lines[at], *rest])
    assert "run-time checks" in overhead
    verdict = next(line for line in lines if line.startswith("Verdict:"))
    assert "between iterations" not in verdict and "extension-bound" not in verdict

