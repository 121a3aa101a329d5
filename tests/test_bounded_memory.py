"""Memory stays bounded whatever names and threads the program uses.

A new ``annotate()`` name every iteration (a step number in the name), a
function label holding a new constant every iteration (``x * lr`` gives
``_ * 0.37``) and many short-lived threads calling instrumented code must not grow the agent's
memory without bound: not its range names (the tracer's, the recorder's, the
strings registered with NVTX), not a per-thread state kept for every thread
that ever ran.  Measured in a real process with an NVTX tool attached.
"""

from __future__ import annotations

import json
from pathlib import Path

from support import program, run_python, write_script

PROGRAM = program("bounded_memory_long_run")


def test_new_names_and_new_threads_do_not_grow_memory(tmp_path: Path):
    script = write_script(tmp_path, "grow.py", PROGRAM)
    run = run_python(tmp_path, [str(script)], env={"CHAINER_PROF_GRANULARITY": "function",
                                                   "CHAINER_PROF_SUMMARY": "0"})
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    # 6,000 new names and 1,500 threads: a few bytes each at most (about 1 KB each before)
    assert out["names"] < 300_000, out
    assert out["labels"] < 300_000, out
    assert out["threads"] < 300_000, out
    assert out["states"] <= 3, out  # the main thread's, not one per thread that ever ran
    assert run.stderr == ""
    names = {ev.text for ev in run.events if ev.event == "push"}
    assert "step 11999" in names  # NVTX still names every range


LONG_TRAINING = program("bounded_memory_long_training")


def test_the_trace_so_far_takes_the_same_memory_at_any_run_length(tmp_path: Path):
    """Once the record limit drops ranges, each background write carries the figures so far:
    their per-iteration lists are a bounded sample, so a write (every few seconds, for the
    whole run) takes about as much memory after 16,000 iterations as after 2,000 (three
    times as much before: the lists whole, at every write)."""
    script = write_script(tmp_path, "long.py", LONG_TRAINING)
    run = run_python(tmp_path, [str(script), "2000", "16000"], nvtx=False,
                     env={"CHAINER_PROF_ENABLE": "1", "CHAINER_PROF_TRACE": "t.json",
                          "CHAINER_PROF_RECORD_LIMIT": "1000",
                          "CHAINER_PROF_FLUSH_INTERVAL": "3600"})
    assert run.returncode == 0, run.stderr
    peaks = json.loads(run.stdout.splitlines()[-1])
    assert peaks["late"] < 2 * peaks["early"], peaks
