"""``python -m chainer_autoprof report TRACE [TRACE2]``: summaries and before/after comparisons."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from support import EXAMPLES, run_python

from chainer_autoprof.report.compare import main as report_main
from chainer_autoprof.report.tracefile import stats_from_trace

LOOP = EXAMPLES / "recorder_custom_loop.py"


def profile(tmp: Path, name: str, *script_args: str, flags: tuple[str, ...] = (),
            summary: bool = False) -> tuple[Path, str]:
    trace = tmp / name
    run = run_python(tmp, ["-m", "chainer_autoprof", "--trace", str(trace), *flags, str(LOOP),
                           *script_args], nvtx=False,
                     env={"CHAINER_PROF_SUMMARY": "1" if summary else "0"})
    assert run.returncode == 0, run.stderr
    return trace, run.stderr


def report(tmp: Path, *args: str):
    return run_python(tmp, ["-m", "chainer_autoprof", "report", *args], nvtx=False,
                      count_device=False)


def body(text: str) -> list[str]:
    """The summary without its title and the line naming the trace file."""
    lines = text.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("chainer_autoprof "))
    return [line for line in lines[start + 1:] if not line.lstrip().startswith("trace ")]


def test_report_prints_the_summary_the_run_printed(tmp_path):
    trace, stderr = profile(tmp_path, "t.json", "--iterations", "25", summary=True)
    run = report(tmp_path, str(trace))
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert run.stdout.startswith(f"chainer_autoprof report of {trace}")
    assert body(run.stdout) == body(stderr)


def test_compare_before_and_after_a_change(tmp_path):
    slow, _ = profile(tmp_path, "slow.json", "--iterations", "15", "--data-delay", "0.01")
    fast, _ = profile(tmp_path, "fast.json", "--iterations", "15")
    run = report(tmp_path, str(slow), str(fast))
    assert run.returncode == 0, run.stderr
    out = run.stdout
    before, after = stats_from_trace(str(slow)), stats_from_trace(str(fast))
    rows = {m.group(1).strip(): m.groups()[1:]
            for m in re.finditer(r"^\s+(\S.*?)\s{2,}(\S+ ?\S*)\s+(\S+ ?\S*)\s+([+-]\d+%|new|)$",
                                 out, re.M)}
    assert "iteration median" in rows and "data" in rows
    assert after.median() < before.median()
    conclusion = out.strip().splitlines()[-1]
    assert re.search(r"the median iteration is [\d.]+x faster", conclusion)
    assert "data moved most: down" in conclusion
    assert rows["data"][2].startswith("-")
    # the other way round it is slower
    back = report(tmp_path, str(fast), str(slow)).stdout.strip().splitlines()[-1]
    assert "slower" in back and "data moved most: up" in back


def test_report_of_a_trace_that_dropped_ranges(tmp_path):
    trace, stderr = profile(tmp_path, "t.json", "--iterations", "400",
                            flags=("--record-limit", "1000"), summary=True)
    meta = json.loads(trace.read_text())["otherData"]["chainer_autoprof"]
    assert meta["dropped_ranges"] > 0
    whole = report(tmp_path, str(trace)).stdout
    assert "397 counted, 3 warm-up" in whole  # the whole run, saved at exit
    assert body(whole) == body(stderr)
    window = report(tmp_path, "--from-events", str(trace)).stdout
    counted = int(re.search(r"(\d+) counted", window).group(1))
    assert 0 < counted < 397  # only what the timeline still holds


def test_bad_files_are_one_line_and_status_2(tmp_path, capsys):
    not_json = tmp_path / "notes.txt"
    not_json.write_text("hello")
    other_json = tmp_path / "other.json"
    other_json.write_text('{"a": 1}')
    for path in (tmp_path / "missing.json", not_json, other_json):
        assert report_main([str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert len(err.strip().splitlines()) == 1 and str(path) in err


# -- several runs: a merged trace, and --html with two traces ---------------------------------
@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, list[Path], Path]:
    """Two unrelated runs, one after the other (a pause between), and their merged trace."""
    tmp = tmp_path_factory.mktemp("two_runs")
    first, _ = profile(tmp, "first.json", "--iterations", "12")
    time.sleep(1.0)
    second, _ = profile(tmp, "second.json", "--iterations", "9", flags=("--warmup", "2"))
    run = run_python(tmp, ["-m", "chainer_autoprof", "merge", str(first), str(second), "-o",
                           "merged.json", "-q"], nvtx=False, count_device=False)
    assert run.returncode == 0, run.stderr
    return tmp, [first, second], tmp / "merged.json"


def test_report_on_a_merged_trace_summarizes_each_process(two_runs):
    """Read as one run, the other process was "more on other threads", the warm-up was zero
    and the pause between the runs "after the last iteration"."""
    tmp, traces, merged = two_runs
    run = report(tmp, str(merged))
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "on other threads" not in out
    blocks = re.split(r"^\[\d/2\] ", out, flags=re.M)
    assert len(blocks) == 3 and "a merged trace of 2 processes" in blocks[0]
    for block, trace in zip(blocks[1:], traces):
        own = report(tmp, str(trace))
        assert own.returncode == 0, own.stderr
        # each process's summary is the one its own trace gives: its warm-up, its wall
        assert body("chainer_autoprof " + block) == body(own.stdout)
        assert block.startswith(f"pid {stats_from_trace(str(trace)).meta['pid']} ({trace})")
    assert "3 warm-up excluded" in blocks[1] and "2 warm-up excluded" in blocks[2]


def test_merged_trace_with_html_or_a_second_trace_is_one_line(two_runs):
    tmp, traces, merged = two_runs
    for args in ([str(merged), "--html", "m.html"], [str(merged), str(traces[0])]):
        run = report(tmp, *args)
        assert run.returncode == 2 and run.stdout == ""
        assert len(run.stderr.splitlines()) == 1 and "merged trace" in run.stderr
    assert not (tmp / "m.html").exists()


def test_html_of_two_runs_is_refused_not_half_written(two_runs):
    """``report A B --html`` wrote A's page alone and said nothing: now one line, no page
    (a run and its replay run still make one page: test_html_report.py)."""
    tmp, traces, _merged = two_runs
    run = report(tmp, *map(str, traces), "--html", "two.html")
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.splitlines()) == 1
    assert "two runs" in run.stderr and "write a page of each" in run.stderr
    assert not (tmp / "two.html").exists()
