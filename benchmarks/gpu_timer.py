"""What the GPU phase timer costs per iteration and per range, in instructions (callgrind).

    python benchmarks/gpu_timer.py                 # this checkout, about 5 minutes
    python benchmarks/gpu_timer.py --package DIR   # the chainer_autoprof of another checkout

A tracer with the recorder drives iterations (forward, backward, update
phases) with K link ranges in the forward phase, K = 0 and 50, with and
without the GPU phase timer (the counting backend's host event timer, which
the recorder starts at the first iteration's end once a GPU is in use).  Each
figure is the difference of two runs (``n`` and ``n + 100`` iterations), so
start-up cancels out.  What the timer adds per iteration with K = 0 is its
own work (the iteration and three phases timed, their results taken); the
growth from K = 0 to K = 50, over 50, is what it costs each link range.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The child: ``native iterations links gpu``.
CHILD = r"""
import sys
from chainer_autoprof.common import names
from chainer_autoprof.common.settings import Config
from chainer_autoprof.runtime import hotpath
from chainer_autoprof.runtime.device import CountingBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.policies import SyncPolicy
from chainer_autoprof.sinks.recorder import Recorder

native, iterations, links, gpu = (sys.argv[1] == "1", int(sys.argv[2]), int(sys.argv[3]),
                                  sys.argv[4] == "1")
tracer = Tracer(names.FUNCTION_LEVEL, SyncPolicy(0, CountingBackend()),
                implementation=hotpath.select(native=native))
recorder = Recorder(Config({"summary": True, "trace": None, "warmup": 0}), tracer)
tracer.add_sink(recorder)
if gpu:
    tracer.sync.add_devices([0])  # what the patches do when they see the model on a GPU
ts = tracer.state()
link = tracer.info("l (Linear)", names.LINK)


def drive(n):
    for _ in range(n):
        tracer.begin_phase(ts, names.FORWARD)
        for _ in range(links):
            tracer.end(tracer.begin(link, ts), ts)
        tracer.end_phase(ts)
        tracer.begin_phase(ts, names.BACKWARD)
        tracer.end_phase(ts)
        tracer.begin_phase(ts, names.UPDATE)
        tracer.end_phase(ts)
        tracer.end_iteration(ts)


drive(2)  # the timer starts at the first iteration's end
assert (recorder.gpu is not None) == gpu
drive(iterations)
"""
EXTRA = 100


def count(package: Path, native: bool, iterations: int, links: int, gpu: bool) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(package))
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
         CHILD, "1" if native else "0", str(iterations), str(links), "1" if gpu else "0"],
        env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def per_iteration(package: Path, native: bool, links: int, gpu: bool) -> float:
    return (count(package, native, 20 + EXTRA, links, gpu)
            - count(package, native, 20, links, gpu)) / EXTRA


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, default=HERE.parent)
    args = parser.parse_args(argv)
    package = args.package.resolve()
    print(f"chainer_autoprof from {package}\n")
    print("| Hot path | timer's work per iteration (K = 0) | timer per link range |")
    print("|---|--:|--:|")
    for native in (True, False):
        added = {k: per_iteration(package, native, k, True) - per_iteration(package, native, k,
                                                                            False)
                 for k in (0, 50)}
        print(f"| {'native' if native else 'python'} | {added[0]:+,.0f} | "
              f"{(added[50] - added[0]) / 50:+,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
