"""Overhead in instructions: a deterministic cross-check of ``overhead.py``.

Wall-clock ratios on a shared machine move by a percent or more from one run
to the next, which is as large as the overheads being measured.  Instruction
counts do not: this script runs each workload under ``valgrind
--tool=callgrind`` twice (``n`` and ``n + extra`` steps), so start-up cancels
out, and prints the instructions added per step by each configuration.

    python benchmarks/instructions.py            # MLP step and one Link call, ~30 minutes
    python benchmarks/instructions.py --quick    # phase and link only, ~18 minutes
    python benchmarks/instructions.py --recorder # link granularity with the recorder attached,
                                                 # and with the GPU activity's handover of its
                                                 # blocks (a deque append), Link calls only
    python benchmarks/instructions.py --recorder --repo DIR   # another checkout, the same way

A configuration ``GRANULARITY[/recorder[/handover]]``: ``recorder`` keeps the summary on
(the recorder sink attached), ``handover`` gives the recorder a ``gpu_handover`` (what
``CHAINER_PROF_GPU_ACTIVITY=1`` attaches once CUPTI runs: one deque append per block of
4,096 ranges); the ``link`` workload then runs 80 extra steps, so that blocks fill, with the
garbage collector off while they run (a collection of the whole heap falls where allocations
push it, and would add hundreds of instructions per call to one run and not the other).

Instructions are not time (a cache miss costs more than an add), but an added
instruction count well under 1% of a step is an overhead well under 1%.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: The child: one workload, one configuration, ``steps`` steps after one warm step.
CHILD = r"""
import sys
sys.path[:0] = [{here!r}]
import workloads
config, workload, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
quiet_gc = sys.argv[4:] == ["nogc"]
if config != "none":
    import chainer_autoprof
    granularity, *parts = config.split("/")
    agent = chainer_autoprof.install(granularity=granularity, summary="recorder" in parts,
                                     advice=False, log="error")
    if "handover" in parts:
        import collections
        agent.recorder.gpu_handover = collections.deque().append
step = workloads.build(workload, None)
step()
if quiet_gc:  # collections fall where allocations push them: off, so that runs compare
    import gc
    gc.collect()
    gc.disable()
for _ in range(steps):
    step()
"""

#: workload -> (steps, extra steps, units per step, unit name)
WORKLOADS = {
    "mlp": (1, 2, 1, "MLP step"),
    "link": (1, 5, 100, "Link call"),
}


def count(config: str, workload: str, steps: int, env: dict[str, str],
          quiet_gc: bool = False) -> int:
    """Instructions of one child run under callgrind (``quiet_gc``: no collections while the
    steps run)."""
    code = CHILD.format(here=str(HERE))
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, "-c", code, config, workload, str(steps),
         *(["nogc"] if quiet_gc else [])],
        env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="phase and link only")
    parser.add_argument("--recorder", action="store_true",
                        help="link granularity with the recorder, with and without the GPU "
                             "activity's handover (Link calls only)")
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="the checkout whose package is measured (default: this one)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "tests"))
    from nvtx_tool import build_injection_library

    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               NVTX_INJECTION64_PATH=str(build_injection_library()),
               PYTHONPATH=os.pathsep.join(filter(None, [str(args.repo),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop("NVTX_RECORD_FILE", None)  # NVTX calls reach a tool that records nothing
    workloads = dict(WORKLOADS)
    if args.recorder:
        configs = ["none", "link", "link/recorder", "link/recorder/handover"]
        workloads = {"link": (1, 80, 100, "Link call")}  # 8,080 ranges: blocks fill
    elif args.quick:
        configs = ["none", "phase", "link"]
    else:
        configs = ["none", "iteration", "phase", "link", "function"]
    print("| Configuration | " + " | ".join(w[3] + " (instructions added)" for w in
                                            workloads.values()) + " |")
    print("|---|" + "--:|" * len(workloads))
    base: dict[str, float] = {}
    for config in configs:
        cells = []
        for name, (steps, extra, units, _label) in workloads.items():
            per_unit = (count(config, name, steps + extra, env, args.recorder)
                        - count(config, name, steps, env, args.recorder)) / extra / units
            if config == "none":
                base[name] = per_unit
                cells.append(f"{per_unit:,.0f} (baseline)")
            else:
                added = per_unit - base[name]
                cells.append(f"+{added:,.0f} ({added / base[name]:+.3%})")
        label = "uninstrumented" if config == "none" else f"agent: {config}"
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
