"""On a GPU machine (tests/gpu/run.sh): the CNN at batch 512 and 16 under the agent at sync
level 0, GPU activity off and on interleaved three times; prints throughput and process wall
against the targets (within 3%; wall within 3% + 1 s), the per-link GPU times, the busy share
and its idle split, and HolisticTraceAnalysis on the live trace (its idle split beside ours).
Then the host-bound PTB-shaped RNN (``ptb.py``), GPU activity off, read natively and read by
cupti-python, rotated three times: the same targets, for the native reader."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gpu_live_replay import hta_figures, idle_shares  # noqa: E402

from chainer_autoprof.report.tracefile import read_trace  # noqa: E402


def run(batch: int, activity: bool, out: Path, iterations: int) -> tuple[Path, float]:
    """One run of the CNN under the agent: (its trace, the process wall in s)."""
    trace = out / f"b{batch}_{'activity' if activity else 'plain'}.json"
    env = dict(os.environ, CHAINER_PROF_TRACE=str(trace), CHAINER_PROF_GRANULARITY="link",
               CHAINER_PROF_SYNC_LEVEL="0", CHAINER_PROF_WARMUP="5",
               CHAINER_PROF_GPU_ACTIVITY="1" if activity else "0")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", str(HERE / "cnn.py"),
                           "--batch", str(batch), "--iterations", str(iterations)],
                          env=env, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"the CNN at batch {batch} failed ({proc.returncode})")
    return trace, wall


def judged(what: str, off: list[tuple[float, float]], on: list[tuple[float, float]]) -> bool:
    """Print the medians of (iterations per second, process wall s) off and on against the
    targets (throughput within 3%, wall within 3% + 1 s); whether both are met."""
    off_rate, on_rate = (statistics.median(r for r, _ in x) for x in (off, on))
    off_wall, on_wall = (statistics.median(w for _, w in x) for x in (off, on))
    rate_ok = on_rate >= 0.97 * off_rate
    wall_ok = on_wall <= 1.03 * off_wall + 1.0
    print(f"{what}: {off_rate:.2f} it/s without GPU activity, {on_rate:.2f} with it "
          f"({on_rate / off_rate - 1:+.1%}; within 3%: {'met' if rate_ok else 'not met'}); "
          f"process wall {off_wall:.1f} s vs {on_wall:.1f} s (within 3% + 1 s: "
          f"{'met' if wall_ok else 'not met'})", flush=True)
    return rate_ok and wall_ok


def cnn(batch: int, out: Path, rounds: int = 3, iterations: int = 60) -> bool:
    """The CNN at ``batch``, GPU activity off and on interleaved ``rounds`` times; then the
    last traced run's per-link GPU times, busy share, idle split and HTA's beside them."""
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i in range(rounds):
        for activity in ((False, True) if i % 2 == 0 else (True, False)):
            path, wall = run(batch, activity, out, iterations)
            median = read_trace(str(path)).stats().median()
            runs[activity].append((1000.0 / median, wall))
            print(f"  b{batch} round {i + 1}: GPU activity {'on ' if activity else 'off'} "
                  f"median iteration {median:.2f} ms, process wall {wall:.1f} s", flush=True)
    ok = judged(f"\nbatch {batch} (iterations per second from the median iteration)",
                runs[False], runs[True])
    return describe(out / f"b{batch}_activity.json", out / f"hta{batch}") and ok


def describe(path: Path, folder: Path) -> bool:
    """Print a trace's GPU figures and HTA's beside them; whether the idle splits agree
    within 5 points."""
    live = read_trace(str(path)).stats()
    fig = live.gpu_activity
    if fig is None:
        print("  no GPU activity figures in the trace")
        return False
    n = fig.iterations or 1
    print(f"  GPU busy {(fig.busy_share or 0):.1%}; idle by cause (ms per iteration): "
          + ", ".join(f"{k} {v / n:.3f}" for k, v in fig.idle_ms.items()))
    print(f"  {'link':<42} {'GPU fwd ms':>10} {'GPU bwd ms':>10} {'kernels':>8}")
    for x in fig.links:
        print(f"  {x['name']:<42} {x['fwd_ms'] / n:>10.3f} {x['bwd_ms'] / n:>10.3f} "
              f"{(x['fwd_kernels'] + x['bwd_kernels']) / n:>8.1f}")
    for note in fig.notes:
        print(f"  note: {note}")
    try:
        hta = hta_figures(json.loads(path.read_text()), folder)
    except ImportError as exc:
        print(f"  HTA: not installed ({exc})")
        return False
    print(f"  HTA over the counted iterations {hta['steps'][0]}..{hta['steps'][-1]}: busy "
          f"{hta['busy']:.1%}, active {hta['active']:.1%} (ours: busy "
          f"{(fig.busy_share or 0):.1%}, active {(fig.active_share or 0):.1%})"
          f"; idle (us) {hta['idle']}")
    shares = idle_shares(fig.idle_ms, hta["idle"])
    apart = max(abs(theirs - ours) for theirs, ours in shares.values())
    print("  idle split, share of the idle time, HTA / ours: " + ", ".join(
        f"{k} {theirs:.1%} / {ours:.1%}" for k, (theirs, ours) in shares.items())
          + f"; within 5 points: {'met' if apart < 0.05 else 'not met'}", flush=True)
    return apart < 0.05


def ptb_run(reader: str, out: Path, words: int) -> tuple[float, float, str]:
    """One run of ptb.py under the agent, GPU activity off (``reader`` "off") or read by
    ``reader``: (iterations per second, process wall s, the reader the agent names)."""
    trace = out / f"ptb_{reader}.json"
    env = dict(os.environ, CHAINER_PROF_TRACE=str(trace), CHAINER_PROF_GRANULARITY="link",
               CHAINER_PROF_SYNC_LEVEL="0", CHAINER_PROF_LOG="info",
               CHAINER_PROF_GPU_ACTIVITY="0" if reader == "off" else "1")
    if reader != "off":
        env["CHAINER_AUTOPROF_CUPTI_READER"] = reader
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", str(HERE / "ptb.py"),
                           "--words", str(words)], env=env, capture_output=True, text=True,
                          timeout=1200)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"ptb.py failed ({proc.returncode})")
    found = re.search(r"^iterations (\d+) training_s (\S+)$", proc.stdout, re.M)
    assert found, proc.stdout[-2000:]
    said = re.search(r"read by the (.+) reader", proc.stderr)
    return int(found.group(1)) / float(found.group(2)), wall, said.group(1) if said else ""


def ptb(out: Path, words: int = 70_000, rounds: int = 3,
        readers: tuple[str, ...] = ("off", "native", "python")) -> bool:
    """The PTB-shaped RNN: GPU activity off and on (each reader), rotated ``rounds`` times;
    judged on the first reader (the one the agent chooses), the others for comparison."""
    runs: dict[str, list[tuple[float, float]]] = {r: [] for r in readers}
    for i in range(rounds):
        for reader in readers[i % len(readers):] + readers[:i % len(readers)]:
            rate, wall, said = ptb_run(reader, out, words)
            runs[reader].append((rate, wall))
            print(f"  ptb round {i + 1}: GPU activity {reader:<6} {rate:.2f} it/s, process "
                  f"wall {wall:.1f} s{f' (read by the {said} reader)' if said else ''}",
                  flush=True)
    verdicts = [judged(f"\nptb, GPU activity read by the {reader} reader", runs["off"],
                       runs[reader]) for reader in readers[1:]]
    return verdicts[0]


def main() -> int:
    out = Path(tempfile.mkdtemp(prefix="gpu-activity-"))
    ok = all([cnn(512, out), cnn(16, out)])
    ok = ptb(out) and ok
    print(f"\ntraces in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
