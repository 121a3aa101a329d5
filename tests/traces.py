"""Checks of a written trace file: what Chrome's viewer, Perfetto and our reader rely on."""

from __future__ import annotations

import json
from pathlib import Path

from chainer_autoprof.common import names

#: The colour names Chrome's trace viewer knows (catapult's color_scheme.js).
CHROME_CNAMES = {
    "thread_state_uninterruptible", "thread_state_iowait", "thread_state_running",
    "thread_state_runnable", "thread_state_sleeping", "thread_state_unknown",
    "background_memory_dump", "light_memory_dump", "detailed_memory_dump",
    "vsync_highlight_color", "generic_work", "good", "bad", "terrible", "black", "grey",
    "white", "yellow", "olive", "rail_response", "rail_animation", "rail_idle", "rail_load",
    "startup", "heap_dump_stack_frame", "heap_dump_object_type",
    "heap_dump_child_node_highlight", "cq_build_running", "cq_build_passed",
    "cq_build_failed", "cq_build_abandoned", "cq_build_attempt_runnig",
    "cq_build_attempt_passed", "cq_build_attempt_failed",
}


def check_trace_file(path: Path) -> dict:
    """Load a trace and check what every viewer relies on; returns the JSON."""
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    named_threads = {e["tid"] for e in events
                     if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)
    by_thread: dict[int, list[dict]] = {}
    for e in events:
        if e["ph"] != "X":
            continue
        assert e["cname"] in CHROME_CNAMES
        assert e["cat"] in names.CATEGORIES
        assert int(e["args"]["color"], 16) == names.CATEGORIES[e["cat"]][1]
        assert e["dur"] >= 0 and e["ts"] >= 0
        by_thread.setdefault(e["tid"], []).append(e)
    assert set(by_thread) <= named_threads  # one named track per thread
    for ranges in by_thread.values():  # ranges nest on each thread, with their depth
        open_ends: list[float] = []
        for e in ranges:  # written in begin order
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1] + 1e-3
            assert e["args"]["depth"] == len(open_ends)
            open_ends.append(e["ts"] + e["dur"])
    return data


def nest_per_track(events: list[dict]) -> None:
    """Complete events on one track nest (Chrome/Perfetto draw them as a stack)."""
    tracks: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, items in tracks.items():
        items.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[float] = []
        for e in items:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1] + 1e-3, (key, e)
            open_ends.append(e["ts"] + e["dur"])


def trace_threads(path: Path) -> dict[str, list[tuple[str, float, float, int]]]:
    """{thread name: [(name, t0, t1, depth), ...]} of a recorder trace, in begin order.

    Garbage collections (category ``gc``) run wherever the collector happens
    to start, and the agent's own work (category ``agent``: its run-time checks, once, on
    whichever thread trains first) is not the program's: both left out.
    """
    data = json.loads(path.read_text())
    thread_names = {ev["tid"]: ev["args"]["name"] for ev in data["traceEvents"]
             if ev["ph"] == "M" and ev["name"] == "thread_name"}
    out: dict[str, list[tuple[str, float, float, int]]] = {}
    for ev in data["traceEvents"]:
        if ev["ph"] == "X" and ev["cat"] not in ("gc", "agent"):
            out.setdefault(thread_names[ev["tid"]], []).append(
                (ev["name"], float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]),
                 ev["args"]["depth"]))
    return out


def check_nesting(rows: list[tuple[str, float, float, int]]) -> None:
    """Each range of depth d > 0 lies inside the last open range of depth d - 1."""
    open_at: dict[int, tuple[str, float, float]] = {}
    for name, t0, t1, depth in rows:
        if depth:
            parent = open_at[depth - 1]
            assert parent[1] <= t0 and t1 <= parent[2] + 1e-3, (name, parent)
        open_at[depth] = (name, t0, t1)
