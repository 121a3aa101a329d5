"""Runs that hang or die: stall reports, on-demand dumps, the trace left after SIGKILL.

Real processes throughout: a training script whose data iterator blocks in C
(``os.read`` on a pipe the test holds), the ``dump`` subcommand talking to
it while it is blocked, a real SIGKILL, and the NVTX streams those
processes recorded through the injection library.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from headless_browser import Browser, find_browser
from nvtx_tool import nvtx_env, ranges_by_thread, read_events
from support import clean_env, native_under_test, program, write_script

from chainer_autoprof.common.settings import from_environ
from chainer_autoprof.lifecycle.monitor import Monitor
from chainer_autoprof.runtime.device import NullBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.policies import SyncPolicy

#: A Trainer whose iterator blocks, at the fetches listed in BLOCK_AT, until the
#: test writes a byte to the pipe RELEASE_FD (os.read: blocked inside C).
BLOCKING = program("stall_blocking")


class Lines:
    """A process's stderr lines, read on a thread so the test can wait for one."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """Read lines until one contains ``text``; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line with {text!r} in {timeout} s:\n"
                                     + "\n".join(self.lines))
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"the stream ended without {text!r}:\n"
                                     + "\n".join(self.lines))
            self.lines.append(line)
            if text in line:
                return line

    def rest(self) -> list[str]:
        self._thread.join(timeout=60)
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return self.lines
            if line is not None:
                self.lines.append(line)


def start(tmp: Path, source: str, env: dict[str, str], pass_fds: tuple[int, ...] = ()
          ) -> tuple[subprocess.Popen, Lines]:
    script = write_script(tmp, "train.py", source)
    run_env = clean_env(CHAINER_PROF_SUMMARY="1", **nvtx_env(tmp / "nvtx.%p.tsv"))
    run_env.update(env)
    proc = subprocess.Popen([sys.executable, "-m", "chainer_autoprof", str(script)],
                            env=run_env, cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, pass_fds=pass_fds)
    return proc, Lines(proc.stderr)


def cli(tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chainer_autoprof", *args], env=clean_env(),
                          cwd=tmp, capture_output=True, text=True, timeout=timeout)


def report_block(lines: list[str], first: int) -> list[str]:
    """The lines of the report starting at ``lines[first]`` (its indented lines)."""
    block = [lines[first]]
    for line in lines[first + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def test_stall_report_names_data_dump_while_blocked_and_a_second_stall(tmp_path):
    read_fd, write_fd = os.pipe()
    proc, err = start(tmp_path, BLOCKING,
                      {"CHAINER_PROF_STALL": "1.5", "CHAINER_PROF_TRACE": "run.json",
                       "CHAINER_PROF_FLUSH_INTERVAL": "1", "RELEASE_FD": str(read_fd),
                       "BLOCK_AT": "6,14", "ITERATIONS": "24"}, pass_fds=(read_fd,))
    os.close(read_fd)
    try:
        # The first stall: the 6th fetch blocks in the data phase of iteration 5, and is
        # reported once it has lasted the configured 1.5 s (a little later on a busy machine).
        first = err.wait_for("chainer_autoprof: stall:")
        arrived = time.time()
        blocked = float((tmp_path / "blocked_at").read_text().split()[0])
        assert 1.5 <= arrived - blocked < 4.5, arrived - blocked
        since = float(first.split("no progress for ")[1].split(" s")[0])
        assert 1.5 <= since < 4.5
        assert f"pid {proc.pid}" in first and "in iteration 5" in first
        err.wait_for("reported once per stall")
        block = report_block(err.lines, err.lines.index(first))
        text = "\n".join(block)
        assert "the training loop): open ranges, outermost first" in text
        opened = [line.split()[0] for line in block if line.endswith(" s")
                  and line.startswith("    ")]
        assert opened == ["iteration", "data"]
        # the user's frame where it waits, and none of the agent's
        assert "in __next__" in text and "os.read(RELEASE, 1)" in text
        assert "chainer_autoprof" not in text.split("innermost frames")[1].split("trace so far")[0]
        partial = tmp_path / "run.json.partial"
        assert f"trace so far: {partial}" in text
        assert partial.exists()

        # On request, while the main thread is still blocked in os.read.
        dump = cli(tmp_path, "dump", str(proc.pid))
        assert dump.returncode == 0, dump.stderr
        assert dump.stdout.startswith(f"chainer_autoprof: report on request: pid {proc.pid}")
        assert "in iteration 5" in dump.stdout and "    iteration" in dump.stdout
        assert "      data" in dump.stdout and "os.read(RELEASE, 1)" in dump.stdout
        err.wait_for("chainer_autoprof: report on request")  # printed by the process too

        # The stall ends, the watch goes on, and the next one is reported again.
        os.write(write_fd, b"x")
        err.wait_for("the stall is over")
        second = err.wait_for("chainer_autoprof: stall:")
        assert "in iteration 13" in second
        os.write(write_fd, b"x")
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(write_fd)
        if proc.poll() is None:
            proc.kill()
    lines = err.rest()
    assert proc.returncode == 0, "\n".join(lines)
    assert out == "finished\n"
    assert sum("chainer_autoprof: stall:" in line for line in lines) == 2
    assert sum("chainer_autoprof: report on request" in line for line in lines) == 1

    # A normal end: the final trace replaces the trace so far, and keeps the stalls.
    assert not (tmp_path / "run.json.partial").exists()
    meta = json.loads((tmp_path / "run.json").read_text())["otherData"]["chainer_autoprof"]
    stalls = meta["stalls"]
    assert [s["iteration"] for s in stalls] == [5, 13]
    for stall in stalls:
        loop = next(t for t in stall["threads"] if t.get("loop"))
        assert [r["name"] for r in loop["open"]] == ["iteration", "data"]
        assert loop["open"][1]["open_s"] >= 1.5
    # Every NVTX stream balanced (a pop for every push), the iterations all there.
    events = read_events(tmp_path / "nvtx.*.tsv")
    ranges = ranges_by_thread(events, "chainer")
    assert sum(text == "iteration" for rows in ranges.values() for _d, text, _c in rows) == 24


KILLED = program("stall_killed")


def test_sigkill_leaves_a_trace_that_report_summarizes(tmp_path):
    proc, err = start(tmp_path, KILLED, {"CHAINER_PROF_TRACE": "run.json",
                                         "CHAINER_PROF_FLUSH_INTERVAL": "0.5"})
    printed: list[str] = []
    try:
        while len(printed) < 60:  # about 1.5 s of training after start-up
            line = proc.stdout.readline()
            assert line, "\n".join(err.rest())
            printed.append(line)
        time.sleep(1.5)
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    last_done = int((printed + rest.splitlines())[-1])
    assert not (tmp_path / "run.json").exists()
    partial = tmp_path / "run.json.partial"
    assert partial.exists()

    # report of the trace path reads the trace so far (the final file was never written)
    report = cli(tmp_path, "report", "run.json", "--html", "report.html")
    assert report.returncode == 0, report.stderr
    assert "reading" in report.stderr and "run.json.partial" in report.stderr
    out = report.stdout
    assert "this run did not end normally: its trace was last written at" in out
    where = next(line for line in out.splitlines() if "where it was:" in line)
    # the last write caught the loop in an iteration, or (rarely: a print to a slow pipe)
    # between two, after the one it had finished
    assert "MainThread in iteration" in where or re.search(
        r"after iteration \d+: MainThread outside every recorded range", where), where
    counted = int(out.split("iterations")[1].split("counted")[0])
    # the iterations that completed up to a few seconds before the death
    assert counted + 3 >= last_done - 60, (counted, last_done)
    assert "Verdict: input-bound" in out
    assert "unfinished (the run did not end)" in out
    html = (tmp_path / "report.html").read_text()
    assert "this run did not end normally" in html
    if find_browser() is not None:  # shown in a real browser, with no error
        with Browser() as browser:
            browser.open(tmp_path / "report.html")
            assert browser.problems() == []
            shown = browser.evaluate("document.querySelector('#abnormal').innerText")
            assert shown.startswith("this run did not end normally")
            assert "where it was: in iteration" in shown or \
                "where it was: after iteration" in shown, shown
            assert browser.evaluate("document.body.dataset.verdict") == "input-bound"

    # A write cut short by the death is ignored: the records before it still read.
    data = partial.read_bytes()
    partial.write_bytes(data[:-5])
    again = cli(tmp_path, "report", str(partial))
    assert again.returncode == 0, again.stderr
    assert "did not end normally" in again.stdout

    # merge turns it into a trace Perfetto opens
    merged = cli(tmp_path, "merge", str(partial), "-o", "job.json")
    assert merged.returncode == 0, merged.stderr
    events = json.loads((tmp_path / "job.json").read_text())["traceEvents"]
    assert sum(ev.get("name") == "iteration" for ev in events) >= counted

    # The NVTX stream up to the kill: every pop had its push (open ranges at the kill allowed).
    ranges_by_thread(read_events(tmp_path / "nvtx.*.tsv"), "chainer", allow_open=True)


#: KILLED, run from a directory it then leaves, after a thread that trained and ended.
MOVING = program("stall_killed_after_moving")


def test_trace_so_far_lies_beside_the_trace_and_names_ended_threads(tmp_path):
    """A relative trace path is the start directory's for the trace so far too, and a thread
    that ended before a background write keeps its name there."""
    proc, err = start(tmp_path, MOVING, {"CHAINER_PROF_TRACE": "run.json",
                                         "CHAINER_PROF_FLUSH_INTERVAL": "0.3"})
    try:
        for _ in range(40):
            assert proc.stdout.readline(), "\n".join(err.rest())
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (tmp_path / "elsewhere" / "run.json.partial").exists()
    partial = tmp_path / "run.json.partial"
    assert partial.exists(), sorted(p.name for p in tmp_path.rglob("*"))
    merged = cli(tmp_path, "merge", str(partial), "-o", "job.json")
    assert merged.returncode == 0, merged.stderr
    events = json.loads((tmp_path / "job.json").read_text())["traceEvents"]
    threads = {ev["tid"]: ev["args"]["name"] for ev in events
               if ev.get("ph") == "M" and ev.get("name") == "thread_name"}
    trained = {threads.get(ev["tid"]) for ev in events
               if ev.get("ph") == "X" and ev.get("name") == "iteration"}
    assert trained == {"warm-up-thread", "MainThread"}, trained


def test_trace_so_far_never_replaces_what_is_not_a_regular_file(tmp_path):
    """A FIFO where the trace so far would go is left alone (one line); the run and its
    final trace are not held up."""
    os.mkfifo(tmp_path / "run.json.partial")
    script = write_script(tmp_path, "train.py", KILLED.replace("while True:",
                                                               "while n < 40:"))
    run = cli(tmp_path, "--summary", "0", "--trace", "run.json", "--flush-interval", "0.1",
              str(script))
    assert run.returncode == 0, run.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "run.json.partial").st_mode)
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "trace so far" in lines[0] and "a FIFO" in lines[0], lines
    meta = json.loads((tmp_path / "run.json").read_text())["otherData"]["chainer_autoprof"]
    assert meta["pid"] == int(meta["pid"])


def test_bad_stall_setting_is_one_line(tmp_path):
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    launcher = cli(tmp_path, "--stall", "soon", str(script), timeout=60)
    assert launcher.returncode == 2
    assert launcher.stdout == ""
    assert launcher.stderr.strip().splitlines() == [
        "python -m chainer_autoprof: error: --stall='soon' is not valid: accepted: seconds "
        "(a number > 0), auto, or 0/off"]
    env_only = subprocess.run([sys.executable, str(script)],
                              env=clean_env(CHAINER_PROF_STALL="-3"), cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    assert env_only.returncode == 0 and env_only.stdout == "ran\n"
    assert env_only.stderr.strip().splitlines() == [
        "chainer_autoprof: CHAINER_PROF_STALL='-3' is not valid: accepted: seconds "
        "(a number > 0), auto, or 0/off; the agent stays off"]


def test_dump_of_a_process_without_the_agent_says_so(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               env=clean_env())
    try:
        result = cli(tmp_path, "dump", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.returncode == 1
    assert f"pid {sleeper.pid}: no agent listens there" in result.stderr


@pytest.mark.parametrize("setting", ["0", "off"])
def test_stall_off(setting):
    assert from_environ({"CHAINER_PROF_STALL": setting}).stall is None
    assert from_environ({"CHAINER_PROF_STALL": "auto"}).stall == "auto"
    assert from_environ({"CHAINER_PROF_STALL": "2.5"}).stall == 2.5


# -- stalls decided on progress (a new iteration, or any instrumented call) -----------------

#: A manual loop fed by its own queue: the producer stops for 4 s after 6 batches, so the
#: loop waits in ``q.get()`` between two iterations, outside every recorded range.
OWN_QUEUE = program("stall_own_queue")


def test_a_loop_waiting_for_its_own_queue_between_iterations_is_a_stall(tmp_path):
    """No recorded range is open while the loop waits in its own ``q.get()``: no progress for
    the threshold is a stall all the same, reported while the wait lasts, then over."""
    proc, err = start(tmp_path, OWN_QUEUE, {"CHAINER_PROF_STALL": "1",
                                            "CHAINER_PROF_SUMMARY": "0"})
    try:
        first = err.wait_for("chainer_autoprof: stall:", timeout=90)
        arrived = time.time()
        paused = float((tmp_path / "paused_at").read_text())
        # The last step ends up to 20 ms before the producer notes its pause: the stall comes
        # 1 s after that step, while the producer sleeps.
        assert 0.9 <= arrived - paused < 4.0, arrived - paused
        assert f"pid {proc.pid}" in first and "after iteration 5" in first, first
        assert "no progress for" in first and "CHAINER_PROF_STALL: 1.00 s" in first
        err.wait_for("reported once per stall")
        block = "\n".join(report_block(err.lines, err.lines.index(first)))
        assert "MainThread" in block and "no open range" in block
        assert "x, t = q.get()" in block  # where the loop waits
        over = err.wait_for("the stall is over")
        assert "progress again after" in over
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.rest()
    assert proc.returncode == 0, "\n".join(lines)
    assert out == "finished\n"
    assert sum("chainer_autoprof: stall:" in line for line in lines) == 1


#: Training (a Trainer, or a manual loop), then healthy inference for 3 s: many quick
#: forward passes outside training.  With a Trainer, the program then rests 2.5 s.
INFERENCE_AFTER = program("stall_inference_after")


@pytest.mark.parametrize("loop", ["trainer", "manual"])
def test_healthy_inference_after_training_is_no_stall(tmp_path, loop):
    script = write_script(tmp_path, "infer.py", INFERENCE_AFTER)
    run = cli(tmp_path, "--summary", "0", "--stall", "1", str(script), loop, timeout=180)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("inference calls ")
    assert int(run.stdout.split()[-1]) > 50  # it ran inference all along
    assert "stall" not in run.stderr and "Timeout" not in run.stderr, run.stderr


#: A Trainer whose extension evaluates for 63 s, calling the model all along.
LONG_EVALUATION = program("stall_long_evaluation")


@pytest.mark.skipif(not native_under_test(), reason="a minute of evaluation, the same for "
                    "both hot paths: it runs once, on the native one")
def test_auto_does_not_report_a_long_evaluation_that_makes_progress(tmp_path):
    """``--stall auto`` used to report every evaluation longer than 60 s."""
    script = write_script(tmp_path, "evaluate.py", LONG_EVALUATION)
    run = cli(tmp_path, "--summary", "0", "--stall", "auto", str(script), timeout=400)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "finished\n"
    assert run.stderr == "", run.stderr


class _Counting:
    """The watchdog's view of a training: a real tracer whose counts the test moves."""

    def __init__(self) -> None:
        self.tracer = Tracer(1, SyncPolicy(0, NullBackend()))
        self.calls = 0


def test_auto_learns_the_longest_pause_and_reports_a_longer_one(capsys):
    """``auto``: 60 s until 10 iterations have begun, then 5x the longest pause without
    progress seen so far, at least 60 s.  Times are the watchdog's own (``check(now)``)."""
    run = _Counting()
    monitor = Monitor(run.tracer, "auto", None, progress=lambda: run.calls)
    now = 1000.0

    def step(seconds: float, iteration: bool = True) -> bool:
        nonlocal now
        now += seconds
        if iteration:
            run.tracer.iterations += 1
        run.calls += 1
        return monitor.check(now)

    def quiet_until(seconds: float) -> bool:
        """No progress for ``seconds``, looked at every second: whether a stall was reported."""
        nonlocal now
        reported = False
        for _ in range(int(seconds)):
            now += 1.0
            reported = monitor.check(now) or reported
        return reported

    step(0.0)
    assert monitor.threshold() == 60.0  # before 10 iterations
    assert not quiet_until(59)           # a slow first iteration: no stall yet
    for _ in range(20):
        step(0.5)
    assert monitor.threshold() == 5 * 59.5  # the pause of 59.5 s seen above, five times over
    assert not quiet_until(200)          # an evaluation of 200 s without progress: fine
    step(1.0)
    assert monitor.threshold() == 5 * 201.0
    assert not quiet_until(1004)
    assert quiet_until(2) and monitor.in_stall  # five times the longest pause: a stall
    report = capsys.readouterr().err
    assert "chainer_autoprof: stall: no progress for" in report
    assert "CHAINER_PROF_STALL=auto: 16.8 min, 5x the longest pause seen so far (201.00 s), " \
        "at least 60 s" in report, report
    step(1.0)
    assert "the stall is over" in capsys.readouterr().err

    fast = _Counting()  # a run without long pauses: 60 s, the floor
    monitor = Monitor(fast.tracer, "auto", None, progress=lambda: fast.calls)
    for _ in range(30):
        now += 0.2
        fast.tracer.iterations += 1
        fast.calls += 5
        monitor.check(now)
    assert monitor.threshold() == 60.0


def test_the_watch_rests_once_the_trainer_has_returned():
    """After ``Trainer.run`` returns nothing is training: no stall until a new iteration."""
    run = _Counting()
    runs = [0]  # Trainer.run calls
    monitor = Monitor(run.tracer, 2.0, None, progress=lambda: run.calls,
                      trainer_runs=lambda: runs[0])
    state = run.tracer.state()
    state.in_trainer = 1
    run.tracer.iterations, run.calls = 5, 40
    assert not monitor.check(100.0)
    assert monitor.check(102.5)          # inside Trainer.run, no progress: a stall
    state.in_trainer = 0                 # the trainer returned
    run.calls += 1
    assert not monitor.check(103.0)
    assert not monitor.check(200.0) and not monitor.watching
    run.tracer.iterations += 1           # a loop of its own: watched again
    run.calls += 1
    assert not monitor.check(201.0) and monitor.watching
    assert monitor.check(203.5)
    # a trainer that ran on, and returned, between two looks: its iterations, not a loop's
    state.in_trainer = 1
    run.calls += 1
    assert not monitor.check(204.0) and monitor.watching
    state.in_trainer = 0
    run.tracer.iterations += 3
    run.calls += 30
    assert not monitor.check(204.1)
    assert not monitor.check(300.0) and not monitor.watching
    # one that ran entirely between two looks
    run.tracer.iterations += 1
    run.calls += 1
    assert not monitor.check(301.0) and monitor.watching
    runs[0] += 1
    run.tracer.iterations += 4
    run.calls += 40
    assert not monitor.check(301.1)
    assert not monitor.check(400.0) and not monitor.watching


# -- the last resort: C code that holds the GIL -------------------------------------------------

#: A manual loop whose 21st step blocks in C *holding the GIL* (ctypes.PyDLL does not release
#: it): ``read`` on a pipe the test holds.  No Python thread can run meanwhile.
GIL_HELD = program("stall_gil_held")


def test_a_hang_in_c_holding_the_gil_still_gets_every_stack(tmp_path):
    read_fd, write_fd = os.pipe()
    proc, err = start(tmp_path, GIL_HELD, {"CHAINER_PROF_STALL": "1",
                                           "CHAINER_PROF_SUMMARY": "0",
                                           "RELEASE_FD": str(read_fd)}, pass_fds=(read_fd,))
    os.close(read_fd)
    try:
        assert proc.stdout.readline() == "holding\n", "\n".join(err.rest())
        # faulthandler's own thread writes every thread's stack, without the GIL
        err.wait_for("Timeout (0:00:02)!", timeout=30)
        err.wait_for("(most recent call first):")
        number = GIL_HELD.splitlines().index("        libc.read(RELEASE, buf, 1)   # "
                                             "blocked in C, the GIL held") + 1
        line = err.wait_for(f'train.py", line {number} in <module>', timeout=10)
        assert line.strip().startswith("File ")
        # dump cannot get an answer, and says why
        dump = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump", "--no-print",
                               "--timeout", "3", str(proc.pid)], env=clean_env(),
                              capture_output=True, text=True, timeout=60)
        assert dump.returncode == 1
        assert f"pid {proc.pid}: no answer within 3 s: its agent's threads could not run: " \
               "most likely a thread holds the GIL in C code" in dump.stderr, dump.stderr
        os.write(write_fd, b"x")
        said = err.wait_for("are this process's, by the agent's last resort (faulthandler)")
        assert "after 'Timeout (0:00:02)!'" in said and "no Python thread could run for" in said
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(write_fd)
        if proc.poll() is None:
            proc.kill()
    lines = err.rest()
    assert proc.returncode == 0, "\n".join(lines)
    assert out == "finished\n"
    assert sum(line.startswith("Timeout (") for line in lines) == 1


#: The watchdog on, a forked child that ends normally (its interpreter's finalization cancels
#: faulthandler's timer), and the program's own use of that timer.
FORK_AND_OWN_TIMER = program("stall_fork_and_own_timer")


@pytest.mark.parametrize("mode", ["fork", "own"])
def test_the_last_resort_never_harms_forks_or_the_programs_own_timer(tmp_path, mode):
    script = write_script(tmp_path, "train.py", FORK_AND_OWN_TIMER)
    run = cli(tmp_path, "--summary", "0", "--stall", "1", str(script), mode)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "child ended\nfinished\n"
    if mode == "own":
        assert "chainer_autoprof: stall:" in run.stderr  # the watchdog itself still reports
    assert "Timeout (" not in run.stderr and "last resort" not in run.stderr, run.stderr


#: Training, then a wait in C; stderr is filled first, so that the stall report cannot be
#: written (a full pipe: a reader that stalls, a terminal on hold, a loaded mpiexec).
STDERR_HELD = program("stall_stderr_held")


def test_dump_answers_the_moment_a_stall_is_reported_even_while_stderr_blocks(tmp_path):
    """A stall report that cannot be written yet (stderr full) must not keep ``dump`` from
    the process: the answer goes first, the printing after."""
    import fcntl

    read_fd, write_fd = os.pipe()
    script = write_script(tmp_path, "train.py", STDERR_HELD)
    proc = subprocess.Popen([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                             "--stall", "1", str(script)],
                            env=clean_env(RELEASE_FD=str(read_fd)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            pass_fds=(read_fd,))
    os.close(read_fd)
    fcntl.fcntl(proc.stderr.fileno(), fcntl.F_SETPIPE_SZ, 4096)  # before it writes anything
    try:
        assert proc.stdout.readline() == "waiting\n"
        time.sleep(3)  # the stall (1 s) is being reported now, into a full stderr
        dump = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump",
                               "--timeout", "10", str(proc.pid)], env=clean_env(),
                              capture_output=True, text=True, timeout=60)
        assert dump.returncode == 0, dump.stderr
        assert dump.stdout.startswith(f"chainer_autoprof: report on request: pid {proc.pid}")
        assert "os.read(int(os.environ" in dump.stdout
        os.write(write_fd, b"x")
        out, err = proc.communicate(timeout=120)  # reading stderr lets everything through
    finally:
        os.close(write_fd)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out == "finished\n"
    assert "chainer_autoprof: stall:" in err and "chainer_autoprof: report on request" in err
