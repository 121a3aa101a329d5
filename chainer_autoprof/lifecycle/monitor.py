"""Watching a running process: the stall watchdog, background flushing, on-demand reports.

One daemon thread per process (started with the agent when a stall setting
or a trace asks for it) wakes up a few times a second at most, reads the
tracer's iteration count and, every few seconds, writes the trace so far
(:mod:`.flusher`).  Nothing here runs on the program's threads or touches
the hot path: the training thread's only contribution is the iteration
count it keeps anyway and the open-range stacks read by :mod:`.where`.

* **Stall.**  When no new iteration has begun for ``CHAINER_PROF_STALL``
  seconds (``auto``: max(60 s, 20x the median iteration once 10 have run))
  while the training thread is inside a recorded range, the report is
  printed once on stderr, with the trace so far written; a new iteration
  ends the stall (one line says so) and the watch goes on.
* **On request.**  :class:`~.dump_server.DumpServer` answers
  ``chainer-autoprof dump PID`` with the same report, printed here too.

The agent builds a :class:`Monitor` and passes it what it needs; the
report's wording is :mod:`..report.stall`.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from time import monotonic
from typing import Any, Callable

from ..analysis.stats import median
from ..common import log, names
from . import where
from .dump_server import DumpServer
from .flusher import Flusher

#: ``auto``: the stall threshold is max(AUTO_MIN_S, AUTO_FACTOR x the median iteration) ...
AUTO_MIN_S = 60.0
AUTO_FACTOR = 20.0
#: ... once this many iterations have begun (AUTO_MIN_S before).
AUTO_AFTER = 10
#: Stall reports kept for the trace (the newest).
KEEP_STALLS = 20


class Monitor:
    """The watchdog thread, the background flushing and the dump server of one process."""

    def __init__(self, tracer: Any, stall: float | str | None, flusher: Flusher | None,
                 flush_interval: float = 0.0,
                 notes: Callable[[], list[str]] | None = None) -> None:
        self.tracer = tracer
        self.stall = stall
        self.flusher = flusher
        self.flush_interval = flush_interval if flusher is not None else 0.0
        self.notes = notes
        self.server = DumpServer(self.on_request)
        self.stalls: deque[dict[str, Any]] = deque(maxlen=KEEP_STALLS)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._report_lock = threading.Lock()
        self._reset_watch()

    def _reset_watch(self) -> None:
        self.count = self.tracer.iterations
        self.changed = monotonic()
        self.periods: deque[float] = deque(maxlen=256)
        self.in_stall = False

    # -- threads ----------------------------------------------------------------------
    def start(self) -> None:
        self.server.start()
        if self.stall is not None or self.flush_interval > 0:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="chainer_autoprof monitor",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and the server (at exit, before the final trace; on uninstall)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self.server.stop()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's thread, socket and file (then :meth:`start`)."""
        self.server.forget()
        if self.flusher is not None:
            self.flusher.after_fork()
        self.stalls.clear()
        self._stop = threading.Event()
        self._report_lock = threading.Lock()
        self._thread = None
        self._reset_watch()

    def _poll(self) -> float:
        waits = [1.0]
        if isinstance(self.stall, float):
            waits.append(max(0.05, self.stall / 10))
        if self.flush_interval > 0:
            waits.append(self.flush_interval)
        return min(waits)

    def _run(self) -> None:
        next_flush = monotonic() + self.flush_interval
        while not self._stop.wait(self._poll()):
            try:
                now = monotonic()
                if self.stall is not None:
                    self.check(now)
                if self.flush_interval > 0 and now >= next_flush:
                    next_flush = now + self.flush_interval
                    self.flush()
            except Exception as exc:  # the watch must never take the program down
                log.error(f"monitor: {type(exc).__name__}: {exc}")

    # -- the stall watchdog ----------------------------------------------------------------
    def threshold(self) -> float:
        """Seconds without a new iteration that make a stall now."""
        if isinstance(self.stall, (int, float)):
            return float(self.stall)
        if self.tracer.iterations < AUTO_AFTER or not self.periods:
            return AUTO_MIN_S
        return max(AUTO_MIN_S, AUTO_FACTOR * median(list(self.periods)))

    def check(self, now: float) -> bool:
        """One look: report a stall that has just begun (``True`` when one was reported)."""
        count = self.tracer.iterations
        if count != self.count:
            if count > self.count > 0:
                self.periods.append((now - self.changed) / (count - self.count))
            if self.in_stall:
                log.warning(f"the stall is over: iteration {count - 1} began after "
                            f"{now - self.changed:.1f} s without a new one", once=False)
            self.count, self.changed, self.in_stall = count, now, False
            return False
        if not count or self.in_stall:
            return False
        since = now - self.changed
        threshold = self.threshold()
        if since < threshold:
            return False
        glance = where.snapshot(self.tracer, "stall", stacks=False)
        loop = next((t for t in glance["threads"] if t.get("loop")), None)
        if loop is None or not loop["open"]:
            return False  # the training thread is outside every range: training is over
        snap = where.snapshot(self.tracer, "stall", since_s=since, threshold_s=threshold,
                              notes=self._notes())
        loop = next((t for t in snap["threads"] if t.get("loop")), None) or loop
        age = _iteration_age(loop)
        if age is not None:  # exact, where the watch saw the iteration begin a poll late
            snap["since_iteration_s"] = round(max(since, age), 3)
        self.in_stall = True
        self.report(snap)
        return True

    def _notes(self) -> list[str]:
        if self.notes is None:
            return []
        try:
            return list(self.notes())
        except Exception as exc:
            return [f"({type(exc).__name__}: {exc})"]

    # -- reports ------------------------------------------------------------------------------
    def report(self, snap: dict[str, Any], show: bool = True) -> tuple[str, str | None]:
        """Write the trace so far with ``snap``, print the report (``show``); (text, trace path)."""
        # the wording loads with the first report, not at start-up
        from ..report.stall import format_report

        with self._report_lock:
            if snap["reason"] == "stall":
                self.stalls.append(where.compact(snap))
            path = self.flush(snap)
            text = format_report(snap, path)
            if show:
                try:
                    sys.stderr.write(text + "\n")
                    sys.stderr.flush()
                except Exception:
                    pass
        return text, path

    def flush(self, snap: dict[str, Any] | None = None) -> str | None:
        """Write the trace so far (``snap``: where each thread is; taken now when not given)."""
        if self.flusher is None:
            return None
        if snap is None:
            snap = where.snapshot(self.tracer, "flush", notes=self._notes())
        return self.flusher.flush(snap, list(self.stalls))

    def on_request(self, message: dict[str, Any]) -> dict[str, Any]:
        """A ``dump`` request from the control socket (on the server thread)."""
        since = monotonic() - self.changed if self.stall is not None and self.count else None
        snap = where.snapshot(self.tracer, "dump", since_s=since, notes=self._notes())
        loop = next((t for t in snap["threads"] if t.get("loop")), None) or {}
        age = _iteration_age(loop)
        if age is not None:
            snap["since_iteration_s"] = round(max(since or 0.0, age), 3)
        text, path = self.report(snap, show=bool(message.get("print", True)))
        return {"ok": True, "text": text, "snapshot": snap, "trace_so_far": path}

    def finish(self, final_written: bool) -> None:
        """After the final trace: the partial file goes when the final one was written (and
        when it was not, but the disk is nearly full)."""
        if self.flusher is not None and final_written:
            self.flusher.discard()
        elif self.flusher is not None:
            self.flusher.keep_if_room()

    def stall_records(self) -> list[dict[str, Any]]:
        """The stall reports so far (without stacks), for the final trace."""
        return list(self.stalls)


def _iteration_age(thread: dict[str, Any]) -> float | None:
    """Seconds the thread's open iteration range has been open (``None``: none, or not timed)."""
    ages = [r["open_s"] for r in thread.get("open", ()) if r["category"] == names.ITERATION]
    return ages[0] if ages and ages[0] is not None else None
