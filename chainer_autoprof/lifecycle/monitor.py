"""Watching a running process: the stall watchdog, background flushing, on-demand reports.

One daemon thread per process (started with the agent when a stall setting
or a trace asks for it; waking only as often as they need) reads the
tracer's iteration count and the patches' call counters and, every few
seconds, writes the trace so far (:mod:`.flusher`).  Nothing here runs on
the program's threads or touches the hot path: what it reads, the training
thread keeps anyway (the iteration count, each patch's count of calls, each
thread's open ranges and whether it is inside ``Trainer.run``).

* **Stall.**  Training makes progress when a new iteration begins or any
  instrumented call is made (a Link call, a data fetch, an update, a
  communication, ...: each patch counts its calls).  Once the first
  iteration has begun, no progress for ``CHAINER_PROF_STALL`` seconds is a
  stall, wherever the training thread is (inside a range, or in the loop's
  own code between two); ``auto`` learns from the run (:meth:`threshold`).
  After a ``Trainer.run`` has returned, until a new iteration begins, the
  watch rests: training is over.  The report is printed once on stderr,
  with the trace so far written; progress ends the stall (one line says so)
  and the watch goes on.
* **Last resort.**  While C code holds the GIL no Python thread runs, this
  one neither: :mod:`.last_resort` keeps faulthandler's own thread ready to
  write every thread's stack then.
* **On request.**  :class:`~.dump_server.DumpServer` answers
  ``chainer-autoprof dump PID`` with the same report, printed here too.

The agent builds a :class:`Monitor` and passes it what it needs; the
report's wording is :mod:`..report.stall`.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque
from time import monotonic
from typing import TYPE_CHECKING, Callable

from ..common import log, names
from ..common.one_line import write
from . import where
from .dump_server import DumpServer
from .flusher import Flusher
from .last_resort import LastResort

if TYPE_CHECKING:
    from ..common.typedefs import JsonObject
    from ..runtime.events import Tracer
    from .where import ThreadWhere, Where

#: ``auto``: a stall is AUTO_FACTOR x the longest pause without progress seen so far,
#: and at least AUTO_MIN_S ...
AUTO_MIN_S = 60.0
AUTO_FACTOR = 5.0
#: ... once this many iterations have begun (AUTO_MIN_S before).
AUTO_AFTER = 10
#: Stall reports kept for the trace (the newest).
KEEP_STALLS = 20


class Monitor:
    """The watchdog thread, the background flushing and the dump server of one process."""

    def __init__(self, tracer: Tracer, stall: float | str | None, flusher: Flusher | None,
                 flush_interval: float = 0.0,
                 notes: Callable[[], list[str]] | None = None,
                 progress: Callable[[], int] | None = None,
                 trainer_runs: Callable[[], int] | None = None) -> None:
        self.tracer = tracer
        self.stall = stall
        self.flusher = flusher
        self.flush_interval = flush_interval if flusher is not None else 0.0
        self.notes = notes
        #: instrumented calls made so far (the patches' counters): progress between iterations
        self.progress = progress if progress is not None else (lambda: 0)
        #: ``Trainer.run`` calls so far: one started (and maybe returned) since the last look
        self.trainer_runs = trainer_runs if trainer_runs is not None else (lambda: 0)
        self.server = DumpServer(self.on_request)
        self.last_resort = LastResort()
        self.stalls: deque[dict[str, object]] = deque(maxlen=KEEP_STALLS)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._report_lock = threading.Lock()
        self._reset_watch()

    def _reset_watch(self) -> None:
        now = monotonic()
        self.count = self.tracer.iterations
        self.calls = self._calls()
        self.runs = self._count(self.trainer_runs)
        self.changed = now           # the last progress seen
        self.iteration_seen = now    # the last new iteration seen
        self.longest = 0.0           # the longest pause without progress seen while watching
        self.trainer_at: int | None = None  # iterations begun when a Trainer.run last ran
        self.was_in_trainer = False  # inside Trainer.run at the last look
        self.watching = False
        self.in_stall = False

    # -- threads ----------------------------------------------------------------------
    def start(self) -> None:
        self.server.start()
        if self.stall is not None or self.flush_interval > 0:
            self._stop.clear()
            if self.stall is not None:
                self.last_resort.start()
            self._thread = threading.Thread(target=self._run, name="chainer_autoprof monitor",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and the server (at exit, before the final trace; on uninstall)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self.last_resort.stop()
        self.server.stop()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's thread, socket and file (then :meth:`start`)."""
        self.server.forget()
        self.last_resort.after_fork()
        if self.flusher is not None:
            self.flusher.after_fork()
        self.stalls.clear()
        self._stop = threading.Event()
        self._report_lock = threading.Lock()
        self._thread = None
        self._reset_watch()

    def _poll(self) -> float:
        """Seconds between looks: what the stall watch needs, else the next background write
        (a thread that wakes for nothing costs every process it runs in)."""
        waits = []
        if self.stall is not None:
            waits.append(1.0)
        if isinstance(self.stall, float):
            waits.append(max(0.05, self.stall / 10))
        if self.flush_interval > 0:
            waits.append(self.flush_interval)
        return min(waits) if waits else 3600.0

    def _run(self) -> None:
        next_flush = monotonic() + self.flush_interval
        while True:
            wait = self._poll()
            if self.flush_interval > 0:
                wait = min(wait, max(0.01, next_flush - monotonic()))
            if self._stop.wait(wait):
                return
            now = monotonic()
            if self.stall is not None:
                try:
                    self.check(now)
                except Exception as exc:  # the watch must never take the program down  # noqa: BLE001
                    log.error(f"monitor: {type(exc).__name__}: {exc}")
                try:
                    self._keep_last_resort()
                except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
                    log.error(f"monitor: {type(exc).__name__}: {exc}")
            try:
                if self.flush_interval > 0 and now >= next_flush:
                    next_flush = now + self.flush_interval
                    self.flush()
            except Exception as exc:  # the watch must never take the program down  # noqa: BLE001
                log.error(f"monitor: {type(exc).__name__}: {exc}")

    def _keep_last_resort(self) -> None:
        """Ask for faulthandler's timer a little beyond the threshold while watching; say
        what it wrote if it went off."""
        threshold = self.threshold()
        self.last_resort.want(math.ceil(threshold + max(1.0, threshold / 4))
                              if self.watching else None)
        fired = self.last_resort.take_fired()
        if fired is not None:
            log.warning(f"the stacks written above after 'Timeout ({_clock(fired[0])})!' are "
                        "this process's, by the agent's last resort (faulthandler): no Python "
                        f"thread could run for {fired[1]:.1f} s (a thread held the GIL in C "
                        "code, or the process was stopped); it runs again now", once=False)

    # -- the stall watchdog ----------------------------------------------------------------
    def _calls(self) -> int:
        return self._count(self.progress)

    @staticmethod
    def _count(counter: Callable[[], int]) -> int:
        try:
            return int(counter())
        except Exception:  # a counter's error: no progress seen this poll  # noqa: BLE001
            return 0

    def threshold(self) -> float:
        """Seconds without progress that make a stall now.

        ``auto``: :data:`AUTO_MIN_S` until :data:`AUTO_AFTER` iterations have
        begun, then :data:`AUTO_FACTOR` times the longest pause without
        progress seen so far (an evaluation, a snapshot, the first iteration's
        start-up), at least :data:`AUTO_MIN_S`: a pause the run has already
        shown is not a stall, one several times longer is.
        """
        if isinstance(self.stall, (int, float)):
            return float(self.stall)
        if self.tracer.iterations < AUTO_AFTER:
            return AUTO_MIN_S
        return max(AUTO_MIN_S, AUTO_FACTOR * self.longest)

    def rule(self) -> str | None:
        """How ``auto`` chose the threshold now (``None`` for a number of seconds)."""
        if isinstance(self.stall, (int, float)) or self.stall is None:
            return None
        if self.tracer.iterations < AUTO_AFTER:
            return f"auto: {AUTO_MIN_S:g} s until {AUTO_AFTER} iterations have begun"
        return (f"auto: {AUTO_FACTOR:g}x the longest pause seen so far ({self.longest:.2f} s), "
                f"at least {AUTO_MIN_S:g} s")

    def check(self, now: float) -> bool:
        """One look: report a stall that has just begun (``True`` when one was reported)."""
        count = self.tracer.iterations
        calls = self._calls()
        in_trainer = self._in_trainer()
        runs = self._count(self.trainer_runs)
        if in_trainer or self.was_in_trainer or runs != self.runs:
            # inside Trainer.run, or in it at the last look, or one ran since: its iterations
            self.trainer_at = count
        elif self.trainer_at is not None and self.trainer_at != count:
            self.trainer_at = None   # iterations after the trainer returned: a loop of its own
        self.runs, self.was_in_trainer = runs, in_trainer
        was_watching = self.watching
        # training is over once a Trainer.run has returned, until a new iteration begins
        self.watching = count > 0 and (in_trainer or self.trainer_at != count)
        if count != self.count or calls != self.calls:
            pause = now - self.changed
            if was_watching:
                self.longest = max(self.longest, pause)
            if self.in_stall:
                at = f" (iteration {count - 1})" if count else ""
                log.warning(f"the stall is over: progress again after {pause:.1f} s{at}",
                            once=False)
            if count != self.count:
                self.iteration_seen = now
            self.count, self.calls, self.changed, self.in_stall = count, calls, now, False
            return False
        if not self.watching or self.in_stall:
            return False
        since = now - self.changed
        threshold = self.threshold()
        if since < threshold:
            return False
        snap = where.snapshot(self.tracer, "stall", since_s=now - self.iteration_seen,
                              threshold_s=threshold, notes=self._notes())
        snap["since_progress_s"] = round(since, 3)
        snap["threshold_rule"] = self.rule()
        loop = next((t for t in snap["threads"] if t.get("loop")), None)
        age = _iteration_age(loop) if loop is not None else None
        if age is not None:  # exact, where the watch saw the iteration begin a poll late
            snap["since_iteration_s"] = round(max(now - self.iteration_seen, age), 3)
        self.in_stall = True
        self.report(snap)
        return True

    def _in_trainer(self) -> bool:
        return any(getattr(ts, "in_trainer", 0) > 0 for ts in list(self.tracer.states.values()))

    def _notes(self) -> list[str]:
        if self.notes is None:
            return []
        try:
            return list(self.notes())
        except Exception as exc:  # a note's error is shown as the note  # noqa: BLE001
            return [f"({type(exc).__name__}: {exc})"]

    # -- reports ------------------------------------------------------------------------------
    def report(self, snap: Where, show: bool = True) -> tuple[str, str | None]:
        """Write the trace so far with ``snap``, print the report (``show``); (text, trace path)."""
        # the wording loads with the first report, not at start-up
        from ..report.stall import format_report

        with self._report_lock:
            if snap["reason"] == "stall":
                self.stalls.append(where.compact(snap))
            path = self.flush(snap)
        text = format_report(snap, path)
        if show:  # not under the lock: a stderr that blocks must not hold back a dump
            _print(text)
        return text, path

    def flush(self, snap: Where | None = None) -> str | None:
        """Write the trace so far (``snap``: where each thread is; taken now when not given)."""
        if self.flusher is None:
            return None
        if snap is None:
            snap = where.snapshot(self.tracer, "flush", notes=self._notes())
        return self.flusher.flush(snap, list(self.stalls))

    def on_request(self, message: JsonObject) -> tuple[dict[str, object],
                                                       Callable[[], None] | None]:
        """A ``dump`` request from the control socket (on the server thread): the answer, and
        the printing of the report on stderr, to run once the answer is sent."""
        now = monotonic()
        since = now - self.iteration_seen if self.stall is not None and self.count else None
        snap = where.snapshot(self.tracer, "dump", since_s=since, notes=self._notes())
        if self.stall is not None and self.count:
            snap["since_progress_s"] = round(now - self.changed, 3)
        loop = next((t for t in snap["threads"] if t.get("loop")), None)
        age = _iteration_age(loop) if loop is not None else None
        if age is not None:
            snap["since_iteration_s"] = round(max(since or 0.0, age), 3)
        text, path = self.report(snap, show=False)
        then = (lambda: _print(text)) if message.get("print", True) else None
        return {"ok": True, "text": text, "snapshot": snap, "trace_so_far": path}, then

    def finish(self, final_written: bool) -> None:
        """After the final trace: the partial file goes when the final one was written (and
        when it was not, but the disk is nearly full)."""
        if self.flusher is not None and final_written:
            self.flusher.discard()
        elif self.flusher is not None:
            self.flusher.keep_if_room()

    def stall_records(self) -> list[dict[str, object]]:
        """The stall reports so far (without stacks), for the final trace."""
        return list(self.stalls)


def _print(text: str) -> None:
    try:
        write(sys.stderr, text + "\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not break the program  # noqa: BLE001
        pass


def _clock(seconds: float) -> str:
    """``H:MM:SS``, as faulthandler writes its timeout."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _iteration_age(thread: ThreadWhere) -> float | None:
    """Seconds the thread's open iteration range has been open (``None``: none, or not timed)."""
    ages = [r["open_s"] for r in thread.get("open", ()) if r["category"] == names.ITERATION]
    return ages[0] if ages and ages[0] is not None else None
