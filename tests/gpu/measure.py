"""On a GPU machine (tests/gpu/run.sh): the host-bound PTB-shaped RNN (``ptb.py``), then
the CNN at batch 16 and 512, each under the agent at sync level 0 in each configuration,
rotated three times after one run not counted (the first compiles CuPy's kernels): GPU
activity off; on, CUPTI recording every API call but the quiet ones (``all``); on, CUPTI
recording only the launching calls (``launches``, the default;
``CHAINER_AUTOPROF_CUPTI_CALLS``); for the RNN, instead of ``all`` (which costs it twice what
``launches`` does), CUPTI and the native reader alone, their buffers discarded (``reader``,
``reader_only.py``: what CUPTI's tracing and the reading cost without the agent's analysis),
and the same with no call recorded (``kernels``: CUPTI's tracing of the operations alone), so
that one run splits the cost: off -> kernels CUPTI's operations, kernels -> reader their
calls, reader -> launches the agent's analysis; and with a capture window of 10 of its 50
iterations (``window``: CUPTI switched on and off at its edges; what one switch costs is
printed last).  Each configuration's
throughput and process wall against the targets (within 3%; wall within 3% + 1 s), and for
the CNN the per-link GPU times, the busy share and its idle split with
HolisticTraceAnalysis's beside them."""

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

#: The configurations compared: GPU activity off, then on with each choice of API calls.
CONFIGS = {
    "off": {"CHAINER_PROF_GPU_ACTIVITY": "0"},
    "all": {"CHAINER_PROF_GPU_ACTIVITY": "1", "CHAINER_AUTOPROF_CUPTI_CALLS": "all"},
    "launches": {"CHAINER_PROF_GPU_ACTIVITY": "1", "CHAINER_AUTOPROF_CUPTI_CALLS": "launches"},
    "reader": {"CHAINER_PROF_GPU_ACTIVITY": "0"},
    "kernels": {"CHAINER_PROF_GPU_ACTIVITY": "0", "READER_ONLY_CALLS": "none"},
    # the RNN's 50 iterations, CUPTI on for ten of them only (switched at the window's edges)
    "window": {"CHAINER_PROF_GPU_ACTIVITY": "1", "CHAINER_PROF_ITERATIONS": "20:+10"},
}
#: Configurations that run the script through a wrapper: ``reader``, CUPTI and the native
#: reader as the agent starts them (launching calls), the buffers discarded: against ``off``
#: what CUPTI and the reading cost, against ``launches`` what the agent's analysis adds;
#: ``kernels``, the same with every call switched off again.
WRAPPERS = {"reader": HERE / "reader_only.py", "kernels": HERE / "reader_only.py"}
#: Each configuration with GPU activity as the verdicts name it.
LABELS = {"all": "GPU activity, every call", "launches": "GPU activity, launching calls",
          "reader": "CUPTI and the reader alone",
          "kernels": "CUPTI's operations alone (no call recorded)",
          "window": "GPU activity in a window of 10 of the 50 iterations"}
#: What the CNN compares, and the RNN, where the cost is.
CNN_CONFIGS = ("off", "all", "launches")
RNN_CONFIGS = ("off", "launches", "reader", "kernels", "window")


def under_agent(script: str, args: list[str], config: str, trace: Path,
                **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """One run of ``script`` under the agent in ``config``: (the process, its wall in s)."""
    environ = dict(os.environ, CHAINER_PROF_TRACE=str(trace), CHAINER_PROF_GRANULARITY="link",
                   CHAINER_PROF_SYNC_LEVEL="0", CHAINER_PROF_LOG="info", **CONFIGS[config],
                   **env)
    t0 = time.perf_counter()
    wrapper = [str(WRAPPERS[config])] if config in WRAPPERS else []
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", *wrapper, str(HERE / script),
                           *args],
                          env=environ, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{script} {' '.join(args)} ({config}) failed ({proc.returncode})")
    return proc, wall


def reader_of(proc: subprocess.CompletedProcess[str]) -> str:
    """Which reader read CUPTI's records, and what analysing them cost (the summary's
    ``GPU analysis`` line)."""
    said = re.search(r"read by the (.+) reader", proc.stderr)
    cost = re.search(r"^  GPU analysis +(.+)$", proc.stderr, re.M)
    alone = re.findall(r"^reader_only: (.+)$", proc.stderr, re.M)
    return ((f" (read by the {said.group(1)} reader)" if said else "")
            + (f"\n    analysis: {cost.group(1)}" if cost else "")
            + "".join(f"\n    {line}" for line in alone))


def judged(what: str, runs: dict[str, list[tuple[float, float]]]) -> bool:
    """Print the medians of (iterations per second, process wall s) of each configuration
    with GPU activity against those without (throughput within 3%, wall within 3% + 1 s);
    whether the default configuration (``launches``) meets both."""
    off_rate = statistics.median(r for r, _ in runs["off"])
    off_wall = statistics.median(w for _, w in runs["off"])
    print(f"\n{what}: {off_rate:.2f} it/s without GPU activity, process wall {off_wall:.1f} s")
    verdicts = {}
    for config, got in runs.items():
        if config == "off":
            continue
        rate = statistics.median(r for r, _ in got)
        wall = statistics.median(w for _, w in got)
        rate_ok, wall_ok = rate >= 0.97 * off_rate, wall <= 1.03 * off_wall + 1.0
        verdicts[config] = rate_ok and wall_ok
        print(f"  {LABELS[config]}: {rate:.2f} it/s ({rate / off_rate - 1:+.1%}; "
              f"within 3%: {'met' if rate_ok else 'not met'}); process wall {wall:.1f} s "
              f"(within 3% + 1 s: {'met' if wall_ok else 'not met'})", flush=True)
    return verdicts["launches"]


def rotated(rounds: int, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(round, configuration) in the order run: each round starts one further along."""
    return [(i + 1, c) for i in range(rounds)
            for c in names[i % len(names):] + names[:i % len(names)]]


def cnn(batch: int, out: Path, rounds: int = 3, iterations: int = 60) -> bool:
    """The CNN at ``batch`` in each configuration, rotated ``rounds`` times (iterations per
    second from the agent's median iteration); then each activity configuration's last
    trace described."""
    runs: dict[str, list[tuple[float, float]]] = {c: [] for c in CNN_CONFIGS}
    under_agent("cnn.py", ["--batch", str(batch), "--iterations", "10"], "off",
                out / "warm-up.json")  # not counted: CuPy compiles its kernels
    for i, config in rotated(rounds, CNN_CONFIGS):
        trace = out / f"b{batch}_{config}.json"
        proc, wall = under_agent("cnn.py", ["--batch", str(batch), "--iterations",
                                            str(iterations)], config, trace,
                                 CHAINER_PROF_WARMUP="5")
        median = read_trace(str(trace)).stats().median()
        runs[config].append((1000.0 / median, wall))
        print(f"  b{batch} round {i}: {config:<8} median iteration {median:.2f} ms, process "
              f"wall {wall:.1f} s{reader_of(proc)}", flush=True)
    ok = judged(f"batch {batch}", runs)
    for config in CNN_CONFIGS:
        if config != "off":
            print(f"  the last run with GPU activity, {config} calls:")
            ok = describe(out / f"b{batch}_{config}.json", out / f"hta{batch}{config}") and ok
    return ok


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


def ptb(out: Path, words: int = 35_000, rounds: int = 3) -> bool:
    """The PTB-shaped RNN in each configuration, rotated ``rounds`` times."""
    runs: dict[str, list[tuple[float, float]]] = {c: [] for c in RNN_CONFIGS}
    under_agent("ptb.py", ["--words", "3000"], "off", out / "warm-up.json")  # not counted
    for i, config in rotated(rounds, RNN_CONFIGS):
        proc, wall = under_agent("ptb.py", ["--words", str(words)], config,
                                 out / f"ptb_{config}.json")
        found = re.search(r"^iterations (\d+) training_s (\S+)$", proc.stdout, re.M)
        assert found, proc.stdout[-2000:]
        rate = int(found.group(1)) / float(found.group(2))
        runs[config].append((rate, wall))
        print(f"  ptb round {i}: {config:<8} {rate:.2f} it/s, process wall {wall:.1f} s"
              f"{reader_of(proc)}", flush=True)
    return judged(f"ptb ({words} words)", runs)


def switch_cost(turns: int = 10) -> None:
    """What switching CUPTI off and on again costs (a capture window's edges): the native
    reader in this process, each switch timed between small kernels; printed, not judged."""
    import cupy

    from chainer_autoprof.runtime import cupti_readers

    reader = cupti_readers.start(lambda batch: None)
    if isinstance(reader, str):
        print(f"\nswitch cost: no reader ({reader})")
        return
    a = cupy.ones(1 << 20, dtype=cupy.float32)
    off, on = [], []
    for _ in range(turns):
        for times, on_ in ((off, False), (on, True)):
            (a * 2).sum()
            cupy.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            reader.record(on_)
            times.append(time.perf_counter() - t0)
    reader.stop(5.0)
    print(f"\nswitch cost (native reader, {reader.calls} calls): CUPTI off "
          f"{statistics.median(off) * 1e3:.3f} ms, on {statistics.median(on) * 1e3:.3f} ms "
          f"(medians of {turns})", flush=True)


def main() -> int:
    out = Path(tempfile.mkdtemp(prefix="gpu-activity-"))
    ok = ptb(out)  # the case that matters most first: a short GPU lease ends the run
    ok = all([cnn(16, out), cnn(512, out)]) and ok
    switch_cost()
    print(f"\ntraces in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
