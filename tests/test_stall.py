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
from support import clean_env, write_script

from chainer_autoprof.common.settings import from_environ

#: A Trainer whose iterator blocks, at the fetches listed in BLOCK_AT, until the
#: test writes a byte to the pipe RELEASE_FD (os.read: blocked inside C).
BLOCKING = """
import os, sys, time
import numpy as np
import chainer, chainer.links as L
from chainer import training

RELEASE = int(os.environ["RELEASE_FD"])
BLOCK_AT = [int(n) for n in os.environ["BLOCK_AT"].split(",")]

class Waiting(chainer.iterators.SerialIterator):
    fetches = 0
    def __next__(self):
        self.fetches += 1
        if self.fetches in BLOCK_AT:
            with open("blocked_at", "a") as f:
                f.write(f"{time.time()}\\n")
            os.read(RELEASE, 1)
        elif self.fetches > BLOCK_AT[0]:
            time.sleep(0.05)  # slow enough for the watch to see the iterations go on
        return super().__next__()
    next = __next__

x = np.random.RandomState(0).rand(64, 4).astype(np.float32)
t = (x.sum(axis=1) > 2).astype(np.int32)
model = L.Classifier(L.Linear(4, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
updater = training.updaters.StandardUpdater(Waiting(chainer.datasets.TupleDataset(x, t), 8),
                                            optimizer)
training.Trainer(updater, (int(os.environ["ITERATIONS"]), "iteration"), out="result").run()
print("finished", flush=True)
"""


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
        since = float(first.split("no new iteration for ")[1].split(" s")[0])
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


KILLED = """
import os, sys, time
import numpy as np
import chainer, chainer.links as L

model = L.Classifier(L.Linear(4, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.random.RandomState(0).rand(64, 4).astype(np.float32)
t = (x.sum(axis=1) > 2).astype(np.int32)

class Slow(chainer.iterators.SerialIterator):
    def __next__(self):
        time.sleep(0.02)   # a data phase that dominates
        return super().__next__()
    next = __next__

it = Slow(chainer.datasets.TupleDataset(x, t), 8)
n = 0
while True:
    batch = it.next()
    xs, ts = chainer.dataset.concat_examples(batch)
    optimizer.update(model, xs, ts)
    print(n, flush=True)
    n += 1
"""


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
    assert "MainThread in iteration" in where
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
            assert "where it was: in iteration" in shown
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
MOVING = """
import os, threading
os.makedirs("elsewhere", exist_ok=True)

def warm_up():
    import numpy as np, chainer, chainer.links as L
    m = L.Classifier(L.Linear(4, 2))
    o = chainer.optimizers.SGD()
    o.setup(m)
    for _ in range(3):
        o.update(m, np.ones((2, 4), np.float32), np.zeros(2, np.int32))

w = threading.Thread(target=warm_up, name="warm-up-thread")
w.start()
w.join()
os.chdir("elsewhere")
""" + KILLED


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
    run = subprocess.run([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                          "--trace", "run.json", "--flush-interval", "0.1", str(script)],
                         env=clean_env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "run.json.partial").st_mode)
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "trace so far" in lines[0] and "a FIFO" in lines[0], lines
    meta = json.loads((tmp_path / "run.json").read_text())["otherData"]["chainer_autoprof"]
    assert meta["pid"] == int(meta["pid"])


def test_bad_stall_setting_is_one_line(tmp_path):
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    launcher = subprocess.run([sys.executable, "-m", "chainer_autoprof", "--stall", "soon",
                               str(script)], env=clean_env(), cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
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
