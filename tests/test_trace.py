"""Timeline traces: file names, the file itself (Perfetto / chrome://tracing), atomic writes."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import numpy as np
import pytest
from support import EXAMPLES, program, run_python, run_with_agent
from traces import CHROME_CNAMES, check_trace_file

from chainer_autoprof.common import names
from chainer_autoprof.common.paths import check_writable, expand_path
from chainer_autoprof.common.rank import number as mpi_rank
from chainer_autoprof.report.tracefile import CNAMES, ThreadRanges, read_trace, write_trace

LOOP = EXAMPLES / "recorder_custom_loop.py"


def launch(tmp: Path, flags: list[str], script: Path, *script_args: str, **kw):
    """``python -m chainer_autoprof FLAGS SCRIPT ARGS`` as a user runs it."""
    return run_python(tmp, ["-m", "chainer_autoprof", *flags, str(script), *script_args],
                      nvtx=False, **kw)


# -- file names ------------------------------------------------------------------------------

def test_path_substitutions_as_in_nsight(monkeypatch):
    monkeypatch.setenv("JOB", "run7")
    env = {"JOB": "run7", "SLURM_PROCID": "3"}
    assert expand_path("t.%p.json", pid=42, environ=env) == "t.42.json"
    assert expand_path("%h-%q{JOB}-%r.json", environ=env) == \
        f"{socket.gethostname()}-run7-3.json"
    assert expand_path("a%%p-%q{MISSING}.json", environ=env) == "a%p-.json"
    assert expand_path("%x.json", environ={}) == "%x.json"


LAUNCHER_RANK_VARS = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                      "SLURM_PROCID"]


@pytest.mark.parametrize("var", LAUNCHER_RANK_VARS)
def test_rank_from_each_mpi_launcher(var):
    assert mpi_rank({var: "5"}) == 5
    assert mpi_rank({var: ""}) == 0
    assert mpi_rank({}) == 0


def test_open_mpi_rank_wins_over_slurm():
    assert mpi_rank({"SLURM_PROCID": "0", "OMPI_COMM_WORLD_RANK": "2"}) == 2


@pytest.mark.parametrize("var", LAUNCHER_RANK_VARS)
def test_percent_r_names_the_rank_of_every_launcher_family(tmp_path, var):
    """``%r`` in a trace path is the rank that rank detection knows, whatever the launcher."""
    run = launch(tmp_path, ["--trace", "trace.%r.json", "--summary", "0"], LOOP, "--iterations",
                 "3", env={var: "3"})
    assert run.returncode == 0, run.stderr
    assert [p.name for p in tmp_path.glob("trace.*.json")] == ["trace.3.json"]
    meta = check_trace_file(tmp_path / "trace.3.json")["otherData"]["chainer_autoprof"]
    assert meta["rank"] == 3 and meta["process"]["mpi_rank"] == 3


def test_unwritable_places_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        check_writable(str(tmp_path / "missing" / "t.json"))
    with pytest.raises(ValueError, match="is a directory"):
        check_writable(str(tmp_path))
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ValueError):
        check_writable(str(a_file / "t.json"))
    check_writable(str(tmp_path / "t.%p.json"))


def test_bad_trace_path_is_one_line_before_the_script_starts(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('the script ran')\n")
    bad = tmp_path / "missing" / "t.json"
    run = launch(tmp_path, ["--trace", str(bad)], script)
    assert run.returncode == 2
    assert run.stdout == ""  # the script did not start
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(bad) in lines[0] and "does not exist" in lines[0]


# -- the file -------------------------------------------------------------------------------------

def test_trainer_run_writes_a_valid_trace(tmp_path):
    run = launch(tmp_path, ["--trace", str(tmp_path / "t.%p.json")],
                 EXAMPLES / "train_mnist_synthetic.py", "--epoch", "1", "--samples", "600",
                 env={"CHAINER_PROF_SUMMARY": "0"})
    assert run.returncode == 0, run.stderr
    files = list(tmp_path.glob("t.*.json"))
    assert len(files) == 1
    data = check_trace_file(files[0])
    meta = data["otherData"]["chainer_autoprof"]
    assert files[0].name == f"t.{meta['pid']}.json"
    for key in ("version", "pid", "host", "rank", "command", "settings", "versions", "devices",
                "clock", "dropped_ranges"):
        assert key in meta, key
    assert "train_mnist_synthetic.py" in meta["command"]
    assert meta["settings"]["trace"].endswith("t.%p.json")
    assert {"chainer", "numpy", "python"} <= set(meta["versions"])
    assert meta["dropped_ranges"] == 0
    assert meta["clock"]["duration_ns"] > 0
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    iterations = [e["args"]["iteration"] for e in xs if e["name"] == "iteration"]
    assert iterations == list(range(6))  # 600 samples / batch 100, one epoch
    assert {e["name"] for e in xs} >= {"data", "forward", "backward", "update",
                                        "extension:validation (Evaluator)"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".chainer_autoprof")]


def test_one_track_per_thread(tmp_path):
    source = program("trace_one_track_per_thread")
    trace = tmp_path / "t.json"
    run = run_with_agent(tmp_path, source, settings={"CHAINER_PROF_TRACE": str(trace)},
                         nvtx=False)
    assert run.returncode == 0, run.stderr
    data = check_trace_file(trace)
    threads = {e["args"]["name"]: e["tid"] for e in data["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in xs if e["tid"] == threads["predictor"]] == ["inference"] * 3
    assert [e["name"] for e in xs if e["tid"] == threads["MainThread"]] == ["inference"]


def test_sigterm_leaves_a_complete_trace(tmp_path):
    trace = tmp_path / "t.json"
    run = launch(tmp_path, ["--trace", str(trace)], LOOP,
                 "--end", "sigterm", "--end-at", "12", env={"CHAINER_PROF_SUMMARY": "0"})
    assert run.returncode == -signal.SIGTERM  # still "killed by SIGTERM"
    data = check_trace_file(trace)
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    iterations = [e for e in xs if e["name"] == "iteration"]
    assert [e["args"]["iteration"] for e in iterations] == list(range(13))
    last = iterations[-1]  # open when the signal came: closed by the agent, with its data phase
    inside = [e["name"] for e in xs if e["ts"] >= last["ts"] and e is not last]
    assert inside == ["data"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "t.json"
    target.write_text("previous trace")

    class Broken:
        def __array__(self, *a, **k):
            raise RuntimeError("disk full, say")

    threads = [ThreadRanges(1, "MainThread", [np.array([[0, 0, 10, 0]]), Broken()])]
    with pytest.raises(RuntimeError):
        write_trace(str(target), pid=1, start_ns=0, infos=[("iteration", "iteration", 0)],
                    threads=threads, other={}, process_name="p")
    assert target.read_text() == "previous trace"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_written_ranges_read_back_exactly(tmp_path):
    start = 10**12
    rows = np.array([[1, start + 1_234_567, start + 2_000_001, 1],
                     [0, start + 1_000_000, start + 9_999_999, 0 | (1 << 16)]], dtype=np.int64)
    infos = [("iteration", names.ITERATION, 0xFFFFF100), ("data", names.DATA, 0xFFA05DD6)]
    path = tmp_path / "t.json"
    n = write_trace(str(path), pid=os.getpid(), start_ns=start, infos=infos,
                    threads=[ThreadRanges(7, "MainThread", [rows])],
                    other={"pid": os.getpid()}, process_name="p", main_tid=7)
    assert n == 2
    trace = read_trace(str(path))
    got = [(r.name, r.t0, r.t1, r.depth, r.iteration) for r in trace.ranges]
    assert got == [("iteration", 1_000_000, 9_999_999, 0, 0),
                   ("data", 1_234_567, 2_000_001, 1, None)]
    assert CNAMES[names.DATA] in CHROME_CNAMES
