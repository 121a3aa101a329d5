"""The summary at exit: printed once however the program ends, and its numbers are the trace's."""

from __future__ import annotations

import json
import re
import signal
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
from support import EXAMPLES, clean_env, run_python

from chainer_autoprof.report.summary import fmt_ms, format_summary
from chainer_autoprof.report.tracefile import stats_from_trace

LOOP = EXAMPLES / "recorder_custom_loop.py"
HEADER = "chainer_autoprof summary"


def launch(tmp: Path, flags: list[str], *script_args: str, script: Path = LOOP, **kw):
    return run_python(tmp, ["-m", "chainer_autoprof", *flags, str(script), *script_args],
                      nvtx=False, **kw)


def summary_of(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    return lines[start:]


def value(lines: list[str], pattern: str) -> re.Match:
    for line in lines:
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"{pattern!r} not in the summary:\n" + "\n".join(lines))


# -- however the program ends ------------------------------------------------------------------

@pytest.mark.parametrize("how, status", [
    ("normal", 0),
    ("exit", 3),
    ("raise", 1),
    ("sigint", None),
    ("sigterm", -signal.SIGTERM),
])
def test_summary_once_however_the_program_ends(tmp_path, how, status):
    trace = tmp_path / "t.json"
    run = launch(tmp_path, ["--trace", str(trace)], "--iterations", "15", "--end", how,
                 "--end-at", "10")
    if status is not None:
        assert run.returncode == status, run.stderr
    else:  # Ctrl-C: the KeyboardInterrupt traceback, as without the agent
        assert "KeyboardInterrupt" in run.stderr
        assert run.returncode != 0
    assert run.stderr.count(HEADER) == 1
    lines = summary_of(run.stderr)
    counted = value(lines, r"iterations\s+(\d+) counted, (\d+) warm-up").groups()
    if how == "normal":
        assert counted == ("12", "3")
        assert "done: 15 iterations" in run.stdout
    else:  # iterations 0-9 done, 10 interrupted while loading its batch, closed by the agent
        assert counted == ("8", "3")
        assert "done:" not in run.stdout
    meta = json.loads(trace.read_text())["otherData"]["chainer_autoprof"]
    assert meta["pid"] > 0  # the trace was written on this path too
    if how == "raise":  # the user's traceback comes first, untouched
        assert run.stderr.index("RuntimeError: the training script failed on purpose") < \
            run.stderr.index(HEADER)


def test_stdout_is_the_programs_own(tmp_path):
    plain = run_python(tmp_path, [str(LOOP), "--iterations", "8"], nvtx=False,
                       count_device=False)
    profiled = launch(tmp_path, [], "--iterations", "8")
    assert profiled.returncode == plain.returncode == 0
    assert profiled.stdout == plain.stdout
    assert HEADER in profiled.stderr and HEADER not in profiled.stdout


def test_summary_can_be_switched_off(tmp_path):
    run = launch(tmp_path, [], "--iterations", "8", env={"CHAINER_PROF_SUMMARY": "0"})
    assert run.returncode == 0
    assert run.stderr == ""


# -- the numbers ---------------------------------------------------------------------------

def trace_figures(path: Path, warmup: int) -> dict:
    """Figures computed straight from the trace's events (independently of the agent)."""
    data = json.loads(path.read_text())
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    iterations = sorted((e for e in xs if e["name"] == "iteration"),
                        key=lambda e: e["args"]["iteration"])
    counted = iterations[warmup:]
    durations = [e["dur"] / 1000 for e in counted]

    def inside(e, it):
        return it["ts"] <= e["ts"] and e["ts"] + e["dur"] <= it["ts"] + it["dur"]

    phases = {}
    for phase in ("data", "forward", "backward", "update"):
        phases[phase] = sum(e["dur"] for e in xs if e["name"] == phase
                            and any(inside(e, it) for it in counted)) / 1000
    return {"n": len(counted), "median": statistics.median(durations),
            "p95": float(np.percentile(durations, 95)), "total": sum(durations),
            "phases": phases}


def test_summary_numbers_are_the_traces(tmp_path):
    trace = tmp_path / "t.json"
    run = launch(tmp_path, ["--trace", str(trace), "--warmup", "4"], "--iterations", "30",
                 "--data-delay", "0.002")
    assert run.returncode == 0, run.stderr
    lines = summary_of(run.stderr)
    fig = trace_figures(trace, warmup=4)
    assert value(lines, r"iterations\s+(\d+) counted, (\d+) warm-up").groups() == ("26", "4")
    m = value(lines, r"median (\S+ \S+), p95 (\S+ \S+);")
    assert m.groups() == (fmt_ms(fig["median"]), fmt_ms(fig["p95"]))
    assert value(lines, r"all counted iterations\s+(\S+ \S+)").group(1) == fmt_ms(fig["total"])
    for phase, total in fig["phases"].items():
        assert value(lines, rf"^\s+{phase}\s+(\S+ \S+)").group(1) == fmt_ms(total), phase
    it_s = float(value(lines, r"([\d.]+) it/s").group(1))
    assert it_s == pytest.approx(fig["n"] / fig["total"] * 1000, abs=0.05)
    sps = float(value(lines, r"([\d,]+) samples/s \(batch 32\)").group(1).replace(",", ""))
    assert sps == pytest.approx(it_s * 32, rel=0.01)
    # the wall time is fully accounted for: iterations + time outside them
    wall = value(lines, r"wall \(agent start to exit\)\s+(\S+ \S+)").group(1)
    stats = stats_from_trace(str(trace))
    assert fmt_ms(stats.wall_ms) == wall
    assert stats.iteration_total_ms + sum(stats.outside_ms.values()) == \
        pytest.approx(stats.wall_ms)


def test_the_sentence_names_what_dominates(tmp_path):
    run = launch(tmp_path, [], "--iterations", "12", "--data-delay", "0.02")
    assert run.returncode == 0, run.stderr
    lines = summary_of(run.stderr)
    share = float(value(lines, r"=> data loading takes ([\d.]+)% of each iteration").group(1))
    table_share = float(value(lines, r"^\s+data\s+\S+ \S+\s+([\d.]+)%").group(1))
    assert share == table_share > 50


def test_evaluation_between_iterations_is_outside_time(tmp_path):
    run = launch(tmp_path, [], "--iterations", "12", "--evaluate-every", "2")
    assert run.returncode == 0, run.stderr
    lines = summary_of(run.stderr)
    assert value(lines, r"^\s+inference\s+(\S+ \S+)")


def test_links_forward_and_backward(tmp_path):
    run = launch(tmp_path, ["--granularity", "link"], "--iterations", "10")
    assert run.returncode == 0, run.stderr
    lines = summary_of(run.stderr)
    start = next(i for i, line in enumerate(lines) if "top links by time" in line)
    rows = {}
    for line in lines[start + 2:]:
        m = re.match(r"\s+(.+?)\s+(\d+)\s+(\S+ \S+)\s+(\S+ \S+)\s+(\d+)\s+(\S+ \S+)$", line)
        if not m:
            break
        rows[m.group(1)] = m.groups()[1:]
    assert {"Classifier", "predictor (MLP)", "predictor/l1 (Linear)",
            "predictor/l2 (Linear)"} <= set(rows)
    counted = int(value(lines, r"iterations\s+(\d+) counted").group(1))
    assert all(int(row[0]) == counted for row in rows.values())  # one call per iteration
    assert int(rows["predictor/l1 (Linear)"][3]) == counted  # backward attributed to l1


def test_gpu_notes_and_sync_warnings(tmp_path):
    trace = tmp_path / "t.json"
    run = launch(tmp_path, ["--trace", str(trace)], "--iterations", "6",
                 env={"CHAINER_PROF_SUMMARY": "0"})
    assert run.returncode == 0
    stats = stats_from_trace(str(trace))
    assert "warning: sync level" not in format_summary(stats)  # CPU: nothing to inflate
    stats.meta["devices"] = [{"id": 0}]  # as if the model had been on GPU 0
    text = format_summary(stats)
    assert "measure kernel launch, not GPU execution" in text
    stats.sync_level = 3
    assert "warning: sync level 3" in format_summary(stats)
    stats.sync_level = 2
    assert "warning: sync level 2" in format_summary(stats)


def test_bad_warmup_setting_is_refused_before_the_script(tmp_path):
    run = launch(tmp_path, [], "--iterations", "3", env={"CHAINER_PROF_WARMUP": "-1"})
    assert run.returncode == 2
    assert run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1
    assert "CHAINER_PROF_WARMUP" in run.stderr


def test_summary_at_exit_of_an_installed_agent(tmp_path):
    """Installed by the program itself (no launcher): the summary still comes at exit."""
    script = tmp_path / "own.py"
    script.write_text(
        "import runpy, sys\n"
        "import chainer_autoprof\n"
        "chainer_autoprof.install(warmup=1)\n"
        f"sys.argv = [{str(LOOP)!r}, '--iterations', '5']\n"
        f"runpy.run_path({str(LOOP)!r}, run_name='__main__')\n")
    import subprocess

    proc = subprocess.run([sys.executable, str(script)], env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = summary_of(proc.stderr)
    assert value(lines, r"iterations\s+(\d+) counted, (\d+) warm-up").groups() == ("4", "1")


def test_a_sigterm_handler_of_the_programs_own_is_left_alone(tmp_path):
    script = tmp_path / "own_handler.py"
    script.write_text(
        "import os, runpy, signal, sys\n"
        "def handler(signum, frame):\n"
        "    print('the program handled SIGTERM', flush=True)\n"
        "    sys.exit(5)\n"
        "signal.signal(signal.SIGTERM, handler)\n"
        f"sys.argv = [{str(LOOP)!r}, '--iterations', '8', '--end', 'sigterm', '--end-at', '6']\n"
        f"runpy.run_path({str(LOOP)!r}, run_name='__main__')\n")
    run = launch(tmp_path, [], script=script)
    assert run.returncode == 5, run.stderr
    assert "the program handled SIGTERM" in run.stdout
    assert run.stderr.count(HEADER) == 1  # its sys.exit ends the program: atexit prints
