"""Samples per second count what the iterator handed out, not one batch per update.

A step that takes four batches (gradient accumulation) trains on four batches' samples; a
partial last batch is as long as it is; a loop without an iterator counts what its converter
was handed; an evaluation's batches are no training.  The summary's samples/s, the trace's
record and ``report`` on the trace say the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import program, run_python, write_script

from chainer_autoprof.common import figures
from chainer_autoprof.report.tracefile import stats_from_trace

LOOPS = program("samples_loops")

#: mode -> (warm-up, counted iterations, samples they trained on)
CASES = {
    "accumulate": ("2", 18, 18 * 64),
    "updater": ("0", 12, 12 * 64),
    "partial": ("0", 4, 100),
    "converter": ("0", 10, 10 * 16),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request, tmp_path_factory):
    mode = request.param
    tmp = tmp_path_factory.mktemp(mode)
    script = write_script(tmp, "loops.py", LOOPS)
    trace = tmp / "t.json"
    done = run_python(tmp, ["-m", "chainer_autoprof", "--warmup", CASES[mode][0], "--trace",
                            str(trace), str(script), mode], nvtx=False, check=True)
    return mode, done, trace


def rate(text: str) -> tuple[float, float, str]:
    """The summary's iterations/s, samples/s and what it says they are made of."""
    m = re.search(r"; ([\d,.]+) it/s, ([\d,]+) samples/s \(([^)]*)\)", text)
    assert m, text
    return float(m.group(1).replace(",", "")), float(m.group(2).replace(",", "")), m.group(3)


def test_samples_per_second_count_what_the_iterations_trained_on(run):
    mode, done, trace = run
    _warmup, iterations, samples = CASES[mode]
    stats = stats_from_trace(str(trace))
    assert stats.iterations == iterations
    exact = samples * 1000.0 / stats.iteration_total_ms  # per second of iteration time
    it_s, sps, made_of = rate(done.stderr)
    assert sps == pytest.approx(it_s * samples / iterations, rel=0.01)
    assert f"{sps:,.0f}" == figures.count(round(exact))
    per_iteration = samples / iterations
    if mode == "partial":
        assert made_of == "25.0 samples per iteration on average, batch 32"
    else:
        assert made_of.startswith(f"{per_iteration:.1f} samples per iteration on average")
    # the trace's record holds them
    assert (stats.samples, stats.sampled_iterations) == (samples, iterations)
    assert stats.samples_per_second() == pytest.approx(exact)


def test_report_on_the_trace_says_the_same(run, tmp_path: Path):
    _mode, done, trace = run
    again = run_python(tmp_path, ["-m", "chainer_autoprof", "report", str(trace)], nvtx=False,
                       check=True)
    assert rate(again.stdout) == rate(done.stderr)
