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

from support import run_python, write_script

PROGRAM = r'''
import gc
import json
import sys
import threading
import tracemalloc

import numpy as np
import chainer
import chainer.links as L

import chainer_autoprof
from chainer_autoprof import agent

link = L.Linear(2, 2)
x = np.ones((1, 2), np.float32)
tracer = agent.current().tracer
chainer.global_config.train = False  # inference: no training iterations, on every thread


def names(start, count):
    for i in range(start, start + count):
        with chainer_autoprof.annotate(f"step {i}"):
            link(x)


def labels(start, count):  # function labels that hold a constant: "_ * 12.0"
    v = chainer.Variable(x)
    for i in range(start, start + count):
        v * float(i)


def threads(count):
    for _ in range(count):
        t = threading.Thread(target=link, args=(x,))
        t.start()
        t.join()


def growth(work, *args):
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    work(*args)
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


tracemalloc.start()
names(0, 6000)        # past any cap on names
labels(0, 1000)
threads(300)
out = {"names": growth(names, 6000, 6000), "labels": growth(labels, 1000, 6000),
       "threads": growth(threads, 1500), "states": len(tracer.states)}
print(json.dumps(out))
'''


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
