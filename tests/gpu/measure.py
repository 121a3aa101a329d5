"""On a GPU machine (tests/gpu/run.sh): the CNN at batch 512 and 16 under the agent at sync
level 0, GPU activity off and on; prints the iteration cost of GPU activity, the per-link GPU
times, the busy share and its idle split, and HolisticTraceAnalysis on the live trace (its idle
split beside ours)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gpu_live_replay import hta_figures, idle_shares  # noqa: E402

from chainer_autoprof.report.tracefile import read_trace  # noqa: E402


def run(batch: int, activity: bool, out: Path, iterations: int) -> Path:
    trace = out / f"b{batch}_{'activity' if activity else 'plain'}.json"
    env = dict(os.environ, CHAINER_PROF_TRACE=str(trace), CHAINER_PROF_GRANULARITY="link",
               CHAINER_PROF_SYNC_LEVEL="0", CHAINER_PROF_WARMUP="5",
               CHAINER_PROF_GPU_ACTIVITY="1" if activity else "0")
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", str(HERE / "cnn.py"),
                           "--batch", str(batch), "--iterations", str(iterations)],
                          env=env, capture_output=True, text=True, timeout=1200)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"the CNN at batch {batch} failed ({proc.returncode})")
    return trace


def main() -> int:
    out = Path(tempfile.mkdtemp(prefix="gpu-activity-"))
    for batch in (512, 16):
        plain = read_trace(str(run(batch, False, out, 60))).stats()
        path = run(batch, True, out, 60)
        live = read_trace(str(path)).stats()
        fig = live.gpu_activity or {}
        n = fig.get("iterations") or 1
        cost = live.median() / plain.median() - 1 if plain.median() else 0.0
        print(f"\nbatch {batch}: median iteration {plain.median():.2f} ms without GPU activity, "
              f"{live.median():.2f} ms with it ({cost:+.1%}); GPU busy "
              f"{(fig.get('busy_share') or 0):.1%}; idle by cause (ms per iteration): "
              + ", ".join(f"{k} {v / n:.3f}" for k, v in (fig.get("idle_ms") or {}).items()))
        print(f"  {'link':<42} {'GPU fwd ms':>10} {'GPU bwd ms':>10} {'kernels':>8}")
        for x in fig.get("links") or []:
            print(f"  {x['name']:<42} {x['fwd_ms'] / n:>10.3f} {x['bwd_ms'] / n:>10.3f} "
                  f"{(x['fwd_kernels'] + x['bwd_kernels']) / n:>8.1f}")
        for note in fig.get("notes") or []:
            print(f"  note: {note}")
        try:
            hta = hta_figures(json.loads(path.read_text()), out / f"hta{batch}")
        except ImportError as exc:
            print(f"  HTA: not installed ({exc})")
            continue
        print(f"  HTA over the counted iterations {hta['steps'][0]}..{hta['steps'][-1]}: busy "
              f"{hta['busy']:.1%}, active {hta['active']:.1%} (ours: busy "
              f"{(fig.get('busy_share') or 0):.1%}, active {(fig.get('active_share') or 0):.1%})"
              f"; idle (us) {hta['idle']}")
        shares = idle_shares(fig.get("idle_ms") or {}, hta["idle"])
        apart = max(abs(theirs - ours) for theirs, ours in shares.values())
        print("  idle split, share of the idle time, HTA / ours: " + ", ".join(
            f"{k} {theirs:.1%} / {ours:.1%}" for k, (theirs, ours) in shares.items())
              + f"; within 5 points: {'met' if apart < 0.05 else 'not met'}")
    print(f"\ntraces in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
