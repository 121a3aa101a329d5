"""The trace so far: an append-only file that survives SIGKILL, the OOM killer or a native crash.

While the program runs, a background thread appends what the recorder
holds to ``TRACE.partial`` every few seconds (``CHAINER_PROF_FLUSH_INTERVAL``)
and at every stall report.  Appending costs no formatting: ranges are written
as the recorder's int64 rows.  After a normal exit the final trace replaces
it (:mod:`.tracefile`); when the process dies, the partial file is what is
left, and :func:`read_partial` turns it into the same trace-event object a
final trace holds, so ``report``, ``merge`` and the HTML report read it.

File layout: the line :data:`MAGIC`, then records, each an 8-byte header
(4-byte ASCII kind, little-endian uint32 payload length) and its payload:

* ``META``: JSON, the trace metadata (as ``otherData.chainer_autoprof``);
  the last one wins;
* ``NAME``: JSON list of ``[index, name, category, ARGB colour]``;
* ``THRD``: JSON list of ``[tid, thread name]``;
* ``ROWS``: int64 tid, then rows ``(name index, t0 ns, t1 ns, depth)`` of
  that thread, in end order (int64, little-endian);
* ``GCAR``: int64 rows ``(tid, t0, collected, uncollectable)`` of gc ranges;
* ``STAT``: JSON, the state at that write: when, where every thread was
  (open ranges), the stall reports so far; the last one wins.

Each write appends whole records in one ``write``; a record cut short by a
death in the middle of a write is ignored.  A file that grows past twice the
record limit is rewritten with the newest ranges (atomically), so the disk
used stays bounded like the memory.
"""

from __future__ import annotations

import io
import json
import struct
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from ..analysis import record
from ..common import outputs
from .trace_events import (
    RangeTrack,
    ThreadRanges,
    Timeline,
    in_track_order,
    process_events,
    write_container,
)

if TYPE_CHECKING:
    from ..common.typedefs import RangeRows

MAGIC = b"CHAINER_AUTOPROF_PARTIAL 1\n"
SUFFIX = ".partial"
_HEADER = struct.Struct("<4sI")
#: Rows per ROWS record at most (keeps a record under the 4 GiB length field).
_MAX_ROWS = 1 << 20


def partial_path(trace_path: str) -> str:
    """Where the trace so far is written for a final trace at ``trace_path``."""
    return trace_path + SUFFIX


# -- records ---------------------------------------------------------------------------

def _record(kind: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


def json_record(kind: bytes, value: object) -> bytes:
    """A META, NAME, THRD or STAT record."""
    return _record(kind, json.dumps(value, default=str, separators=(",", ":")).encode())


def rows_records(tid: int, rows: RangeRows) -> list[bytes]:
    """ROWS records of one thread's ``(n, 4)`` int64 rows."""
    rows = np.ascontiguousarray(rows, dtype="<i8").reshape(-1, 4)
    out = []
    for start in range(0, len(rows), _MAX_ROWS):
        part = rows[start:start + _MAX_ROWS]
        out.append(_record(b"ROWS", struct.pack("<q", tid) + part.tobytes()))
    return out


def gc_record(rows: Sequence[tuple[int, int, int, int]]) -> bytes:
    """A GCAR record: ``(tid, t0, collected, uncollectable)`` rows."""
    return _record(b"GCAR", np.ascontiguousarray(rows, dtype="<i8").reshape(-1, 4).tobytes())


def records(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(kind, payload)`` of every whole record after the magic line."""
    pos = len(MAGIC)
    end = len(data)
    while pos + _HEADER.size <= end:
        kind, length = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        if pos + length > end:
            return  # cut short by the death of the writer
        yield kind, data[pos:pos + length]
        pos += length


# -- writing -----------------------------------------------------------------------------

class PartialWriter:
    """Appends records to one partial trace file; rewrites it whole when asked.

    The file is the agent's own (:class:`~..common.outputs.PrivateFile`):
    created exclusively and private, no descriptor held between writes, each
    write leaving the file system's headroom; it raises what that raises
    (``NotOursError``, ``NoRoomError``, ``OSError``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: outputs.PrivateFile | None = None
        self.size = 0

    def append(self, chunks: list[bytes]) -> None:
        """Append ``chunks`` (whole records) in one write, creating the file if needed."""
        if self._file is None:
            data = b"".join([MAGIC, *chunks])
            self._file = outputs.PrivateFile.create(self.path, data)
        else:
            data = b"".join(chunks)
            self._file.append(data)
        self.size += len(data)

    def rewrite(self, chunks: list[bytes]) -> None:
        """Replace the file with ``chunks`` (whole records), atomically."""
        data = b"".join([MAGIC, *chunks])
        if self._file is None:
            self._file = outputs.PrivateFile.create(self.path, data)
        else:
            self._file.replace(data)
        self.size = len(data)

    def move(self, path: str) -> None:
        """The file is now called ``path`` (e.g. the MPI rank became known)."""
        if path == self.path:
            return
        if self._file is not None:
            self._file.rename(path)
        self.path = path

    def discard(self) -> bool:
        """Delete the file (the final trace was written, or writing it failed); whether there
        was one of ours to delete."""
        made, self._file = self._file, None
        return made is not None and made.remove()

    def forget(self) -> None:
        """In a forked child: the parent's file is not ours."""
        self._file = None


# -- reading -----------------------------------------------------------------------------

def read_partial(path: str, limit: int | None = None,
                 data: bytes | None = None) -> dict[str, Any]:
    """The trace-event object of a partial trace, as a final trace of the same ranges holds it.

    ``limit``: the newest ranges kept (default: the run's record limit);
    ``data``: the file's bytes, when already read (a pipe is read once).
    ``otherData.chainer_autoprof.partial`` holds the last state written.
    """
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    if not data.startswith(MAGIC):
        raise ValueError(f"{path} is not a partial trace")
    meta: dict[str, Any] = {}
    state: dict[str, Any] = {}
    infos: dict[int, tuple[str, str, int]] = {}
    thread_names: dict[int, str] = {}
    blocks: dict[int, list[RangeRows]] = {}
    gc_args: dict[tuple[int, int], dict[str, int]] = {}
    for kind, payload in records(data):
        if kind == b"META":
            meta = json.loads(payload)
        elif kind == b"STAT":
            state = json.loads(payload)
        elif kind == b"NAME":
            for index, name, category, color in json.loads(payload):
                infos[int(index)] = (str(name), str(category), int(color))
        elif kind == b"THRD":
            for tid, name in json.loads(payload):
                thread_names[int(tid)] = str(name)
        elif kind == b"ROWS" and len(payload) >= 8:
            (tid,) = struct.unpack_from("<q", payload)
            rows = np.frombuffer(payload, dtype="<i8", offset=8)
            blocks.setdefault(tid, []).append(rows[:len(rows) // 4 * 4].reshape(-1, 4))
        elif kind == b"GCAR":
            rows = np.frombuffer(payload, dtype="<i8")
            for tid, t0, collected, uncollectable in rows[:len(rows) // 4 * 4].reshape(
                    -1, 4).tolist():
                gc_args[(tid, t0)] = {"collected": collected, "uncollectable": uncollectable}
    per_thread = {tid: np.concatenate(parts) for tid, parts in blocks.items()}
    if limit is None:
        limit = int((meta.get("settings") or {}).get("record_limit") or 0) or None
    dropped = _keep_newest(per_thread, limit)
    pid = meta.get("pid", 0)
    start_ns = int((meta.get("clock") or {}).get("perf_counter_ns_at_start", 0))
    written_ns = int(state.get("perf_ns", 0) or 0)
    meta = dict(meta)
    clock = dict(meta.get("clock") or {})
    if written_ns and start_ns:
        clock["duration_ns"] = written_ns - start_ns
    dropped_ranges = int(state.get("dropped", 0)) + dropped
    record.add(meta, record.By.READ, clock=clock, dropped_ranges=dropped_ranges)
    if state.get("run_stats") and dropped_ranges:
        record.add(meta, record.By.READ, run_stats=state["run_stats"])
    last = {key: value for key, value in state.items() if key != "run_stats"}
    last["path"] = path
    record.add(meta, record.By.READ, partial=last)
    known, per_thread = _dense_names(infos, per_thread)
    threads = in_track_order((ThreadRanges(tid, thread_names.get(tid, f"thread {tid}"), [rows])
                              for tid, rows in per_thread.items()), meta.get("main_tid"))
    text = io.StringIO()
    write_container(text, meta, process_events(
        Timeline(pid, start_ns), meta.get("process_name") or f"pid {pid}",
        RangeTrack(known, threads, gc_args)))
    trace: dict[str, Any] = json.loads(text.getvalue())
    return trace


def _dense_names(infos: dict[int, tuple[str, str, int]], per_thread: dict[int, RangeRows]
                 ) -> tuple[list[tuple[str, str, int]], dict[int, RangeRows]]:
    """The names by index 0..n-1, and each thread's rows with their names' new indexes (rows
    of a name never written left out): a damaged index never sizes a list."""
    keys = np.array(sorted(infos), dtype=np.int64)
    names = [infos[int(k)] for k in keys]
    out = {}
    for tid, rows in per_thread.items():
        pos = np.searchsorted(keys, rows[:, 0])
        known = pos < len(keys)
        known[known] = keys[pos[known]] == rows[known, 0]
        rows = rows[known].copy()
        rows[:, 0] = pos[known]
        out[tid] = rows
    return names, out


def _keep_newest(per_thread: dict[int, RangeRows], limit: int | None) -> int:
    """Keep the newest ``limit`` rows of all threads (by end); returns how many were dropped."""
    total = sum(len(rows) for rows in per_thread.values())
    if not limit or total <= limit:
        return 0
    ends = np.sort(np.concatenate([rows[:, 2] for rows in per_thread.values()]))
    cut = ends[total - limit]
    for tid, rows in list(per_thread.items()):
        per_thread[tid] = rows[rows[:, 2] >= cut]
    return total - sum(len(rows) for rows in per_thread.values())
