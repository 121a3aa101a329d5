"""Where every thread of this process is now: its open ranges and its Python stack.

:func:`snapshot` is what a stall report, an on-demand dump and each
background write of the trace so far say of the process.  It runs on the
agent's own threads while the program's threads go on (or stay blocked):
it only copies each thread's open-range stack (a list of ``(RangeInfo,
start ns)``) and reads the interpreter's current frames, never waiting for
another thread.  The result is plain JSON values (wording:
:mod:`..report.stall`; comparing ranks: :mod:`..analysis.stall`).
"""

from __future__ import annotations

import linecache
import os
import socket
import sys
import threading
from time import perf_counter_ns, time_ns
from typing import TYPE_CHECKING, Iterable, TypedDict

import wrapt

from ..common import names, rank

if TYPE_CHECKING:
    from types import FrameType

    from ..runtime.events import ThreadState, Tracer

#: Name prefix of the agent's own threads (left out of the reports).
THREAD_PREFIX = "chainer_autoprof"
#: Innermost frames shown per thread.
FRAMES = 8
#: Source files whose frames are the agent's: the package, wrapt, and runpy (how the
#: launcher runs the script).
_OURS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
         os.path.dirname(os.path.abspath(wrapt.__file__)) + os.sep, "<frozen runpy>")
#: The launcher's runner: the frames outside it are how the launcher was started (its console
#: script, ``python -m``), never the program's.
_RUNNER = os.path.join(_OURS[0], "runner.py")


class Frame(TypedDict):
    """One frame of a thread's stack."""

    file: str
    line: int | None
    func: str
    code: str


class OpenRange(TypedDict):
    """A range open on a thread: its name, category and seconds open (``None``: untimed)."""

    name: str
    category: str
    open_s: float | None


class _Thread(TypedDict):
    tid: int
    name: str
    main: bool
    open: list[OpenRange]


class ThreadWhere(_Thread, total=False):
    """One thread's position (``stack`` only with stacks; ``loop`` on the training thread)."""

    stack: list[Frame]
    loop: bool


class _Where(TypedDict):
    reason: str
    pid: int
    host: str
    rank: int | None
    world_size: int | None
    parent_pid: int
    unix_ns: int
    perf_ns: int
    iteration: int | None
    in_iteration: bool
    since_iteration_s: float | None
    threshold_s: float | None
    threads: list[ThreadWhere]
    notes: list[str]


class Where(_Where, total=False):
    """Where each thread is: a stall report, a dump's answer, the trace so far's state
    (the watch adds the seconds since the last progress and its threshold's rule)."""

    since_progress_s: float
    threshold_rule: str | None


def snapshot(tracer: Tracer, reason: str, *, since_s: float | None = None,
             threshold_s: float | None = None, stacks: bool = True,
             notes: Iterable[str] = ()) -> Where:
    """Where each thread is (``reason``: stall, dump or flush), as JSON values.

    ``since_s``: seconds since the last iteration began, as the watchdog saw
    it; ``threshold_s``: the stall setting in force; ``notes``: extra lines
    (e.g. the input queue's state).
    """
    perf_now = perf_counter_ns()
    frames = sys._current_frames() if stacks else {}
    alive = {t.native_id: t for t in threading.enumerate() if t.native_id is not None}
    states = {ts.tid: ts for ts in list(tracer.states.values())}
    main = threading.main_thread()
    threads: list[ThreadWhere] = []
    for tid in _thread_order(main.native_id, states, alive):
        thread = alive.get(tid)
        if thread is None or thread.name.startswith(THREAD_PREFIX):
            continue  # ended (its state stays in the table), or one of ours
        ts = states.get(tid)
        stack = list(ts.stack) if ts is not None else []
        opened: list[OpenRange] = [
            {"name": info.name, "category": info.category,
             "open_s": round((perf_now - t0) / 1e9, 3) if t0 else None}
            for info, t0 in stack]
        entry: ThreadWhere = {"tid": tid, "name": thread.name, "main": thread is main,
                              "open": opened}
        if stacks:
            entry["stack"] = _frames(frames.get(thread.ident))  # type: ignore[arg-type]  # None: no frame
        threads.append(entry)
    loop = next((t for t in threads if any(r["category"] == names.ITERATION for r in t["open"])),
                next((t for t in threads if t["main"]), None))
    if loop is not None:
        loop["loop"] = True
    info = rank.current()
    begun = tracer.iterations
    return {
        "reason": reason,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "rank": None if info is None else info.rank,
        "world_size": None if info is None else info.size,
        "parent_pid": os.getppid(),
        "unix_ns": time_ns(),
        "perf_ns": perf_now,
        "iteration": begun - 1 if begun else None,
        "in_iteration": bool(loop and any(r["category"] == names.ITERATION
                                          for r in loop["open"])),
        "since_iteration_s": None if since_s is None else round(since_s, 3),
        "threshold_s": threshold_s,
        "threads": threads,
        "notes": [str(n) for n in notes],
    }


def _thread_order(main_tid: int | None, states: dict[int, ThreadState],
                  alive: dict[int, threading.Thread]) -> list[int]:
    """The main thread, the threads with open ranges, then every other live thread."""
    busy = [tid for tid, ts in states.items() if ts.stack and tid != main_tid]
    rest = [tid for tid in alive if tid != main_tid and tid not in busy]
    return ([main_tid] if main_tid is not None else []) + sorted(busy) + sorted(rest)


def _frames(frame: FrameType | None) -> list[Frame]:
    """The innermost :data:`FRAMES` frames of the program and its libraries, innermost last."""
    out: list[Frame] = []
    while frame is not None and len(out) < FRAMES:
        code = frame.f_code
        filename = code.co_filename
        if filename == _RUNNER:
            break
        if not filename.startswith(_OURS):
            line = frame.f_lineno  # None while another thread's frame is between lines
            out.append({"file": filename, "line": line, "func": code.co_name,
                        "code": linecache.getline(filename, line).strip() if line else ""})
        frame = frame.f_back
    out.reverse()
    return out


def compact(snap: Where) -> dict[str, object]:
    """``snap`` without the stacks (what a trace keeps of each stall report)."""
    out: dict[str, object] = dict(snap)
    out["threads"] = [{k: v for k, v in t.items() if k != "stack"} for t in snap["threads"]]
    return out
