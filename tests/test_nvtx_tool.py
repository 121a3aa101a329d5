"""Tests of the NVTX recorder used by the test-suite (nvtx_tool.py, nvtx_inject/).

Every NVTX user runs in a fresh subprocess: NVTX reads NVTX_INJECTION64_PATH
at the first NVTX call of the process, so the environment must be set before
the process starts.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from nvtx_tool import (
    build_injection_library,
    nvtx_env,
    nvtx_include_dir,
    ranges_by_thread,
    read_events,
    tree,
)
from support import program

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "gcc")) is None, reason="needs a C compiler"
)
requires_nvtx = pytest.mark.skipif(
    importlib.util.find_spec("nvtx") is None, reason="needs the nvtx package"
)


def run(args, record_file=None):
    """Run a command, with the recorder injected when record_file is given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_")}
    if record_file is not None:
        env.update(nvtx_env(record_file))
    proc = subprocess.run(
        args, check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def run_python(code, record_file=None):
    return run([sys.executable, "-c", textwrap.dedent(code)], record_file)


def stream(events):
    """Events without pid/tid, for exact comparisons."""
    return [(e.event, e.domain, e.text, e.color, e.category) for e in events]


def test_build_is_cached():
    lib = build_injection_library()
    mtime = lib.stat().st_mtime_ns
    assert build_injection_library() == lib
    assert lib.stat().st_mtime_ns == mtime


@requires_nvtx
@pytest.mark.parametrize("inject", [False, True])
def test_domain_is_real_only_with_injection(tmp_path, inject):
    record = tmp_path / "nvtx.tsv"
    out = run_python(
        """
        import nvtx
        print(type(nvtx.get_domain("test")).__name__)
        """,
        record if inject else None,
    )
    assert out.split() == (["Domain"] if inject else ["DummyDomain"])
    assert record.exists() == inject


@requires_nvtx
def test_domain_ranges_resolve_registered_strings(tmp_path):
    record = tmp_path / "nvtx.tsv"
    out = run_python(
        """
        import os, threading, nvtx
        d = nvtx.get_domain("test")
        attr = d.get_event_attributes(message="hello", color=0xff76b900)
        d.push_range(attr)
        d.push_range(d.get_event_attributes(message="inner", color=0x80000001))
        d.mark(d.get_event_attributes(message="tick", color=0xff000002, category="cat"))
        d.pop_range()
        d.pop_range()
        print(os.getpid(), threading.get_native_id())
        """,
        record,
    )
    pid, tid = map(int, out.split())
    events = read_events(record)
    assert {(e.pid, e.tid) for e in events} == {(pid, tid)}
    assert stream(events) == [
        ("domain", "test", "test", None, 0),
        ("string", "test", "hello", None, 0),
        ("push", "test", "hello", 0xFF76B900, 0),
        ("string", "test", "inner", None, 0),
        ("push", "test", "inner", 0x80000001, 0),
        ("category", "test", "cat", None, 1),
        ("string", "test", "tick", None, 0),
        ("mark", "test", "tick", 0xFF000002, 1),
        ("pop", "test", "", None, 0),
        ("pop", "test", "", None, 0),
    ]
    assert ranges_by_thread(events) == {
        (pid, tid): [(0, "hello", 0xFF76B900), (1, "inner", 0x80000001)]
    }
    assert tree(events, "test") == ["hello", "  inner"]
    assert tree(events, "other") == []


@requires_nvtx
def test_default_domain_and_start_end(tmp_path):
    record = tmp_path / "nvtx.tsv"
    run_python(
        """
        import nvtx
        nvtx.push_range("plain", color=0xff112233)
        nvtx.mark("m", color=0xff445566)
        rid = nvtx.start_range("async", color=0xff778899)
        nvtx.pop_range()
        nvtx.end_range(rid)
        """,
        record,
    )
    events = [e for e in read_events(record) if e.event != "string"]
    assert stream(events) == [
        ("push", "", "plain", 0xFF112233, 0),
        ("mark", "", "m", 0xFF445566, 0),
        ("start", "", "async", 0xFF778899, 0),
        ("pop", "", "", None, 0),
        ("end", "", "", None, 0),
    ]
    start, end = events[2], events[4]
    assert start.id is not None and start.id == end.id
    assert tree(events, "") == ["plain"]


@requires_nvtx
def test_two_threads_record_their_own_balanced_ranges(tmp_path):
    record = tmp_path / "nvtx.tsv"
    run_python(
        """
        import threading, nvtx
        d = nvtx.get_domain("test")
        barrier = threading.Barrier(2)

        def work(i):
            d.push_range(d.get_event_attributes(message=f"outer-{i}"))
            barrier.wait()  # both threads are inside their outer range
            d.push_range(d.get_event_attributes(message=f"inner-{i}"))
            d.pop_range()
            barrier.wait()
            d.pop_range()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        """,
        record,
    )
    events = read_events(record)
    ranges = ranges_by_thread(events, "test")
    assert len(ranges) == 2
    assert len({tid for _, tid in ranges}) == 2
    names = sorted(tree(events, "test", thread=thread)[0] for thread in ranges)
    assert names == ["outer-0", "outer-1"]
    for thread in ranges:
        outer = tree(events, "test", thread=thread)
        i = outer[0][-1]
        assert outer == [f"outer-{i}", f"  inner-{i}"]
    pushes = [e for e in events if e.event == "push"]
    assert pushes[0].tid != pushes[1].tid  # the outer ranges really overlapped
    with pytest.raises(AssertionError, match="several threads"):
        tree(events, "test")


@requires_nvtx
def test_forked_child_writes_its_own_file(tmp_path):
    out = run_python(
        """
        import os, nvtx
        d = nvtx.get_domain("test")
        d.push_range(d.get_event_attributes(message="parent"))
        child = os.fork()
        if child == 0:
            d.push_range(d.get_event_attributes(message="child", color=0xff00aa00))
            d.pop_range()
            os._exit(0)
        os.waitpid(child, 0)
        d.pop_range()
        print(os.getpid(), child)
        """,
        tmp_path / "nvtx.%p.tsv",
    )
    parent, child = map(int, out.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"nvtx.{parent}.tsv", f"nvtx.{child}.tsv"]
    )
    parent_events = read_events(tmp_path / f"nvtx.{parent}.tsv")
    child_events = read_events(tmp_path / f"nvtx.{child}.tsv")
    assert {e.pid for e in parent_events} == {parent}
    assert {e.pid for e in child_events} == {child}
    assert tree(parent_events, "test") == ["parent"]
    # The string registered in the parent resolves in the child too.
    assert stream(child_events) == [
        ("string", "test", "child", None, 0),
        ("push", "test", "child", 0xFF00AA00, 0),
        ("pop", "test", "", None, 0),
    ]
    assert len(read_events(tmp_path / "nvtx.*.tsv")) == len(parent_events) + len(
        child_events
    )


@requires_nvtx
def test_unbalanced_stream_is_detected(tmp_path):
    left_open = tmp_path / "open.tsv"
    run_python(
        """
        import nvtx
        d = nvtx.get_domain("test")
        d.push_range(d.get_event_attributes(message="a"))
        d.push_range(d.get_event_attributes(message="b", color=0xff0000bb))
        d.pop_range()
        """,
        left_open,
    )
    events = read_events(left_open)
    with pytest.raises(AssertionError, match="left open"):
        ranges_by_thread(events)
    (ranges,) = ranges_by_thread(events, allow_open=True).values()
    assert ranges == [(1, "b", 0xFF0000BB)]

    extra_pop = tmp_path / "pop.tsv"
    run_python(
        """
        import nvtx
        d = nvtx.get_domain("test")
        d.push_range(d.get_event_attributes(message="a"))
        d.pop_range()
        d.pop_range()
        """,
        extra_pop,
    )
    with pytest.raises(AssertionError, match="pop without push"):
        ranges_by_thread(read_events(extra_pop), allow_open=True)


C_DRIVER = program("nvtx_c_driver.c")


def test_c_api_ascii_unicode_and_escaping(tmp_path):
    source = tmp_path / "driver.c"
    source.write_text(C_DRIVER)
    exe = tmp_path / "driver"
    run(
        [
            os.environ.get("CC", "gcc"),
            f"-I{nvtx_include_dir()}",
            "-o",
            str(exe),
            str(source),
            "-ldl",
        ]
    )
    record = tmp_path / "nvtx.tsv"
    *levels, range_id, tid = map(int, run([str(exe)], record).split())
    assert levels == [0, 1, 1, 0]
    events = read_events(record)
    assert [(*s, e.id) for s, e in zip(stream(events), events)] == [
        ("push", "", "a\tb\\c\nd", None, 0, None),
        ("push", "", "caf\u00e9 \U0001f600", None, 0, None),
        ("mark", "", "tick", None, 0, None),
        ("pop", "", "", None, 0, None),
        ("pop", "", "", None, 0, None),
        ("start", "", "async", None, 0, range_id),
        ("end", "", "", None, 0, range_id),
        ("threadname", "", "main", None, 0, tid),
        ("category", "", "seven", None, 7, None),
        ("domain", "wide", "wide", None, 0, None),
        ("string", "wide", "registered", None, 0, None),
        ("push", "wide", "registered", 0xFF00FF00, 7, None),
        ("mark", "wide", "w\u00fcnsch", None, 7, None),
        ("pop", "wide", "", None, 0, None),
    ]
    assert tree(events, "") == ["a\tb\\c\nd", "  caf\u00e9 \U0001f600"]
    assert tree(events, "wide") == ["registered"]
