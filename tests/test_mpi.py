"""ChainerMN under real MPI: per-rank traces, communication ranges, rank selection, merge."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import pytest
from nvtx_tool import nvtx_env, ranges_by_thread, read_events
from support import EXAMPLES, REPO, clean_env, program

from chainer_autoprof.common.rank import from_environ as rank_from_environ
from chainer_autoprof.common.settings import SettingsError
from chainer_autoprof.common.settings import from_environ as settings_from_environ
from chainer_autoprof.report import merge as merge_module

ITERATIONS = 10


@lru_cache(maxsize=1)
def _mpiexec() -> tuple[str, ...] | None:
    """The ``mpiexec`` command line prefix, or ``None`` where MPI is absent."""
    exe = shutil.which("mpiexec")
    if exe is None:
        return None
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if "Open MPI" in version or "OpenRTE" in version:
        return (exe, "--oversubscribe")  # 2 ranks on a machine that may have fewer cores
    return (exe,)


def _missing_mpi() -> str | None:
    if _mpiexec() is None:
        return "MPI is not installed (no mpiexec on PATH; .ci/run installs openmpi-bin)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (.ci/run installs it)"
    return None


needs_mpi = pytest.mark.skipif(_missing_mpi() is not None, reason=_missing_mpi() or "")


def run_mpi(tmp: Path, launcher_args: list[str], script_args: list[str],
            env: dict[str, str] | None = None, ranks: int = 2) -> subprocess.CompletedProcess:
    """``mpiexec -n RANKS python -m chainer_autoprof ARGS examples/train_mn.py ARGS`` in ``tmp``."""
    run_env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_btl_base_warn_component_unused="0",
                        CHAINER_AUTOPROF_TEST_DEVICE="counting",
                        CHAINER_AUTOPROF_TEST_DEVICE_LOG=str(tmp / "device.%p.log"))
    run_env.update(nvtx_env(tmp / "nvtx.%p.tsv"))
    run_env.update(env or {})
    cmd = [*(_mpiexec() or ()), "-n", str(ranks), sys.executable, "-m", "chainer_autoprof",
           "--summary", "0", *launcher_args, str(EXAMPLES / "train_mn.py"),
           "-i", str(ITERATIONS), "-o", str(tmp / "result"), *script_args]
    proc = subprocess.run(cmd, env=run_env, cwd=tmp, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert f"ranks: {ranks}  iterations: {ITERATIONS}" in proc.stdout
    return proc


def merge(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chainer_autoprof", "merge", *args],
                          env=clean_env(), cwd=tmp, capture_output=True, text=True, timeout=120)


def complete_events(path: Path) -> list[dict]:
    return [ev for ev in json.loads(path.read_text())["traceEvents"] if ev["ph"] == "X"]


def inside(inner: dict, outer: dict) -> bool:
    return outer["ts"] <= inner["ts"] and \
        inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


@needs_mpi
def test_rank_traces_communication_and_merge(tmp_path):
    run_mpi(tmp_path, ["--trace", "rank%r.json"], [])
    pids = {}
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        meta = json.loads(path.read_text())["otherData"]["chainer_autoprof"]
        assert meta["rank"] == rank
        assert meta["process"]["world_size"] == 2
        assert meta["process"]["rank_source"]  # the launcher named it
        assert meta["process"]["clock_reference"]["op"] == "comm:multi_node_mean_grad"
        pids[rank] = meta["pid"]

        events = complete_events(path)
        iterations = [e for e in events if e["name"] == "iteration"]
        updates = [e for e in events if e["name"] == "update"]
        comm = [e for e in events if e["cat"] == "comm"]
        assert len(iterations) == ITERATIONS
        names = {e["name"] for e in comm}
        # Gradient all-reduce, parameter broadcast and the data set's scatter.
        assert {"comm:multi_node_mean_grad", "comm:bcast_data", "comm:scatter_dataset"} <= names
        # Each iteration's update holds exactly one communication: the all-reduce
        # (or, the first time, the broadcast of the parameters).
        for it in iterations:
            update = [u for u in updates if inside(u, it)]
            assert len(update) == 1
            in_update = [c for c in comm if inside(c, update[0])]
            assert len(in_update) == 1
            assert in_update[0]["name"] in ("comm:multi_node_mean_grad", "comm:bcast_data")
        assert "comm:scatter_dataset" not in {c["name"] for c in comm
                                              if any(inside(c, it) for it in iterations)}

    # NVTX: each rank tagged by a process-wide "rank N" range; iterations balanced.
    events = read_events(tmp_path / "nvtx.*.tsv")
    tags = {ev.pid: ev.text for ev in events if ev.event == "start" and ev.domain == "chainer"}
    assert tags == {pids[0]: "rank 0", pids[1]: "rank 1"}
    pushed: dict[int, int] = {}
    for (pid, _tid), ranges in ranges_by_thread(events, "chainer").items():
        pushed[pid] = pushed.get(pid, 0) + sum(1 for _d, t, _c in ranges if t == "iteration")
    assert pushed == {pids[0]: ITERATIONS, pids[1]: ITERATIONS}

    # Merge: one valid trace, one process track per rank, clocks aligned.
    result = merge(tmp_path, "rank0.json", "rank1.json", "-o", "job.json")
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "job.json").read_text())
    tracks = {ev["pid"]: ev["args"]["name"] for ev in data["traceEvents"]
              if ev["ph"] == "M" and ev["name"] == "process_name"}
    assert sorted(name.split(" (")[0] for name in tracks.values()) == ["rank 0", "rank 1"]
    by_rank = {int(name.split()[1]): pid for pid, name in tracks.items()}
    merged = [ev for ev in data["traceEvents"] if ev["ph"] == "X"]
    assert all(ev["ts"] >= 0 for ev in merged)
    assert len(merged) == sum(len(complete_events(tmp_path / f"rank{r}.json")) for r in (0, 1))
    # An all-reduce completes on every rank at once: on the merged timeline the
    # k-th all-reduce of rank 0 and of rank 1 overlap.
    allreduce = {r: sorted((ev for ev in merged if ev["pid"] == by_rank[r]
                            and ev["name"] == "comm:multi_node_mean_grad"),
                           key=lambda ev: ev["ts"]) for r in (0, 1)}
    assert len(allreduce[0]) == len(allreduce[1]) >= ITERATIONS - 1
    for a, b in zip(allreduce[0], allreduce[1]):
        assert a["ts"] <= b["ts"] + b["dur"] and b["ts"] <= a["ts"] + a["dur"]
    summary = data["otherData"]["chainer_autoprof"]["summary"]
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert "rank 0" in result.stdout and "rank 1" in result.stdout

    # The collective reference (for ranks on different hosts) agrees with the
    # shared clock of this host (up to the scheduling noise of a busy machine).
    result = merge(tmp_path, "rank0.json", "rank1.json", "-o", "job2.json", "--align",
                   "collective", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    alignment = json.loads((tmp_path / "job2.json").read_text())["otherData"][
        "chainer_autoprof"]["summary"]["alignment"]
    assert [a["method"] for a in alignment] == ["reference", "collective"]
    assert abs(alignment[1]["offset_ns"]) < 25_000_000


@needs_mpi
def test_slowed_rank_is_named_straggler(tmp_path):
    slow_ms = 40.0
    run_mpi(tmp_path, ["--trace", "rank%r.json"], ["--slow-rank", "0", "--slow-ms", str(slow_ms)])
    result = merge(tmp_path, "rank0.json", "rank1.json", "-o", "job.json")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "job.json").read_text())["otherData"]["chainer_autoprof"][
        "summary"]
    straggler = summary["straggler"]
    assert straggler["rank"] == 0
    # Rank 1 waits in the all-reduce for about the delay of rank 0.
    assert straggler["held_back_ms_per_iteration"] > slow_ms / 2
    ranks = {r["rank"]: r for r in summary["ranks"]}
    assert ranks[1]["comm_ms_per_iteration"] > ranks[0]["comm_ms_per_iteration"] + slow_ms / 2
    assert "slowest rank (straggler): 0" in result.stdout


@needs_mpi
def test_uneven_waits_in_the_all_reduce_are_communication_and_never_balanced(tmp_path):
    """Rank 0 is 100 ms slower in every 4th forward only: rank 1 waits that long in the
    all-reduce inside its update.  Its summary shows the communication as a row and a verdict
    of its own (not its update's compute); merge's columns add up (means per iteration) and
    the long waits are named, never "balanced"."""
    slow_ms = 100.0
    run_mpi(tmp_path, ["--trace", "rank%r.json"], ["--slow-rank", "0", "--slow-ms",
                                                   str(slow_ms), "--slow-every", "4"])
    report = subprocess.run([sys.executable, "-m", "chainer_autoprof", "report", "rank1.json"],
                            env=clean_env(), cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stderr
    text = report.stdout
    row = re.search(r"of those, communication \(comm:\*\)\s+\S+ m?s\s+([\d.]+)%", text)
    assert row and float(row.group(1)) >= 25.0, text
    verdict = next(line for line in text.splitlines() if line.startswith("Verdict:"))
    assert verdict.startswith("Verdict: communication-bound"), text
    assert "comm:multi_node_mean_grad" in text
    assert "compute-bound" not in verdict and "the parameter update takes" not in text

    result = merge(tmp_path, "rank0.json", "rank1.json", "-o", "job.json")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "job.json").read_text())["otherData"]["chainer_autoprof"][
        "summary"]
    ranks = {r["rank"]: r for r in summary["ranks"]}
    for r in ranks.values():  # the columns add up
        assert r["comm_ms_per_iteration"] + r["compute_ms_per_iteration"] == \
            pytest.approx(r["iteration_ms_mean"])
    table = [line.split() for line in result.stdout.splitlines()
             if line.startswith("  rank ")]
    assert len(table) == 2
    for cells in table:  # ... as printed too
        iteration, comm, compute = float(cells[3]), float(cells[4]), float(cells[6])
        assert iteration == pytest.approx(comm + compute, abs=0.011), cells
    straggler = summary["straggler"]
    assert straggler["rank"] == 0 and not straggler["balanced"]
    assert ranks[1]["wait_ms_max"] > slow_ms / 2  # rank 1 waited in the slow iterations
    assert straggler["longest_wait_ms"] >= ranks[1]["wait_ms_max"]
    assert "balanced" not in result.stdout
    assert (f"the longest wait: {straggler['longest_wait_ms']:.2f} ms, rank "
            f"{straggler['longest_wait_rank']} in counted iteration") in result.stdout


@needs_mpi
def test_ranks_setting_selects_ranks(tmp_path):
    run_mpi(tmp_path, ["--trace", "rank%r.json", "--ranks", "1"], [])
    assert sorted(p.name for p in tmp_path.glob("rank*.json")) == ["rank1.json"]
    events = read_events(tmp_path / "nvtx.*.tsv")
    pid1 = json.loads((tmp_path / "rank1.json").read_text())["otherData"]["chainer_autoprof"][
        "pid"]
    assert {ev.pid for ev in events if ev.event in ("push", "start")} == {pid1}


@pytest.mark.parametrize("environ, expected", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "SLURM_PROCID": "0"},
     (3, 8, "Open MPI")),
    ({"PMI_RANK": "5", "PMI_SIZE": "6"}, (5, 6, "MPICH/PMI")),
    ({"MV2_COMM_WORLD_RANK": "7", "MV2_COMM_WORLD_SIZE": "9"}, (7, 9, "MVAPICH")),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}, (2, 4, "Slurm")),
    ({"PMIX_RANK": "1"}, (1, None, "PMIx")),
    ({"PMI_RANK": ""}, None),
    ({}, None),
])
def test_rank_from_launcher_environment(environ, expected):
    info = rank_from_environ(environ)
    assert (None if info is None else (info.rank, info.size, info.source)) == expected


COMMUNICATOR_ONLY = program("mpi_communicator_only")


@needs_mpi
def test_percent_r_is_the_communicators_rank_when_no_launcher_says(tmp_path):
    """A rank known only from the ChainerMN communicator names its own trace file."""
    script = tmp_path / "comm_only.py"
    script.write_text(COMMUNICATOR_ONLY)
    run_env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_btl_base_warn_component_unused="0")
    proc = subprocess.run([*(_mpiexec() or ()), "-n", "2", sys.executable, "-m",
                           "chainer_autoprof", "--summary", "0", "--trace", "rank%r.json",
                           str(script)], env=run_env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert sorted(proc.stdout.splitlines()) == ["rank 0 of 2", "rank 1 of 2"]
    assert sorted(p.name for p in tmp_path.glob("rank*.json")) == ["rank0.json", "rank1.json"]
    for number in (0, 1):
        meta = json.loads((tmp_path / f"rank{number}.json").read_text())["otherData"][
            "chainer_autoprof"]
        assert meta["rank"] == number
        assert meta["process"]["rank_source"] == "communicator"


@needs_mpi
def test_hung_rank_is_named_the_odd_one_out(tmp_path):
    """Rank 1 stops in its forward pass; rank 0 waits in the gradient all-reduce.

    Both ranks' watchdogs report the stall; ``dump`` (while both main threads
    are blocked, rank 0 inside MPI) and ``merge`` of the traces so far name
    rank 1; released, the job ends normally with balanced NVTX streams.
    """
    release = tmp_path / "release"
    run_env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_btl_base_warn_component_unused="0",
                        CHAINER_AUTOPROF_TEST_DEVICE="counting",
                        CHAINER_AUTOPROF_TEST_DEVICE_LOG=str(tmp_path / "device.%p.log"))
    run_env.update(nvtx_env(tmp_path / "nvtx.%p.tsv"))
    cmd = [*(_mpiexec() or ()), "-n", "2", sys.executable, "-m", "chainer_autoprof",
           "--summary", "0", "--stall", "2", "--trace", "rank%r.json",
           str(EXAMPLES / "train_mn.py"), "-i", str(ITERATIONS), "-o", str(tmp_path / "result"),
           "--hang-rank", "1", "--hang-at", "5", "--hang-until", str(release)]
    proc = subprocess.Popen(cmd, env=run_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        reports: dict[int, int] = {}  # rank -> pid, from the stall reports on stderr
        deadline = time.monotonic() + 120
        lines = []
        while len(reports) < 2 and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "chainer_autoprof: stall:" in line:
                assert "in iteration 5" in line
                pid = int(line.split(" pid ")[1].split()[0])
                reports[int(line.split(", rank ")[1].split()[0])] = pid
        assert sorted(reports) == [0, 1], "".join(lines)
        for rank in (0, 1):
            assert (tmp_path / f"rank{rank}.json.partial").exists()

        dump = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump", "--no-print",
                               str(reports[0]), str(reports[1])], env=clean_env(),
                              capture_output=True, text=True, timeout=120)
        assert dump.returncode == 0, dump.stderr
        odd = [line for line in dump.stdout.splitlines() if line.startswith("odd one out:")]
        assert odd == [odd[0]] and odd[0].startswith("odd one out: rank 1 is in forward "
                                                     "(iteration 5, open ")
        assert odd[0].endswith("rank 0 waits in comm:multi_node_mean_grad")

        merged = merge(tmp_path, "rank0.json.partial", "rank1.json.partial", "-o", "hung.json")
        assert merged.returncode == 0, merged.stderr
        assert "where each rank was" in merged.stdout
        assert odd[0].split(" (iteration")[0] in merged.stdout
        summary = json.loads((tmp_path / "hung.json").read_text())["otherData"][
            "chainer_autoprof"]["summary"]
        assert summary["where"]["odd_one_out"] == [1]

        release.write_text("go")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert f"ranks: 2  iterations: {ITERATIONS}" in out
    # a normal end: final traces, no partial ones; the stalls kept in the metadata
    assert not list(tmp_path.glob("*.partial"))
    for rank in (0, 1):
        meta = json.loads((tmp_path / f"rank{rank}.json").read_text())["otherData"][
            "chainer_autoprof"]
        assert [s["iteration"] for s in meta["stalls"]] == [5]
    final = merge(tmp_path, "rank0.json", "rank1.json", "-o", "job.json")
    assert final.returncode == 0, final.stderr
    assert odd[0].split(" (iteration")[0] in final.stdout
    events = read_events(tmp_path / "nvtx.*.tsv")
    pushed = sum(text == "iteration" for rows in ranges_by_thread(events, "chainer").values()
                 for _d, text, _c in rows)
    assert pushed == 2 * ITERATIONS


# -- several ranks, one trace path ---------------------------------------------------------------

def _mpi_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_btl_base_warn_component_unused="0")
    env.update(extra)
    return env


def _site_shim(tmp: Path) -> str:
    """PYTHONPATH whose sitecustomize processes the project's ``.pth`` file, as installed."""
    shim = tmp / "site_shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(REPO)!r})\n")
    return f"{shim}:{REPO}"


def _train_mn(tmp: Path, launcher: list[str], env: dict[str, str],
              python_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [*(_mpiexec() or ()), "-n", "2", sys.executable, *python_args, *launcher,
           str(EXAMPLES / "train_mn.py"), "-i", "4", "-o", str(tmp / "result")]
    return subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=180)


@needs_mpi
@pytest.mark.parametrize("template", ["run.json", "run-%h.json", "run-%q{CAPROF_SAME}.json"])
def test_ranks_given_one_trace_path_are_refused_before_the_script_runs(tmp_path, template):
    """Two ranks, one file: the launcher refuses before the script runs (no trace lost)."""
    run = _train_mn(tmp_path, ["-m", "chainer_autoprof", "--summary", "0", "--trace", template],
                    _mpi_env(tmp_path, CAPROF_SAME="same"))
    assert run.returncode != 0
    assert "ranks: 2" not in run.stdout  # the script never ran
    refused = [line for line in run.stderr.splitlines() if "--trace=" in line]
    assert len(refused) == 2, run.stderr  # each rank, one line
    for line in refused:
        assert line.startswith(f"python -m chainer_autoprof: error: --trace={template!r} is "
                               "not valid: accepted: a path that differs per MPI rank: ")
        assert "put %r (the rank) in it" in line
    assert not list(tmp_path.glob("run*"))


@needs_mpi
def test_ranks_given_one_trace_path_by_the_environment_run_without_the_agent(tmp_path):
    """Environment only, no launcher to refuse: each rank says so in one line, the agent stays
    off, and the job runs as without it."""
    run = _train_mn(tmp_path, [], _mpi_env(tmp_path, CHAINER_PROF_TRACE="run.json",
                                           PYTHONPATH=_site_shim(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert "ranks: 2  iterations: 4" in run.stdout
    lines = run.stderr.splitlines()
    said = [line for line in lines if line.startswith("chainer_autoprof: ")]
    assert len(said) == 2 and said == lines, run.stderr
    for line in said:
        assert line.startswith("chainer_autoprof: CHAINER_PROF_TRACE='run.json' is not valid: "
                               "accepted: a path that differs per MPI rank: the 2 ranks of "
                               "this Open MPI job would all write run.json")
        assert line.endswith("; the agent stays off")
    assert not list(tmp_path.glob("run*"))


@needs_mpi
@pytest.mark.parametrize("launcher, files", [
    (["--ranks", "1", "--trace", "run.json"], {"run.json": 1}),
    (["--trace", "run-%q{OMPI_COMM_WORLD_RANK}.json"], {"run-0.json": 0, "run-1.json": 1}),
    (["--trace", "run-%h-%q{OMPI_COMM_WORLD_LOCAL_RANK}.json"], None),
])
def test_paths_that_keep_the_ranks_apart_are_accepted(tmp_path, launcher, files):
    run = _train_mn(tmp_path, ["-m", "chainer_autoprof", "--summary", "0", *launcher],
                    _mpi_env(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "ranks: 2  iterations: 4" in run.stdout
    if files is None:
        host = socket.gethostname()
        files = {f"run-{host}-0.json": 0, f"run-{host}-1.json": 1}
    assert sorted(p.name for p in tmp_path.glob("run*")) == sorted(files)
    for name, number in files.items():
        meta = json.loads((tmp_path / name).read_text())["otherData"]["chainer_autoprof"]
        assert meta["rank"] == number


#: The rank is learned from the communicator only, after the agent started: no launcher
#: variable was there to refuse the shared path at the start.
LATE_RANK = program("mpi_late_rank")


@needs_mpi
def test_ranks_sharing_a_path_learned_late_each_keep_their_trace(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(LATE_RANK)
    proc = subprocess.run([*(_mpiexec() or ()), "-n", "2", sys.executable, str(script)],
                          env=_mpi_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert sorted(p.name for p in tmp_path.glob("run*")) == ["run.rank0.json", "run.rank1.json"]
    for number in (0, 1):
        meta = json.loads((tmp_path / f"run.rank{number}.json").read_text())["otherData"][
            "chainer_autoprof"]
        assert meta["rank"] == number and meta["process"]["rank_source"] == "communicator"
        assert f"rank {number} writes run.rank{number}.json instead" in proc.stderr
    assert len(proc.stderr.splitlines()) == 2, proc.stderr


_OMPI4 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
          "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}


@pytest.mark.parametrize("trace, environ, refused", [
    ("run.json", _OMPI4, "the 4 ranks of this Open MPI job would all write run.json"),
    ("rank%r.json", _OMPI4, None),
    ("run.%p.json", _OMPI4, None),
    ("run-%q{OMPI_COMM_WORLD_RANK}.json", _OMPI4, None),
    ("run-%q{OMPI_COMM_WORLD_LOCAL_RANK}.json", _OMPI4,
     "ranks with the same rank on their host, on different hosts (4 ranks, 2 here)"),
    ("run-%h-%q{OMPI_COMM_WORLD_LOCAL_RANK}.json", _OMPI4, None),
    ("run-%h.json", _OMPI4, "the ranks on one host (2 here)"),
    ("run-%h.json", {**_OMPI4, "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, None),
    ("run%%r.json", _OMPI4, "would all write run%r.json"),
    ("run.json", {**_OMPI4, "CHAINER_PROF_RANKS": "2,7"}, None),  # one rank of 4 writes
    ("run.json", {**_OMPI4, "CHAINER_PROF_RANKS": "0,1,2"}, "the 3 ranks of this Open MPI job "
     "that profile (CHAINER_PROF_RANKS)"),
    ("run.json", {"PMI_RANK": "0", "PMI_SIZE": "2"}, "the 2 ranks of this MPICH/PMI job"),
    ("run.json", {"PMI_RANK": "0", "PMI_SIZE": "1"}, None),
    # a Slurm batch script on its own has SLURM_PROCID and SLURM_NTASKS, but no job step
    ("run.json", {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None),
    ("run.json", {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4"}, "the 4 ranks"),
    ("run-%h.json", {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4",
                     "SLURM_STEP_TASKS_PER_NODE": "1(x4)"}, None),
    ("run-%h.json", {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4",
                     "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, "the ranks on one host (2 here)"),
    # a child process writes beside its parent's file, with .PID added
    ("run.json", {**_OMPI4, "_CHAINER_PROF_ROOT_PID": "1"}, None),
])
def test_which_paths_tell_the_ranks_of_a_job_apart(trace, environ, refused):
    environ = {"CHAINER_PROF_TRACE": trace, **environ}
    if refused is None:
        assert settings_from_environ(environ).trace == trace
        return
    with pytest.raises(SettingsError) as caught:
        settings_from_environ(environ)
    message = str(caught.value)
    assert message.startswith(f"CHAINER_PROF_TRACE={trace!r} is not valid: accepted: a path "
                              "that differs per MPI rank: ")
    assert refused in message and "put %r (the rank) in it" in message


def _rank(number: int, compute: list[float], comm: list[float]) -> merge_module.RankStats:
    return merge_module.RankStats(
        label=f"rank {number}", rank=number, host="h", pid=100 + number, child=False,
        iterations=len(compute), iteration_ms=[a + b for a, b in zip(compute, comm)],
        comm_ms=list(comm))


@pytest.mark.parametrize("slow_at", [(3,), (3, 7), (1, 4, 8)])
@pytest.mark.parametrize("wait_ms", [60.0, 140.0])
def test_balanced_never_hides_waits_of_a_few_iterations(slow_at, wait_ms):
    """Rank 0 is slower in a few iterations only: the medians of its parts are those of a
    balanced job, the waits of rank 1 in those iterations are not."""
    n = 10
    compute0 = [18.0 + (wait_ms if k in slow_at else 0.0) for k in range(n)]
    stats = [_rank(0, compute0, [2.0] * n),
             _rank(1, [18.0] * n, [2.0 + (wait_ms if k in slow_at else 0.0) for k in range(n)])]
    merge_module.note_waits(stats)
    slow = merge_module.straggler(stats)
    assert slow is not None and slow["rank"] == 0 and not slow["balanced"]
    assert slow["longest_wait_ms"] == pytest.approx(wait_ms)
    assert (slow["longest_wait_rank"], slow["longest_wait_iteration"]) == (1, slow_at[0])
    rows = [s.as_dict() for s in stats]
    for row in rows:  # means that add up
        assert row["comm_ms_per_iteration"] + row["compute_ms_per_iteration"] == \
            pytest.approx(row["iteration_ms_mean"])
    assert rows[1]["wait_ms_max"] == pytest.approx(wait_ms)
    text = merge_module.format_summary(
        {"ranks": rows, "straggler": slow, "where": {"positions": [], "odd_one_out": [],
                                                    "odd_one_out_text": ""},
         "alignment": []}, "job.json")
    assert "balanced" not in text
    assert f"the longest wait: {wait_ms:.2f} ms, rank 1 in counted iteration {slow_at[0]}" \
        in text


def test_ranks_are_balanced_only_when_every_wait_is_short():
    stats = [_rank(0, [18.0, 18.5, 18.2, 18.1], [2.0, 1.5, 1.8, 1.9]),
             _rank(1, [18.3, 18.0, 18.4, 18.0], [1.7, 2.0, 1.6, 2.0])]
    merge_module.note_waits(stats)
    slow = merge_module.straggler(stats)
    assert slow is not None and slow["balanced"]
    assert slow["longest_wait_ms"] == pytest.approx(0.5)
