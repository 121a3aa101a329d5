"""GPU activity records (CUPTI), columnar: what the live collector hands over and what the
recordings hold, in one form the attribution, the figures and the trace events read.

A :class:`ActivityBatch` is a block of records as they come from one CUPTI buffer (or
from a recording): NumPy ``int64`` columns, one row per record, no Python object per
record.  Its parts:

* :class:`GpuOps` -- what ran on a GPU: kernels, memory copies and memsets in one table
  (``kind``: :data:`KERNEL`, :data:`MEMCPY`, :data:`MEMSET`); GPU start/end in CUPTI's
  nanoseconds, the correlation id of the API call that launched it, device, context and
  stream, the kernel's name (an id into the batch's :class:`NameTable`), grid, block,
  registers and shared memory where CUPTI gave them; a copy's bytes and kinds, a
  memset's bytes and value.  ``-1`` where a column does not apply or is not known.
* :class:`ApiCalls` -- CUDA runtime and driver API calls (``domain``: :data:`RUNTIME`,
  :data:`DRIVER`): host start/end in CUPTI's nanoseconds, correlation id, callback id
  (which function) and CUPTI's thread id.  A kernel's correlation id is that of the call
  that launched it: a runtime call for cuBLAS's kernels, a driver call (``cuLaunchKernel``)
  for CuPy's own.
* :class:`ExternalIds` -- CUPTI's external correlation records (correlation id ->
  external id), kept for comparison; the attribution does not need them.

The clock: CUPTI's timestamps are its own (on Linux the realtime clock);
:class:`ClockPairs` holds pairs ``(CUPTI ns, time.perf_counter_ns())`` read together,
from which :mod:`..analysis.gpu_clock` maps them onto the agent's clock.

Thread ids: CUPTI's ``threadId`` is, by default, ``pthread_self()`` cut to 32 bits (so
``threading.get_ident() & 0xFFFFFFFF``), or the kernel's thread id (``gettid``, the
agent's ``tid``) once ``cuptiSetThreadIdType(SYSTEM)`` was called; see
:mod:`..analysis.gpu_attribution` for how each is tied to the agent's threads.

The recordings (``tests/data/gpu/cupti/*/cupti_activity.json.gz``) are read by
:func:`recording_from_json`; the live collector (:mod:`..runtime.gpu_activity`) builds
the same batches from cupti-python's records with :func:`batch_from_records`.
"""

from __future__ import annotations

import gzip
import json
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, TypeVar, Union

import numpy as np
import numpy.typing as npt

Int64Array = npt.NDArray[np.int64]
#: What selects rows of columns: a boolean mask, integer positions or a slice.
RowIndex = Union[npt.NDArray[np.bool_], npt.NDArray[np.intp], Int64Array, slice]

#: The attribution's range lookup in C (``runtime/cupti_locate.c``): ``(launches,
#: ((depth, t0, t1, index, ordinal, number), ...) shallowest first, kinds, link ids, out[,
#: tail])``, ``out`` the columns ``LaunchAttributor._locate_numpy`` fills, written in place;
#: with ``tail`` the operations are settled too and the sums per status returned.
LocateKernel = Callable[..., Any]

#: GpuOps.kind
KERNEL, MEMCPY, MEMSET = 0, 1, 2
OP_KINDS = ("kernel", "memcpy", "memset")
#: ApiCalls.domain
RUNTIME, DRIVER = 0, 1
API_DOMAINS = ("runtime", "driver")

#: CUPTI's activity kinds (``CUpti_ActivityKind``) of the records converted here.
CUPTI_KIND_MEMCPY = 1
CUPTI_KIND_MEMSET = 2
CUPTI_KIND_KERNEL = 3
CUPTI_KIND_DRIVER = 4
CUPTI_KIND_RUNTIME = 5
CUPTI_KIND_CONCURRENT_KERNEL = 10
CUPTI_KIND_EXTERNAL_CORRELATION = 39

#: CUPTI's memcpy kinds (``CUpti_ActivityMemcpyKind``) as the trace names them.
COPY_KIND_NAMES = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA",
                   6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
#: CUPTI's memory kinds (``CUpti_ActivityMemoryKind``) of a copy's source and destination.
MEMORY_KIND_NAMES = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array",
                     5: "Managed", 6: "Device Static", 7: "Managed Static"}


def _empty() -> Int64Array:
    return np.zeros(0, dtype=np.int64)


T = TypeVar("T", bound="Columns")


#: Each Columns class's column names, in field order.
_COLUMNS: dict[type, tuple[str, ...]] = {}


@dataclass
class Columns:
    """Equal-length int64 columns (one dataclass field each)."""

    def __len__(self) -> int:  # (each table below reads its first column by name: cheaper)
        return len(getattr(self, self.columns()[0]))

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        found = _COLUMNS.get(cls)
        if found is None:  # once per class: dataclasses.fields() is dear on a hot path
            found = _COLUMNS[cls] = tuple(f.name for f in fields(cls))
        return found

    @classmethod
    def empty(cls: type[T]) -> T:
        none = _empty()  # one zero-length array for every column (no row to write)
        return cls(**dict.fromkeys(cls.columns(), none))

    @classmethod
    def from_columns(cls: type[T], n: int, values: Mapping[str, Any]) -> T:
        """``n`` rows from ``values`` (name -> sequence); a missing column is all ``-1``."""
        out = {}
        for name in cls.columns():
            given = values.get(name)
            if given is None:
                out[name] = np.full(n, -1, dtype=np.int64)
            else:
                col = np.asarray(given, dtype=np.int64).reshape(-1)
                if len(col) != n:
                    raise ValueError(f"{cls.__name__}.{name}: {len(col)} values for {n} rows")
                out[name] = col
        return cls(**out)

    def take(self: T, index: RowIndex) -> T:
        """The rows ``index`` selects (a boolean mask, a slice or integer positions)."""
        return type(self)(**{name: getattr(self, name)[index] for name in self.columns()})

    @classmethod
    def concat(cls: type[T], parts: Sequence[T]) -> T:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts])
                      for name in cls.columns()})

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.columns())


@dataclass
class GpuOps(Columns):
    """Kernels, memory copies and memsets: one row each (see the module docstring)."""

    kind: Int64Array
    start: Int64Array
    end: Int64Array
    correlation: Int64Array
    device: Int64Array
    context: Int64Array
    stream: Int64Array
    name: Int64Array          # kernel name id (NameTable); -1 for copies and memsets
    bytes: Int64Array         # copies and memsets
    copy_kind: Int64Array     # memcpy: CUpti_ActivityMemcpyKind
    src_kind: Int64Array      # memcpy: CUpti_ActivityMemoryKind of the source
    dst_kind: Int64Array      # memcpy: ... of the destination
    value: Int64Array         # memset: the value set
    grid_x: Int64Array
    grid_y: Int64Array
    grid_z: Int64Array
    block_x: Int64Array
    block_y: Int64Array
    block_z: Int64Array
    registers: Int64Array     # registers per thread
    static_smem: Int64Array   # bytes of static shared memory
    dynamic_smem: Int64Array  # bytes of dynamic shared memory

    def __len__(self) -> int:
        return len(self.kind)


@dataclass
class ApiCalls(Columns):
    """CUDA runtime and driver API calls (``domain``): host times, correlation, callback id."""

    domain: Int64Array
    start: Int64Array
    end: Int64Array
    correlation: Int64Array
    cbid: Int64Array
    thread: Int64Array        # CUPTI's threadId (see the module docstring)

    def __len__(self) -> int:
        return len(self.domain)


@dataclass
class ExternalIds(Columns):
    """External correlation records: a CUDA API call's correlation id -> an external id."""

    correlation: Int64Array
    external_id: Int64Array
    external_kind: Int64Array

    def __len__(self) -> int:
        return len(self.correlation)


class NameSource(Protocol):
    """Where a reader keeps kernel names' texts until they are needed (the native reader's
    store: no Python string is made for a name while records are read)."""

    def texts(self, first: int, stop: int) -> list[str]:
        """The texts of the source's names ``first`` .. ``stop - 1``."""


class NameTable:
    """Kernel names, interned: ``id -> name``; append-only and shared by a stream's batches
    (a batch's ``name`` column indexes it).  Any thread may add names.

    A reader may add ids whose texts stay in a :class:`NameSource` (:meth:`extend_from`):
    they are fetched, all at once, when a name or an interning first needs them; the index
    ``text -> id`` is made only when something interns (the figures only read names)."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._names: list[str] = []
        self._ids: dict[str, int] = {}
        self._indexed = 0  # names[:_indexed] are in _ids
        #: ids ``len(_names)`` on whose texts are still with their sources: (stop, source)
        self._lazy: list[tuple[int, NameSource]] = []
        self._size = 0
        for name in names:
            self.intern(name)

    @property
    def names(self) -> list[str]:
        """Every name, by id (texts still with a source fetched first)."""
        if self._lazy:
            with self._lock:
                self._resolve()
        return self._names

    @property
    def pending(self) -> int:
        """How many names' texts are still with their sources."""
        return self._size - len(self._names)

    def _resolve(self) -> None:
        """Fetch the texts still with sources (the lock held).  A source that cannot tell
        (a forked child's copy of one in use) leaves ``kernel#<id>``, as for unknown ids."""
        while self._lazy:
            stop, source = self._lazy[0]
            first = len(self._names)
            try:
                texts = source.texts(first, stop)
            except Exception:  # noqa: BLE001 -- a name is never worth an error at exit
                texts = []
            if len(texts) != stop - first:
                texts = [f"kernel#{i}" for i in range(first, stop)]
            self._names.extend(texts)
            self._lazy.pop(0)

    def _index(self) -> dict[str, int]:
        """``text -> id`` of every name (the lock held); a text twice keeps its first id."""
        self._resolve()
        ids, names = self._ids, self._names
        for i in range(self._indexed, len(names)):
            ids.setdefault(names[i], i)
        self._indexed = len(names)
        return ids

    def intern(self, name: str) -> int:
        found = self._ids.get(name)
        if found is not None:
            return found
        with self._lock:
            ids = self._index()
            found = ids.get(name)
            if found is None:
                found = ids[name] = len(self._names)
                self._names.append(name)
                self._indexed = self._size = len(self._names)
        return found

    def intern_all(self, names: list[str]) -> list[int]:
        """Each name's id (:meth:`intern`), under one taking of the lock."""
        with self._lock:
            ids = self._index()
            for name in names:
                if name not in ids:
                    ids[name] = len(self._names)
                    self._names.append(name)
            self._indexed = self._size = len(self._names)
            return [ids[name] for name in names]

    def extend_new(self, first: int, names: list[str]) -> bool:
        """Append ``names`` as ids ``first``, ``first + 1``, ... when that is where they go
        (the table ``first`` long, none of them in it, no two alike); whether it did.  One
        pass in C over the names, not one Python step each (a reader's new names)."""
        with self._lock:
            if self._size != first:
                return False
            ids = self._index()
            if not ids.keys().isdisjoint(names):
                return False
            before = len(ids)
            ids.update(zip(names, range(first, first + len(names))))
            if len(ids) != before + len(names):  # two alike: undone, interned one by one
                for name in names:
                    ids.pop(name, None)
                return False
            self._names.extend(names)
            self._indexed = self._size = len(self._names)
            return True

    def extend_from(self, first: int, stop: int, source: NameSource) -> bool:
        """Add ids ``first`` .. ``stop - 1`` whose texts ``source`` keeps (fetched when first
        needed) when that is where they go (the table ``first`` long); whether it did.  The
        caller vouches that the texts are new to the table and distinct (a reader whose
        every id so far is the table's own); no text is read here."""
        with self._lock:
            if self._size != first:
                return False
            if stop > first:
                self._lazy.append((stop, source))
                self._size = stop
            return True

    def name(self, index: int) -> str:
        names = self._names
        if 0 <= index < len(names):
            return names[index]
        if len(names) <= index < self._size:
            return self.names[index]
        return f"kernel#{index}"

    def __len__(self) -> int:
        return self._size


@dataclass
class ActivityBatch:
    """One block of activity records: GPU operations, API calls, external ids."""

    ops: GpuOps
    api: ApiCalls
    external: ExternalIds
    names: NameTable = field(default_factory=NameTable)

    @classmethod
    def empty(cls, names: NameTable | None = None) -> ActivityBatch:
        return cls(GpuOps.empty(), ApiCalls.empty(), ExternalIds.empty(),
                   names if names is not None else NameTable())

    def __len__(self) -> int:
        return len(self.ops) + len(self.api) + len(self.external)

    @property
    def op_count(self) -> int:
        """Its operations (without making their columns, where they are not made yet)."""
        return len(self.ops)

    @property
    def api_count(self) -> int:
        """Its calls (as :attr:`op_count`)."""
        return len(self.api)

    def split(self, pieces: int) -> list[ActivityBatch]:
        """The batch cut into ``pieces`` consecutive blocks of each part (replays in blocks)."""
        def cut(n: int, i: int) -> slice:
            return slice(n * i // pieces, n * (i + 1) // pieces)

        return [ActivityBatch(self.ops.take(cut(len(self.ops), i)),
                              self.api.take(cut(len(self.api), i)),
                              self.external.take(cut(len(self.external), i)), self.names)
                for i in range(pieces)]


def table_rows(table: Any, room: int, columns: int, n: int) -> Int64Array:
    """``table``'s first ``columns`` columns (int64, column c's rows from c * ``room`` on),
    the first ``n`` rows of each, as one 2-D view (a column a row)."""
    view: Int64Array = np.ndarray((columns, n), np.int64, table, 0, (room * 8, 8))
    return view


def table_columns(cls: type[T], table: Any, room: int, n: int) -> T:
    """The table ``cls`` of ``table``'s columns (int64, column c's rows from c * ``room`` on),
    the first ``n`` rows of each: views, one 2-D view's rows iterated in C (zip stops at the
    last name), no Python line per column."""
    names = cls.columns()
    made = cls.__new__(cls)
    made.__dict__.update(zip(names, table_rows(table, room, len(names), n)))
    return made


class TableBatch(ActivityBatch):
    """A buffer of the native reader (``runtime/cupti_native.c``) as the two tables it wrote:
    ``op_table`` and ``api_table`` (buffers of int64: column c's rows from c * ``room`` on,
    the first :attr:`op_count` and :attr:`api_count` of them filled), which the attribution's
    C kernels read whole.  Its :class:`GpuOps` and :class:`ApiCalls`, NumPy views of those
    rows, are made only when :attr:`ops` or :attr:`api` is first read: the usual buffer
    never needs their twenty-three views, some 1,300 instructions each."""

    # the column views, made when first read (on the class: a buffer's object sets only what
    # it has, made on CUPTI's thread at every buffer)
    _ops: GpuOps | None = None
    _api: ApiCalls | None = None
    # the counts as plain attributes (no property call: each buffer reads them a few times)
    op_count = 0
    api_count = 0

    def __init__(self, op_table: Any, n_ops: int, api_table: Any, n_api: int, room: int,
                 external: ExternalIds, names: NameTable) -> None:
        self.op_table, self.api_table, self.room = op_table, api_table, room
        self.op_count, self.api_count = n_ops, n_api
        self.external = external
        self.names = names

    @property
    def ops(self) -> GpuOps:
        made = self._ops
        if made is None:
            made = self._ops = table_columns(GpuOps, self.op_table, self.room, self.op_count)
        return made

    @ops.setter
    def ops(self, value: GpuOps) -> None:
        self._ops = value

    @property
    def api(self) -> ApiCalls:
        made = self._api
        if made is None:
            made = self._api = table_columns(ApiCalls, self.api_table, self.room, self.api_count)
        return made

    @api.setter
    def api(self, value: ApiCalls) -> None:
        self._api = value


@dataclass
class ClockPairs:
    """``(CUPTI ns, perf_counter ns)`` read together; ``read_ns``: how long each pair's
    reads took (an upper bound of its error), ``-1`` where unknown."""

    cupti_ns: Int64Array
    perf_ns: Int64Array
    read_ns: Int64Array

    def __len__(self) -> int:
        return len(self.cupti_ns)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]]) -> ClockPairs:
        """Rows ``(cupti_ns, perf_counter_ns[, read_ns])``."""
        a = [list(r) + [-1] * (3 - len(r)) for r in rows]
        arr = np.asarray(a, dtype=np.int64).reshape(-1, 3)
        return cls(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy())


@dataclass
class Recording:
    """A recording of CUPTI activity beside an agent trace of the same process."""

    batch: ActivityBatch
    clock: ClockPairs
    external_names: dict[int, str]
    description: str = ""


# --------------------------------------------------------------------------
# The recording format (tests/data/gpu/cupti/*/cupti_activity.json.gz)
# --------------------------------------------------------------------------

#: Recording column -> our column, per part.
_RECORDING_COLUMNS = {
    "kernels": {"start": "start", "end": "end", "correlation_id": "correlation",
                "name_index": "name", "stream_id": "stream", "device_id": "device",
                "context_id": "context", "grid_x": "grid_x", "grid_y": "grid_y",
                "grid_z": "grid_z", "block_x": "block_x", "block_y": "block_y",
                "block_z": "block_z", "registers_per_thread": "registers",
                "static_shared_memory": "static_smem",
                "dynamic_shared_memory": "dynamic_smem"},
    "memcpy": {"start": "start", "end": "end", "correlation_id": "correlation",
               "bytes": "bytes", "copy_kind": "copy_kind", "src_kind": "src_kind",
               "dst_kind": "dst_kind", "stream_id": "stream", "device_id": "device",
               "context_id": "context"},
    "memset": {"start": "start", "end": "end", "correlation_id": "correlation",
               "bytes": "bytes", "value": "value", "stream_id": "stream",
               "device_id": "device", "context_id": "context"},
    "runtime": {"start": "start", "end": "end", "correlation_id": "correlation",
                "cbid": "cbid", "thread_id": "thread"},
    "driver": {"start": "start", "end": "end", "correlation_id": "correlation",
               "cbid": "cbid", "thread_id": "thread"},
    "external": {"correlation_id": "correlation", "external_id": "external_id",
                 "external_kind": "external_kind"},
}


def _part(data: Mapping[str, Any], part: str) -> tuple[int, dict[str, Any]]:
    rows = data.get(part) or []
    names = (data.get("columns") or {}).get(part) or []
    if rows and len(names) != len(rows[0]):
        raise ValueError(f"recording: {part}: {len(rows[0])} values per row, "
                         f"{len(names)} column names")
    arr = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(names))
    mapping = _RECORDING_COLUMNS[part]
    return len(rows), {mapping[c]: arr[:, i] for i, c in enumerate(names) if c in mapping}


def recording_from_json(data: Mapping[str, Any]) -> Recording:
    """A recording's JSON object -> :class:`Recording` (ValueError for another shape).

    A copy or memset without a device column is placed on the device that runs the
    kernels of its stream (CUPTI's stream ids are unique in a process), else device 0.
    """
    if not isinstance(data, Mapping) or "clock_pairs" not in data:
        raise ValueError("recording: not a CUPTI activity recording (no clock_pairs)")
    names = NameTable(str(n) for n in data.get("kernel_names") or [])
    parts: list[GpuOps] = []
    stream_device: dict[int, int] = {}
    n, cols = _part(data, "kernels")
    if n:
        cols["kind"] = np.full(n, KERNEL, dtype=np.int64)
        kernels = GpuOps.from_columns(n, cols)
        parts.append(kernels)
        for s, d in zip(kernels.stream.tolist(), kernels.device.tolist()):
            stream_device.setdefault(s, d)
    for part, kind in (("memcpy", MEMCPY), ("memset", MEMSET)):
        n, cols = _part(data, part)
        if not n:
            continue
        cols["kind"] = np.full(n, kind, dtype=np.int64)
        if "device" not in cols:
            cols["device"] = np.array([stream_device.get(int(s), 0) for s in cols["stream"]],
                                      dtype=np.int64)
        parts.append(GpuOps.from_columns(n, cols))
    apis: list[ApiCalls] = []
    for part, domain in (("runtime", RUNTIME), ("driver", DRIVER)):
        n, cols = _part(data, part)
        if n:
            cols["domain"] = np.full(n, domain, dtype=np.int64)
            apis.append(ApiCalls.from_columns(n, cols))
    n, cols = _part(data, "external")
    external = ExternalIds.from_columns(n, cols) if n else ExternalIds.empty()
    pairs = data["clock_pairs"]
    pair_cols = list(pairs.get("columns") or [])
    rows = pairs.get("rows") or []
    try:
        ic, ip = pair_cols.index("cupti_ns"), pair_cols.index("perf_counter_ns")
    except ValueError:
        raise ValueError("recording: clock_pairs need cupti_ns and perf_counter_ns") from None
    iu = pair_cols.index("unix_ns") if "unix_ns" in pair_cols else None
    clock_rows = []
    for row in rows:
        cupti, perf = int(row[ic]), int(row[ip])
        read = -1
        if iu is not None:
            # CUPTI's timestamps are the realtime clock here: read first, the unix time
            # last, perf_counter between them, so their difference bounds the pair's error
            gap = int(row[iu]) - cupti
            if 0 <= gap < 1_000_000:
                read = gap
        clock_rows.append((cupti, perf, read))
    return Recording(
        ActivityBatch(GpuOps.concat(parts), ApiCalls.concat(apis), external, names),
        ClockPairs.from_rows(clock_rows),
        {int(k): str(v) for k, v in (data.get("external_ids") or {}).items()},
        str(data.get("what") or ""))


def read_recording(path: str) -> Recording:
    """A recording file (JSON, gzip-compressed when its name ends in ``.gz``)."""
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return recording_from_json(json.load(f))


# --------------------------------------------------------------------------
# cupti-python's records (the live path)
# --------------------------------------------------------------------------

#: Our column -> the attribute of cupti-python's record, per kind of record.
_OP_ATTRS = {
    "start": "start", "end": "end", "correlation": "correlation_id", "device": "device_id",
    "context": "context_id", "stream": "stream_id",
}
_KERNEL_ATTRS = {
    "grid_x": "grid_x", "grid_y": "grid_y", "grid_z": "grid_z", "block_x": "block_x",
    "block_y": "block_y", "block_z": "block_z", "registers": "registers_per_thread",
    "static_smem": "static_shared_memory", "dynamic_smem": "dynamic_shared_memory",
}
_MEMCPY_ATTRS = {"bytes": "bytes", "copy_kind": "copy_kind", "src_kind": "src_kind",
                 "dst_kind": "dst_kind"}
_MEMSET_ATTRS = {"bytes": "bytes", "value": "value"}
_API_ATTRS = {"start": "start", "end": "end", "correlation": "correlation_id",
              "cbid": "cbid", "thread": "thread_id"}
_EXTERNAL_ATTRS = {"correlation": "correlation_id", "external_id": "external_id",
                   "external_kind": "external_kind"}


def _int(record: Any, attr: str) -> int:
    value = getattr(record, attr, -1)
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def batch_from_records(records: Iterable[Any], names: NameTable) -> ActivityBatch:
    """cupti-python's activity records (one completed buffer) -> :class:`ActivityBatch`.

    Each record is an object with CUPTI's fields in snake case (``kind``, ``start``,
    ``end``, ``correlation_id``, ...); kinds other than kernels, copies, memsets,
    runtime/driver calls and external correlations are skipped.  A field a record lacks
    is ``-1``.  Kernel names are interned into ``names``.
    """
    ops: dict[str, list[int]] = {c: [] for c in GpuOps.columns()}
    api: dict[str, list[int]] = {c: [] for c in ApiCalls.columns()}
    ext: dict[str, list[int]] = {c: [] for c in ExternalIds.columns()}
    for rec in records:
        k = _int(rec, "kind")
        if k in (CUPTI_KIND_CONCURRENT_KERNEL, CUPTI_KIND_KERNEL, CUPTI_KIND_MEMCPY,
                 CUPTI_KIND_MEMSET):
            row = dict.fromkeys(GpuOps.columns(), -1)
            for col, attr in _OP_ATTRS.items():
                row[col] = _int(rec, attr)
            if k == CUPTI_KIND_MEMCPY:
                row["kind"] = MEMCPY
                extra = _MEMCPY_ATTRS
            elif k == CUPTI_KIND_MEMSET:
                row["kind"] = MEMSET
                extra = _MEMSET_ATTRS
            else:
                row["kind"] = KERNEL
                extra = _KERNEL_ATTRS
                name = getattr(rec, "name", None)
                row["name"] = names.intern(name if isinstance(name, str) else str(name))
            for col, attr in extra.items():
                row[col] = _int(rec, attr)
            for col, value in row.items():
                ops[col].append(value)
        elif k in (CUPTI_KIND_RUNTIME, CUPTI_KIND_DRIVER):
            api["domain"].append(RUNTIME if k == CUPTI_KIND_RUNTIME else DRIVER)
            for col, attr in _API_ATTRS.items():
                api[col].append(_int(rec, attr))
        elif k == CUPTI_KIND_EXTERNAL_CORRELATION:
            for col, attr in _EXTERNAL_ATTRS.items():
                ext[col].append(_int(rec, attr))
    return ActivityBatch(GpuOps.from_columns(len(ops["kind"]), ops),
                         ApiCalls.from_columns(len(api["domain"]), api),
                         ExternalIds.from_columns(len(ext["correlation"]), ext), names)
