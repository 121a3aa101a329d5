"""The readers on damaged traces: every input gets a result, or one line and exit status 2.

``report``, ``report --html`` and ``merge`` read trace files that may be
truncated, edited or damaged.  Real traces (from real runs) are damaged here
as hypothesis generates: an event's field replaced by a value of the wrong
kind (NaN, 1e400, a string, a list, a deep nesting) or removed, a metadata
field likewise (``run_stats`` included), the file truncated or a byte
changed.  Never a traceback, never an "internal error", and a merged file is
strict JSON (no NaN or Infinity).  The examples are derandomized and few in CI
(``conftest.py``); ``--hypothesis-profile explore`` searches more.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import clean_env, program, run_python, write_script

from chainer_autoprof.report.compare import main as report_main
from chainer_autoprof.report.merge import main as merge_main

TRAIN = program("reader_fuzz_train")



class Traces(dict):
    """The real traces by name (a short repr: hypothesis shows the arguments of a failure)."""

    def __repr__(self) -> str:
        return f"<real traces {sorted(self)}>"


#: The same, for the strategies (they take names, not the big dicts).
_TRACES = Traces()


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, dict]:
    """Real traces: two whole ones (for merge) and one whose record limit dropped ranges."""
    tmp = tmp_path_factory.mktemp("fuzz")
    script = write_script(tmp, "train.py", TRAIN)
    out = Traces()
    for name, flags in (("a", ["--granularity", "link"]), ("b", ["--granularity", "phase"]),
                        ("dropped", ["--granularity", "function", "--record-limit", "1000"])):
        run = run_python(tmp, ["-m", "chainer_autoprof", "--summary", "0", "--trace",
                               f"{name}.json", *flags, str(script)], nvtx=False)
        assert run.returncode == 0 and run.stderr == "", run.stderr
        out[name] = json.loads((tmp / f"{name}.json").read_text())
    assert out["dropped"]["otherData"]["chainer_autoprof"].get("run_stats")
    _TRACES.update(out)
    return out


# -- damage ---------------------------------------------------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000
#: Values of the wrong kind, or at the edges of the right one.  Strings that stand for JSON
#: tokens Python cannot produce are put into the text afterwards.
NASTY = st.sampled_from([
    None, True, False, 0, -1, 1 << 70, -(1 << 70), 0.5, -1e-9, 1e300, "abc", "", "12", [],
    [1, 2], {}, {"a": 1}, "@NaN", "@Infinity", "@-Infinity", "@1e400", "@-1e400", "@deep",
    "@bigint", "@-bigint",
])
TOKENS = {'"@NaN"': "NaN", '"@Infinity"': "Infinity", '"@-Infinity"': "-Infinity",
          '"@1e400"': "1e400", '"@-1e400"': "-1e400", '"@deep"': "[" * 3000 + "]" * 3000,
          # an integer past a float's range: Python reads it as an int, exactly
          '"@bigint"': "1" + "0" * 400, '"@-bigint"': "-1" + "0" * 400}

EVENT_FIELDS = ["ts", "dur", "tid", "pid", "name", "cat", "ph", "args", "args.depth",
                "args.iteration", "args.name"]
META_FIELDS = ["pid", "rank", "host", "command", "settings", "settings.iterations",
               "settings.warmup", "clock", "clock.duration_ns", "clock.perf_counter_ns_at_start",
               "clock.unix_time_ns_at_start", "warmup_skip", "main_tid", "batch_size",
               "sync_level", "sync_calls", "overhead_ms", "gpu_phase_ms", "dropped_ranges",
               "devices", "versions", "facts", "facts.iterator", "facts.config", "process",
               "process.mpi_rank", "process.child", "process.clock_reference",
               "run_stats", "run_stats.iterations", "run_stats.iteration_ms",
               "run_stats.phase_ms", "run_stats.outside_ms", "run_stats.links",
               "run_stats.wall_ms", "run_stats.sample_stride", "run_stats.has_phases",
               "run_stats.gc_ms", "run_stats.gc_total_ms", "run_stats.slowest", "facts.gc",
               "facts.gc.collections", "facts.input_queue", "stalls", "partial",
               "partial.where", "partial.stalls", "partial.unix_ns"]


def _set(target: dict, dotted: str, value, delete: bool) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        child = target.get(key)
        if not isinstance(child, dict):
            child = target[key] = {}
        target = child
    if delete:
        target.pop(last, None)
    else:
        target[last] = value


#: One damage: (what, field or position, value, delete).
DAMAGE = st.one_of(
    st.tuples(st.just("event"), st.integers(0, 10_000), st.sampled_from(EVENT_FIELDS), NASTY,
              st.booleans()),
    st.tuples(st.just("meta"), st.sampled_from(META_FIELDS), NASTY, st.booleans()),
    st.tuples(st.just("drop"), st.integers(0, 10_000)),
    st.tuples(st.just("top"), st.sampled_from(["traceEvents", "otherData", "displayTimeUnit"]),
              NASTY, st.booleans()),
)
#: How the text is cut afterwards: not at all, truncated, or one character changed.
CUT = st.one_of(
    st.just(("none",)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("byte"), st.floats(0, 1),
              st.sampled_from(["\x00", "}", "]", ",", '"', "9", "\ufffd"])),
)
#: A damaged trace, described (hypothesis shows this, not the text, for a failure).
DAMAGED = st.tuples(st.lists(DAMAGE, min_size=1, max_size=3), CUT)


def damaged(name: str, description) -> str:
    """The text of the real trace ``name`` with the damages of ``description``."""
    damages, cut = description
    data = json.loads(json.dumps(_TRACES[name]))
    events = data["traceEvents"]
    for damage in copy.deepcopy(damages):  # a drawn list or dict may be drawn twice
        what = damage[0]
        if what == "event":
            _n, n, field, value, delete = damage
            if isinstance(events, list) and events and isinstance(events[n % len(events)], dict):
                _set(events[n % len(events)], field, value, delete)
        elif what == "meta":
            _what, field, value, delete = damage
            other = data.get("otherData")
            if isinstance(other, dict) and isinstance(other.get("chainer_autoprof"), dict):
                _set(other["chainer_autoprof"], field, value, delete)
        elif what == "drop":
            if isinstance(events, list) and events:
                del events[damage[1] % len(events)]
        else:
            _what, key, value, prepend = damage
            data[key] = [value, *events] if key == "traceEvents" and prepend else value
    text = json.dumps(data)
    for token, raw in TOKENS.items():
        text = text.replace(token, raw)
    if cut[0] == "truncate":
        text = text[:int(cut[1] * len(text))]
    elif cut[0] == "byte":
        pos = min(len(text) - 1, int(cut[1] * len(text)))
        text = text[:pos] + cut[2] + text[pos + 1:]
    return text


def _call(main, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _one_line_or_result(code: int, out: str, err: str) -> None:
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 2:
        assert len(err.splitlines()) == 1 and out == "", (out, err)
    else:
        assert out.strip(), err


def _strict(text: str):
    def refuse(token: str):
        raise AssertionError(f"{token} in a merged trace")

    return json.loads(text, parse_constant=refuse)


# -- the properties ---------------------------------------------------------------------------
@given(data=st.data())
def test_report_on_damaged_traces(traces, tmp_path_factory, data):
    name = data.draw(st.sampled_from(["a", "dropped"]))
    path = tmp_path_factory.mktemp("r") / "t.json"
    path.write_text(damaged(name, data.draw(DAMAGED)), encoding="utf-8")
    flags = data.draw(st.sampled_from([[], ["--from-events"], ["--no-advice"]]))
    _one_line_or_result(*_call(report_main, [str(path), *flags]))


@given(data=st.data())
def test_report_html_on_damaged_traces(traces, tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("h")
    (tmp / "t.json").write_text(damaged("a", data.draw(DAMAGED)), encoding="utf-8")
    second = data.draw(st.booleans())
    if second:
        (tmp / "u.json").write_text(json.dumps(traces["b"]), encoding="utf-8")
    argv = [str(tmp / "t.json"), *([str(tmp / "u.json")] if second else []),
            "--html", str(tmp / "r.html")]
    code, out, err = _call(report_main, argv)
    _one_line_or_result(code, out, err)
    if code == 0:
        assert (tmp / "r.html").read_text().startswith("<!DOCTYPE html>")


@given(data=st.data())
def test_merge_on_damaged_traces(traces, tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("m")
    (tmp / "a.json").write_text(damaged("a", data.draw(DAMAGED)), encoding="utf-8")
    (tmp / "b.json").write_text(json.dumps(traces["b"]), encoding="utf-8")
    code, out, err = _call(merge_main, [str(tmp / "a.json"), str(tmp / "b.json"),
                                        "-o", str(tmp / "m.json")])
    _one_line_or_result(code, out, err)
    if code == 0:
        merged = _strict((tmp / "m.json").read_text())
        assert merged["otherData"]["chainer_autoprof"]["merged"] is True
    else:
        assert not (tmp / "m.json").exists()
    assert sorted(p.name for p in tmp.iterdir()) in (["a.json", "b.json"],
                                                     ["a.json", "b.json", "m.json"])


# -- the damages the issue lists, through the real command line ------------------------------
def _first_range(data: dict) -> dict:
    return next(ev for ev in data["traceEvents"] if ev.get("ph") == "X")


VARIANTS = {
    "ts not a number": lambda d: _first_range(d).update(ts="abc"),
    "no dur": lambda d: _first_range(d).pop("dur"),
    "ts 1e400": lambda d: _first_range(d).update(ts="@1e400"),
    "ts NaN": lambda d: _first_range(d).update(ts="@NaN"),
    "ts 1e400 as an integer": lambda d: _first_range(d).update(ts="@bigint"),
    "dur 1e400 as an integer": lambda d: _first_range(d).update(dur="@bigint"),
    "dur -1e400 as an integer": lambda d: _first_range(d).update(dur="@-bigint"),
    "tid 1e400 as an integer": lambda d: _first_range(d).update(tid="@bigint"),
    "args a list": lambda d: _first_range(d).update(args=[1, 2]),
    "bad run_stats": lambda d: d["otherData"]["chainer_autoprof"].update(
        dropped_ranges=5, run_stats={"iterations": "many"}),
    "deeply nested": lambda d: d["traceEvents"].append("@deep"),
    "pid a string": lambda d: d["otherData"]["chainer_autoprof"].update(pid="abc"),
    "rank a word": lambda d: d["otherData"]["chainer_autoprof"].update(rank="zero"),
    "slow iterations damaged": lambda d: d["otherData"]["chainer_autoprof"].update(
        dropped_ranges=5, run_stats=dict(_saved_stats(d), slowest=[{"iteration": 3,
                                                                    "ms": "slow"}])),
    "gc facts damaged": lambda d: d["otherData"]["chainer_autoprof"].setdefault(
        "facts", {}).update(gc={"collections": "many"}),
    "stall report damaged": lambda d: d["otherData"]["chainer_autoprof"].update(
        stalls=[{"rank": 0, "threads": "MainThread"}]),
    "partial state damaged": lambda d: d["otherData"]["chainer_autoprof"].update(
        partial={"where": {"threads": [{"open": [{"name": "data", "open_s": "long"}]}]}}),
}


def _saved_stats(data: dict) -> dict:
    """The statistics a trace with dropped ranges saves (from the real trace that has them)."""
    return json.loads(json.dumps(_TRACES["dropped"]["otherData"]["chainer_autoprof"][
        "run_stats"]))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_issue_variants_on_the_command_line(traces, tmp_path, variant):
    data = json.loads(json.dumps(traces["a"]))
    VARIANTS[variant](data)
    text = json.dumps(data)
    for token, raw in {**TOKENS, '"@deep"': DEEP}.items():
        text = text.replace(token, raw)
    (tmp_path / "bad.json").write_text(text)
    (tmp_path / "b.json").write_text(json.dumps(traces["b"]))
    commands = [["report", "bad.json"], ["report", "bad.json", "--html", "r.html"]]
    if variant not in ("bad run_stats", "slow iterations damaged", "gc facts damaged"):
        # merge reads the events and where the ranks were, not the saved statistics
        commands.append(["merge", "bad.json", "b.json", "-o", "m.json"])
    for args in commands:
        run = subprocess.run([sys.executable, "-m", "chainer_autoprof", *args], cwd=tmp_path,
                             env=clean_env(), capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        assert len(run.stderr.splitlines()) == 1 and "bad.json" in run.stderr, run.stderr
        assert "internal error" not in run.stderr


def test_merge_never_writes_nan(traces, tmp_path):
    """A NaN anywhere in an input's metadata becomes null; in an event it is refused."""
    data = json.loads(json.dumps(traces["a"]))
    data["otherData"]["chainer_autoprof"]["facts"]["odd"] = "@NaN"
    (tmp_path / "a.json").write_text(json.dumps(data).replace('"@NaN"', "NaN"))
    (tmp_path / "b.json").write_text(json.dumps(traces["b"]))
    code, _out, err = _call(merge_main, [str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                         "-o", str(tmp_path / "m.json"), "-q"])
    assert code == 0, err
    merged = _strict((tmp_path / "m.json").read_text())
    inputs = merged["otherData"]["chainer_autoprof"]["inputs"]
    assert any(i["meta"]["facts"].get("odd", 0) is None for i in inputs)
