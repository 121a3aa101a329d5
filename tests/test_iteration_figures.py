"""A figure read at each iteration's end is one declaration.

A new figure -- here, the threads alive the program started, one more after every fourth
iteration's update -- declared as an ``IterationFigure`` and added to ``FIGURES`` before the agent
loads (nothing else of the package changed), reaches every place a figure goes in a real
run through the launcher: the recorder reads it at each iteration's end, the run record
holds its samples, the summary, ``report`` and the HTML report show its median and peak
with its notes, its advice is printed, and the trace has its counter track under the
process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from support import clean_env, program, run_python, write_script

from chainer_autoprof.report.tracefile import read_trace

LOOP = program("memory_sum_loss")
ITERATIONS, WARMUP = 40, 3
#: The declaration, put on the path as a module the runner imports before the agent.
THREADS_FIGURE = '''
import threading

from chainer_autoprof.analysis import iteration_figures
from chainer_autoprof.analysis.finding import Finding
from chainer_autoprof.analysis.per_iteration import IterationFigure


class Threads(IterationFigure):
    name = "threads"
    doc = "threads the program started, and all threads alive (count)"
    series = ("alive", "all")
    labels = {"alive": "threads alive", "all": "all threads"}

    def read(self):
        alive = threading.enumerate()
        return (sum(t.name.startswith("extra") for t in alive), len(alive))

    def notes(self, samples):
        return [f"{samples.peak['alive'] - samples.values['alive'][0]} more at the end"]

    def advice(self, samples):
        return [Finding("threads_grow", "threads pile up", "more threads at each end",
                        "", "join them", "https://docs.python.org/3/library/threading.html")]


iteration_figures.FIGURES += (Threads(),)
'''
RUNNER = '''
import runpy, sys
import threads_figure  # the declaration, before the agent loads
sys.argv = ["chainer_autoprof", *sys.argv[1:]]
runpy.run_module("chainer_autoprof", run_name="__main__", alter_sys=True)
'''
#: The program, a thread more every fourth iteration (each waits on an event set at the end).
GROWING = '''
import threading
_stop = threading.Event()
_extra = []
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("threads")
    (tmp / "threads_figure.py").write_text(THREADS_FIGURE)
    runner = write_script(tmp, "runner.py", RUNNER)
    body = LOOP.replace("sum_loss = 0.0\n", GROWING + "sum_loss = 0.0\n").replace(
        "    if fixed:\n",
        "    if i % 4 == 0:\n"
        "        _extra.append(threading.Thread(target=_stop.wait, name=f\"extra{i}\"))\n"
        "        _extra[-1].start()\n"
        "    if fixed:\n") + "_stop.set()\n"
    assert "_extra.append" in body
    script = write_script(tmp, "train.py", body)
    trace = tmp / "t.json"
    done = run_python(tmp, [str(runner), "--summary", "1", "--trace", str(trace), str(script),
                            "fixed"], env={"PYTHONPATH": clean_env()["PYTHONPATH"] + f":{tmp}"},
                      nvtx=False)
    assert done.returncode == 0, done.stderr
    return done, trace, tmp


def test_the_recorder_reads_it_and_the_record_holds_it(run):
    _done, trace, _tmp = run
    data = json.loads(trace.read_text())
    held = data["otherData"]["chainer_autoprof"]["per_iteration"]
    assert set(held) == {"memory", "threads"}
    threads = held["threads"]
    assert threads["iteration"] == list(range(WARMUP, ITERATIONS))
    alive = threads["values"]["alive"]
    # one more thread after iterations 0, 4, 8, ... (started after the update ended the
    # iteration: seen at the next one's end)
    assert alive == [(i + 3) // 4 for i in range(WARMUP, ITERATIONS)]
    assert threads["peak"]["alive"] == max(alive)
    assert threads["peak_iteration"]["alive"] == 37
    stats = read_trace(str(trace)).stats()
    assert stats.per_iteration["threads"].values["alive"] == alive
    # reading them is the agent's time: in its overhead estimate
    assert re.search(r"\+ \d+\.\d ms figures read at iteration ends",
                     data["otherData"]["chainer_autoprof"]["overhead_method"])


def test_the_summary_shows_it_with_its_notes_and_advice(run):
    done, trace, _tmp = run
    err = done.stderr
    alive = json.loads(trace.read_text())["otherData"]["chainer_autoprof"]["per_iteration"][
        "threads"]["values"]["alive"]
    median = sorted(alive)[len(alive) // 2]
    assert (f"  threads         at iteration ends: threads alive median {median}, peak "
            f"{max(alive)} (iteration 37)") in err
    assert f"{max(alive) - alive[0]} more at the end" in err
    assert "[threads_grow] threads pile up" in err
    assert "  memory          at iteration ends: resident median" in err


def test_the_trace_has_its_counter_track(run):
    _done, trace, _tmp = run
    data = json.loads(trace.read_text())
    pid = data["otherData"]["chainer_autoprof"]["pid"]
    counters = [e for e in data["traceEvents"] if e.get("ph") == "C" and e["name"] == "threads"]
    assert len(counters) == ITERATIONS - WARMUP and {e["pid"] for e in counters} == {pid}
    assert [e["args"]["threads alive"] for e in counters] == \
        [(i + 3) // 4 for i in range(WARMUP, ITERATIONS)]


def test_report_and_the_html_report_show_it(run, tmp_path):
    done, trace, tmp = run
    env = clean_env()
    env["PYTHONPATH"] += f":{tmp}"

    def report(*args: str) -> str:
        proc = subprocess.run([sys.executable, str(tmp / "runner.py"), "report", *args],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    line = next(x for x in done.stderr.splitlines() if x.startswith("  threads "))
    assert line in report(str(trace))
    page_path = tmp_path / "r.html"
    report(str(trace), "--html", str(page_path))
    page = page_path.read_text(encoding="utf-8")
    assert "<dt>threads</dt>" in page and "threads pile up" in page
