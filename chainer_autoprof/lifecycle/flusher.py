"""The trace so far on disk: what the recorder holds, appended to ``TRACE.partial``.

Called from the monitor thread every ``CHAINER_PROF_FLUSH_INTERVAL`` seconds
and at each stall report or dump; nothing runs on the program's threads.
Each write appends what is new since the last one (:mod:`..report.partial`):

* the blocks the recorder kept for the trace since the last write
  (:meth:`~..sinks.recorder.Recorder.retained_since`), then a copy of each
  thread's buffered ranges (:meth:`~..sinks.recorder.Recorder.pending_blocks`,
  nothing consumed).  A range can be seen twice (buffered at one write,
  aggregated by the next); a thread's ranges end in order, so per thread
  only rows ending after the last one written are new;
* new range names and threads, the metadata when it changed, the details
  of new gc ranges, and the state (where each thread is, the stall reports).

When the file holds twice the record limit, it is rewritten with the newest
ranges only.  After a normal exit the final trace is written and the
partial file deleted; after a SIGKILL it is what ``report`` reads.

The file is the agent's own (:class:`~..common.outputs.PrivateFile`): when
something else is at its name (a symlink, another user's file, a FIFO), when
the file system is nearly full (less than its headroom would be left) or a
write fails, the trace so far stops for the rest of the run, with one line,
and what was written is deleted: it never competes with the program for
the disk.  The final trace is still written at exit.
"""

from __future__ import annotations

import json
import os
import threading
from time import time_ns
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import numpy as np

from ..common import log, outputs
from ..common.one_line import one_line

if TYPE_CHECKING:
    from ..common.typedefs import RangeRows
    from ..report.partial import PartialWriter
    from ..sinks.recorder import Recorder


class _Records(Protocol):
    """What a write takes from :mod:`..report.partial` (imported at the first write)."""

    def rows_records(self, tid: int, rows: RangeRows) -> list[bytes]: ...

    def json_record(self, kind: bytes, value: object) -> bytes: ...

    def gc_record(self, rows: Sequence[tuple[int, int, int, int]]) -> bytes: ...


#: Bytes of metadata and states a file may gather before it is rewritten.
STATE_BYTES = 8 << 20
#: Values per per-iteration list in the figures a write carries once ranges were dropped
#: (a uniform sample: each write's size, and the memory it takes, bounded at any run length).
SAMPLE = 4096


class Flusher:
    """Writes the recorder's ranges to this process's partial trace file."""

    def __init__(self, recorder: Recorder, trace_path: Callable[[], str], limit: int,
                 meta: Callable[[], Mapping[str, object]],
                 gc_details: (Callable[[int], tuple[list[tuple[int, int, int, int]], int]]
                              | None) = None,
                 run_stats: Callable[[], object] | None = None) -> None:
        self.recorder = recorder
        #: The file this process's final trace goes to now (:func:`.processes.trace_path`).
        self.trace_path = trace_path
        self.limit = limit
        self.meta = meta
        self.gc_details = gc_details
        self.run_stats = run_stats
        self._lock = threading.Lock()
        #: Why the trace so far stopped (``None``: it goes on).
        self.stopped: str | None = None
        self._reset()

    def _reset(self) -> None:
        self.writer: PartialWriter | None = None
        self.mark = 0                  # ranges ever retained, as of the last write
        self.gc_mark = 0
        self.last: dict[int, tuple[int, int]] = {}  # tid -> (t1 of the last row, rows at that t1)
        self.names = 0                 # names written
        self.threads: dict[int, str] = {}
        self.meta_text = ""
        self.rows = 0                  # rows in the file
        self.lost = 0                  # ranges dropped by the record limit before a write

    @property
    def path(self) -> str | None:
        return None if self.writer is None else self.writer.path

    def flush(self, where: Mapping[str, object] | None,
              stalls: Sequence[Mapping[str, object]]) -> str | None:
        """Write what is new; returns the file's path (``None``: nothing recorded yet, failed)."""
        with self._lock:
            if self.stopped is not None:
                return None
            try:
                return self._flush(where, stalls)
            except Exception as exc:  # our error: the trace so far stops, said once  # noqa: BLE001
                self._stop(exc)
                return None

    def _stop(self, exc: Exception) -> None:
        """No more trace so far in this run: one line, and what was written goes."""
        path = self.path or "the trace so far"
        removed = self.writer is not None and self.writer.discard()
        self.writer = None
        if isinstance(exc, outputs.NoRoomError):
            why = f"the disk is nearly full: {exc}"
        elif isinstance(exc, (outputs.NotOursError, ValueError)):
            why = str(exc)
        elif isinstance(exc, OSError):
            why = f"could not write {path}: {exc.strerror or exc}"
        else:
            why = f"{type(exc).__name__}: {exc}"
        self.stopped = one_line(why)
        head = "the trace so far stops" if removed else "the trace so far is not written"
        gone = f"; {one_line(path)} deleted" if removed else ""
        log.warning(f"{head}: {self.stopped}{gone} (the final trace is still written at exit)")

    def _flush(self, where: Mapping[str, object] | None,
               stalls: Sequence[Mapping[str, object]]) -> str | None:
        # the writer builds on the reporting modules: loaded when the first write happens
        from ..report import partial

        recorder = self.recorder
        total_before = self.mark
        blocks, self.mark = recorder.retained_since(self.mark)
        self.lost += max(0, self.mark - total_before - sum(len(b) for _t, b in blocks))
        rows = self._new_rows(blocks + recorder.pending_blocks())
        count = sum(len(r) for r in rows.values())
        if self.writer is None and not count:
            return None
        # beside the final trace, as the kernel reads the path (never resolved here)
        path = partial.partial_path(self.trace_path())
        if self.writer is None:
            self.writer = partial.PartialWriter(path)
        else:
            self.writer.move(path)
        if self.rows + count > 2 * self.limit or self.writer.size > STATE_BYTES + 64 * self.limit:
            return self._rewrite(partial, where, stalls)
        self.writer.append(self._records(partial, rows, where, stalls, full=False))
        self.rows += count
        return self.writer.path

    def _rewrite(self, partial: _Records, where: Mapping[str, object] | None,
                 stalls: Sequence[Mapping[str, object]]) -> str:
        """The newest ranges only: everything the recorder still keeps, and what it buffers."""
        self.last = {}
        blocks, self.mark = self.recorder.retained_since(0)
        rows = self._new_rows(blocks + self.recorder.pending_blocks())
        self.names, self.threads, self.meta_text, self.gc_mark = 0, {}, "", 0
        writer = self.writer
        assert writer is not None  # made by the first write, which comes first
        writer.rewrite(self._records(partial, rows, where, stalls, full=True))
        self.rows = sum(len(r) for r in rows.values())
        return writer.path

    def _records(self, partial: _Records, rows: dict[int, RangeRows],
                 where: Mapping[str, object] | None, stalls: Sequence[Mapping[str, object]],
                 full: bool) -> list[bytes]:
        """The records of one write: what is new of the header, the rows, gc details, the state."""
        chunks = self._header(partial, full)
        for tid, part in rows.items():
            chunks += partial.rows_records(tid, part)
        chunks += self._gc(partial, full)
        chunks.append(self._state(partial, where, stalls))
        return chunks

    def _new_rows(self, parts: list[tuple[int, RangeRows]]) -> dict[int, RangeRows]:
        """Per thread, the rows not written yet (in end order)."""
        out: dict[int, list[RangeRows]] = {}
        for tid, rows in parts:
            if not len(rows):
                continue
            last_t1, seen = self.last.get(tid, (-1, 0))
            t1 = rows[:, 2]
            keep = t1 > last_t1
            same = np.flatnonzero(t1 == last_t1)
            if len(same) > seen:
                keep[same[seen:]] = True
            new = rows[keep]
            if not len(new):
                continue
            end = int(new[-1, 2])
            at_end = int(np.count_nonzero(new[:, 2] == end))
            self.last[tid] = (end, at_end + (seen if end == last_t1 else 0))
            out.setdefault(tid, []).append(new)
        return {tid: np.concatenate(parts) for tid, parts in out.items()}

    def _header(self, partial: _Records, full: bool) -> list[bytes]:
        chunks = []
        meta = self.meta()
        text = json.dumps(meta, default=str, sort_keys=True)
        if full or text != self.meta_text:
            self.meta_text = text
            chunks.append(partial.json_record(b"META", meta))
        infos = list(self.recorder.infos)
        ready = len(infos)  # names being added now are placeholders ("", "", 0) a moment
        for index in range(self.names, len(infos)):
            if not infos[index][0] and not infos[index][1]:
                ready = index
                break
        if ready > self.names:
            chunks.append(partial.json_record(
                b"NAME", [[i, *infos[i]] for i in range(self.names, ready)]))
            self.names = ready
        tracer = self.recorder.tracer
        threads = dict(tracer.ended_names)  # threads that ended since the last write
        threads.update({ts.tid: ts.thread_name for ts in list(tracer.states.values())})
        new = {tid: name for tid, name in threads.items() if self.threads.get(tid) != name}
        if new:
            chunks.append(partial.json_record(b"THRD", [[tid, n] for tid, n in new.items()]))
            self.threads.update(new)
        return chunks

    def _gc(self, partial: _Records, full: bool) -> list[bytes]:
        if self.gc_details is None:
            return []
        details, self.gc_mark = self.gc_details(0 if full else self.gc_mark)
        return [partial.gc_record(details)] if details else []

    def _state(self, partial: _Records, where: Mapping[str, object] | None,
               stalls: Sequence[Mapping[str, object]]) -> bytes:
        recorder = self.recorder
        state: dict[str, object] = {"perf_ns": recorder.tracer.clock(),
                                    "unix_ns": (where or {}).get("unix_ns") or time_ns(),
                                    "where": where, "stalls": list(stalls),
                                    "dropped": recorder.dropped + self.lost}
        if state["dropped"] and self.run_stats is not None:
            state["run_stats"] = self.run_stats()
        record: bytes = partial.json_record(b"STAT", state)
        return record

    def discard(self) -> None:
        """The final trace is written: the partial file goes."""
        with self._lock:
            if self.writer is not None:
                self.writer.discard()
            self._reset()

    def keep_if_room(self) -> None:
        """The final trace could not be written: the partial file stays as the run's trace,
        unless its file system is left without its headroom (then it goes, said in one line)."""
        with self._lock:
            writer = self.writer
            if writer is None or outputs.has_room(os.path.dirname(writer.path) or os.curdir):
                return
            if writer.discard():
                log.warning(f"the disk is nearly full: {one_line(writer.path)} deleted (the "
                            "trace so far leaves the rest to other programs)")
            self._reset()

    def after_fork(self) -> None:
        """In a forked child: start afresh (the parent's file stays the parent's)."""
        if self.writer is not None:
            self.writer.forget()
        self._lock = threading.Lock()
        self.stopped = None
        self._reset()
