"""Attribution by launch: every kernel, copy and memset -> the agent range that launched it.

Each GPU operation carries the correlation id of the CUDA API call that launched it (a
runtime call, or a driver call for CuPy's own kernels); that call carries the launching
thread and its host start time.  On the agent's clock (:mod:`.gpu_clock`), the launch
falls inside ranges of that thread: the innermost one (iteration, phase, link, link
backward, function; a garbage-collection range is passed over for its parent) is where
the operation belongs, its innermost link or link-backward range gives the link and
direction, its phase and iteration range the phase and iteration.

Streaming and bounded (:class:`LaunchAttributor`): ranges arrive as the recorder and the
trace hold them -- blocks of rows ``(name index, t0, t1, depth)`` per thread in end
order -- and activity as CUPTI hands its buffers over, late and out of order across
streams.  An operation is attributed once everything is known:

* its API call has arrived (joined by correlation id; the newest :attr:`max_api` calls
  are kept);
* its CUPTI thread is tied to an agent thread: given per thread by the live agent
  (:meth:`map_thread`, or ``identity_threads`` when CUPTI reports system thread ids);
  for a recording without that map, by containment: the agent thread whose top-level
  ranges contain at least 90% of at least 16 of its launches (each agent thread taken
  by one CUPTI thread);
* the launching thread's ranges are known past the launch: a top-level (depth 0) range
  that ends after it has been fed, or the thread ended.  Ranges on one thread nest, so
  at each depth they are disjoint and arrive sorted; the innermost containing range is
  one binary search per depth.

Where the C lookup is given (``locate``, a function of the ``_cupti`` extension), the same
extension keeps the launching calls (a table in C sorted by correlation id, appended as
buffers come) and a buffer whose every operation can be attributed at once -- the usual
-- is mapped, joined, located and settled in C, a few calls per buffer
(:meth:`LaunchAttributor._feed_native`); anything else takes the general path below,
with the same results.

What waits is bounded (:attr:`max_pending` operations per kind of wait, the oldest
forced out first with what is known, and counted by status), and each thread keeps its
newest :attr:`max_ranges` ranges (a launch older than those is counted as such).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from types import ModuleType
from typing import TYPE_CHECKING, Iterable

import numpy as np
import numpy.typing as npt

from ..common.gpu_records import (
    ActivityBatch,
    ApiCalls,
    Columns,
    GpuOps,
    RowIndex,
    TableBatch,
    table_columns,
    table_rows,
)
from .gpu_clock import ClockMap
from .range_kinds import K_GC, K_LINK, K_LINK_BWD, K_OTHER, K_PHASE0, LinkIds, range_kind
from .range_kinds import K_ITER as K_ITER  # the iterations' ranges, for the trace's GPU events
from .stats import DEPTH_BITS, DEPTH_MASK, PHASE_KEYS

if TYPE_CHECKING:
    from ..common.gpu_records import LocateKernel
    from ..common.typedefs import RangeRows

Int64Array = npt.NDArray[np.int64]


#: Attribution.phase: an index in PHASE_KEYS (4, "other": in an iteration, outside its
#: phases), or PHASE_OUTSIDE (not in an iteration).
PHASE_OTHER = PHASE_KEYS.index("other")
PHASE_OUTSIDE = -1

#: Attribution.status
ATTRIBUTED = 0     # tied to the ranges of its launching thread (range -1: none was open)
NO_API = 1         # its launching API call never arrived (API activity off, or dropped)
NO_THREAD = 2      # its CUPTI thread could not be tied to an agent thread
RANGES_DROPPED = 3  # launched before the oldest range still kept for its thread
OPEN = 4           # forced out while the ranges around its launch were still open
STATUSES = ("attributed", "no launch record", "unknown thread", "ranges dropped",
            "ranges still open")

#: Containment fallback for CUPTI threads without a map: launches needed, share inside.
MIN_VOTES = 16
MIN_SHARE = 0.9

#: The kinds a range lookup in C must count alike (``runtime/cupti_locate.c``).
LOCATE_KINDS = (K_ITER, K_LINK, K_LINK_BWD, K_GC, K_PHASE0)


@dataclass
class Attribution(Columns):
    """Per operation: its launch and where it belongs (one row per row of the ops)."""

    status: Int64Array
    api_start: Int64Array   # launching call, agent ns (-1: none)
    api_end: Int64Array
    api_domain: Int64Array  # RUNTIME / DRIVER
    cbid: Int64Array
    tid: Int64Array         # the agent's thread id (-1: unknown)
    range: Int64Array       # innermost range's name index (-1: none)
    range_t0: Int64Array    # its start, agent ns: (tid, range_t0) names the range
    range_t1: Int64Array    # its end
    range_depth: Int64Array
    link: Int64Array        # link key id (LaunchAttributor.link_keys; -1: none)
    backward: Int64Array    # 1 when that link range is a link-backward one
    phase: Int64Array       # PHASE_KEYS index, or PHASE_OUTSIDE
    iteration: Int64Array   # iteration ordinal on its thread, from 0 (-1: none)
    number: Int64Array      # the iteration's recorded number (-1: none)
    iter_end: Int64Array    # the iteration range's end, agent ns (-1: none)
    counted: Int64Array     # 1 in a counted iteration (after the warm-up)

    def __len__(self) -> int:
        return len(self.status)


@dataclass
class AttributedOps:
    """GPU operations on the agent's clock with their attribution (equal lengths)."""

    ops: GpuOps
    attr: Attribution

    def __len__(self) -> int:
        return len(self.ops)

    @classmethod
    def empty(cls) -> AttributedOps:
        return cls(GpuOps.empty(), Attribution.empty())

    def take(self, index: RowIndex) -> AttributedOps:
        return AttributedOps(self.ops.take(index), self.attr.take(index))

    @classmethod
    def concat(cls, parts: Iterable[AttributedOps]) -> AttributedOps:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls(GpuOps.concat([p.ops for p in parts]),
                   Attribution.concat([p.attr for p in parts]))

    @property
    def nbytes(self) -> int:
        return self.ops.nbytes + self.attr.nbytes


class BlockAttributedOps(AttributedOps):
    """The usual buffer's attributed operations (:meth:`LaunchAttributor._feed_native`): the
    attribution's columns are rows of ``block``, the table the C kernels wrote
    (``_BLOCK_ROWS``: the operations' start and end on the agent's clock first), and the
    operations are those of ``source`` (the reader's table of them, or CUPTI's columns)
    with those times.  The figures and the trace keeper read the tables themselves in C (a
    buffer each, not a dozen columns); :attr:`ops` and :attr:`attr`, NumPy views of them
    (seventeen each, some 1,300 instructions a view), are made only when first read."""

    #: the reader's table of the operations (CUPTI's times) and its rows of room, or None
    #: where they came as columns (the batch's calls' table is not kept)
    op_table: object | None = None
    _room = 0
    _source: GpuOps | None = None
    # (the defaults on the class: a buffer's object sets only what it has)
    _ops: GpuOps | None = None
    _attr: Attribution | None = None

    def __init__(self, source: GpuOps | TableBatch, block: Int64Array, n: int) -> None:
        self.block = block
        self._n = n  # (block.shape[1], known to the caller)
        if isinstance(source, TableBatch):
            self.op_table, self._room = source.op_table, source.room
        else:
            self._source = source

    def __len__(self) -> int:
        return self._n

    @property
    def ops(self) -> GpuOps:
        made = self._ops
        if made is None:
            source = self._source if self._source is not None else table_columns(
                GpuOps, self.op_table, self._room, len(self))
            made = self._ops = GpuOps.__new__(GpuOps)
            made.__dict__.update(source.__dict__)
            made.start, made.end = self.block[0], self.block[1]
        return made

    @ops.setter
    def ops(self, value: GpuOps) -> None:
        self._ops = value

    @property
    def attr(self) -> Attribution:
        made = self._attr
        if made is None:
            made = self._attr = Attribution.__new__(Attribution)
            made.__dict__.update(zip(_ATTRIBUTION_COLUMNS, self.block[2:]))
        return made

    @attr.setter
    def attr(self, value: Attribution) -> None:
        self._attr = value

    def copied(self, a: int, b: int) -> BlockAttributedOps | None:
        """Rows ``a:b`` copied as two tables (its block's and the reader's), not a column
        each (the trace keeper's compaction at every buffer of a full trace); ``None`` where
        its operations came as columns.  (Its column views write through to the tables.)"""
        if self.op_table is None:
            return None
        table = table_rows(self.op_table, self._room, len(GpuOps.columns()), self._n)
        table = table[:, a:b].copy()
        made = BlockAttributedOps.__new__(BlockAttributedOps)
        made.block, made._n = self.block[:, a:b].copy(), b - a
        made.op_table, made._room = table, b - a
        return made


_ATTRIBUTION_COLUMNS = Attribution.columns()
#: A table of calls -> its columns, in order (one C call).
_API_COLUMNS_OF = attrgetter(*ApiCalls.columns())
#: The launching call's columns of an Attribution, as ``api_join`` writes them.
_CALL_COLUMNS = ("api_start", "api_end", "api_domain", "cbid", "tid")
#: The rows of the usual buffer's table in C (``_feed_native``): its operations' start and
#: end on the agent's clock, their attribution, the depth of the deepest range holding each.
_BLOCK_ROWS = ("start", "end", *_ATTRIBUTION_COLUMNS, "depth_hit")
_N_BLOCK_ROWS = len(_BLOCK_ROWS)
_INT64 = np.dtype(np.int64)
#: Attribution's columns that start at 0 (the rest at -1, status at the status given).
_ZERO_COLUMNS = ("backward", "counted")


def _unlocated(n: int, status: int, given: dict[str, Int64Array] | None = None) -> Attribution:
    """``n`` rows of no attribution yet (``given``: columns known already); the columns not
    given are rows of one block (one allocation)."""
    given = given or {}
    rest = [c for c in _ATTRIBUTION_COLUMNS if c not in given]
    block = np.full((len(rest), n), -1, dtype=np.int64)
    cols = dict(zip(rest, block))
    cols["status"][:] = status
    for name in _ZERO_COLUMNS:
        cols[name][:] = 0
    cols.update(given)
    return Attribution(**cols)


class _Depth:
    """One depth's ranges of a thread: disjoint, sorted by start.  Their columns are the
    rows of one C-ordered table (the C lookup takes a depth as one array, not five)."""

    __slots__ = ("index", "number", "ordinal", "t0", "t1", "table")

    def __init__(self) -> None:
        self._set(np.zeros((5, 0), dtype=np.int64))

    def _set(self, table: npt.NDArray[np.int64]) -> None:
        self.table = table
        self.t0, self.t1, self.index, self.ordinal, self.number = table

    def extend(self, t0: Int64Array, t1: Int64Array, index: Int64Array, ordinal: Int64Array,
               number: Int64Array) -> None:
        self._set(np.concatenate([self.table, np.stack([t0, t1, index, ordinal, number])],
                                 axis=1))
        if len(self.t0) > 1 and len(t0) and np.any(np.diff(self.t0) < 0):
            self.keep(np.argsort(self.t0, kind="stable"))

    def keep(self, sel: Int64Array | npt.NDArray[np.bool_]) -> None:
        """The rows ``sel`` (positions, or a mask) kept, in a C-ordered table."""
        if sel.dtype == np.bool_:
            self._set(np.compress(sel.astype(np.bool_, copy=False), self.table, axis=1))
        else:
            self._set(np.take(self.table, sel, axis=1))


class _ThreadRanges:
    """An agent thread's ranges kept for attribution."""

    __slots__ = ("_levels", "depths", "done_ns", "finished", "horizon_ns", "iterations", "rows")

    def __init__(self) -> None:
        self.depths: dict[int, _Depth] = {}
        self._levels: list[tuple[int, Int64Array]] | None = None
        self.done_ns = -(1 << 62)     # every launch up to here can be attributed
        self.horizon_ns = -(1 << 62)  # ranges ending before here were dropped
        self.finished = False
        self.iterations = 0
        self.rows = 0

    def levels(self) -> list[tuple[int, Int64Array]]:
        """``(depth, table)`` of each depth with ranges, shallowest first (the C lookup's
        argument), made again only after the ranges changed: a buffer's lookup reuses it."""
        if self._levels is None:
            self._levels = [(d, slot.table) for d, slot in sorted(self.depths.items())
                            if len(slot.t0)]
        return self._levels

    def changed(self) -> None:
        self._levels = None


class LaunchAttributor:
    """Ranges and activity in, attributed operations out (see the module docstring).

    ``feed_ranges``, ``feed_activity``, ``thread_finished`` and ``finish`` each return
    the operations they could attribute (an :class:`AttributedOps`, possibly empty);
    every operation fed comes out exactly once, by ``finish`` at the latest.
    """

    def __init__(self, clock: ClockMap, warmup_skip: int = 0, *,
                 identity_threads: bool = False, max_pending: int = 1 << 16,
                 max_api: int = 1 << 18, max_ranges: int = 1 << 17,
                 locate: LocateKernel | None = None) -> None:
        self.clock = clock
        #: The range lookup in C where the caller has it (:data:`LocateKernel`); else NumPy.
        self.locate = locate
        self.warmup_skip = warmup_skip
        self.identity_threads = identity_threads
        self.max_pending = max(1, max_pending)
        self.max_api = max(1, max_api)
        self.max_ranges = max(2, max_ranges)
        self.kinds: list[int] = []
        self.link_ids: list[int] = []
        self.range_names: list[str] = []
        self._link_ids = LinkIds()
        self.link_keys = self._link_ids.keys
        self._tables: tuple[Int64Array, Int64Array] | None = None
        self.threads: dict[int, _ThreadRanges] = {}
        self.thread_map: dict[int, int] = {}   # CUPTI thread id -> agent tid
        self._claimed: set[int] = set()
        self._api = ApiCalls.empty()           # sorted by correlation, agent clock
        self._wait_api: list[GpuOps] = []      # ops whose API call has not arrived
        self._wait_api_n = 0
        self._wait_thread: dict[int, AttributedOps] = {}   # CUPTI thread -> ops
        self._wait_ranges: dict[int, AttributedOps] = {}   # agent tid -> ops
        #: Per status (:data:`STATUSES`): its operations and their GPU time (ns) (the usual
        #: buffer's added in C: ``locate_block``).
        self.status_sums = np.zeros((len(STATUSES), 2), dtype=np.int64)
        self.ops_in = 0
        #: The extension that gave ``locate`` where it also keeps the launching calls (and
        #: sums the figures: :class:`~.gpu_figures.GpuFigureBuilder`).
        owner = getattr(locate, "__self__", None)
        self.native: ModuleType | None = owner if hasattr(owner, "api_join") and tuple(
            getattr(owner, "BLOCK_ROWS", ())) == _BLOCK_ROWS else None
        self._store = self.native.api_store(self.max_api) if self.native else None

    # -- names and threads ------------------------------------------------------------
    def add_name(self, index: int, name: str, category: str) -> None:
        """Register range name ``index`` (as the recorder's and the aggregator's)."""
        while len(self.kinds) <= index:
            self.kinds.append(K_OTHER)
            self.link_ids.append(-1)
            self.range_names.append("")
        kind, key = range_kind(name, category)
        self.kinds[index], self.range_names[index] = kind, name
        if kind in (K_LINK, K_LINK_BWD):
            self.link_ids[index] = self._link_ids.id_of(key)
        self._tables = None

    def map_thread(self, cupti_thread: int, tid: int) -> AttributedOps:
        """CUPTI's id of a thread (``threading.get_ident() & 0xFFFFFFFF`` by default) is
        the agent's ``tid``; returns what that releases."""
        self.thread_map[cupti_thread] = tid
        self._claimed.add(tid)
        waiting = self._wait_thread.pop(cupti_thread, None)
        if waiting is None:
            return AttributedOps.empty()
        return self._to_threads(waiting, force=False)

    def _kind_tables(self) -> tuple[Int64Array, Int64Array]:
        if self._tables is None or len(self._tables[0]) != len(self.kinds):
            self._tables = (np.array(self.kinds, dtype=np.int64),
                            np.array(self.link_ids, dtype=np.int64))
        return self._tables

    # -- ranges -------------------------------------------------------------------------
    def feed_ranges(self, tid: int, rows: RangeRows) -> AttributedOps:
        """A block of thread ``tid``'s ranges, in end order (the recorder's int64 rows)."""
        a = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
        th = self.threads.get(tid)
        if th is None:
            th = self.threads[tid] = _ThreadRanges()
        if len(a):
            kinds, _ = self._kind_tables()
            index = a[:, 0]
            depth = a[:, 3] & DEPTH_MASK
            known = index < len(kinds)
            kind = np.where(known, kinds[np.where(known, index, 0)], K_OTHER)
            is_iter = kind == K_ITER
            ordinal = np.full(len(a), -1, dtype=np.int64)
            ordinal[is_iter] = th.iterations + np.arange(int(is_iter.sum()))
            th.iterations += int(is_iter.sum())
            packed = a[:, 3] >> DEPTH_BITS
            number = np.where(is_iter & (packed > 0), packed - 1, -1)
            th.changed()
            for d in np.unique(depth).tolist():
                sel = depth == d
                slot = th.depths.get(d)
                if slot is None:
                    slot = th.depths[d] = _Depth()
                slot.extend(a[sel, 1], a[sel, 2], index[sel], ordinal[sel], number[sel])
            top = depth == 0
            if top.any():
                th.done_ns = max(th.done_ns, int(a[top, 2].max()))
            th.rows += len(a)
            if th.rows > self.max_ranges:
                self._drop_old_ranges(th)
        out = [self._release(tid, force=False)]
        if self._wait_thread:
            out.append(self._map_by_containment(final=False))
        return AttributedOps.concat(out)

    def thread_finished(self, tid: int) -> AttributedOps:
        """Thread ``tid`` records no more ranges: what waits on it is attributed now."""
        th = self.threads.get(tid)
        if th is None:
            th = self.threads[tid] = _ThreadRanges()
        th.finished = True
        return self._release(tid, force=False)

    def _drop_old_ranges(self, th: _ThreadRanges) -> None:
        ends = np.concatenate([slot.t1 for slot in th.depths.values()])
        cut = int(np.partition(ends, len(ends) // 2)[len(ends) // 2])
        th.horizon_ns = max(th.horizon_ns, cut)
        th.changed()
        rows = 0
        for slot in th.depths.values():
            slot.keep(slot.t1 >= cut)
            rows += len(slot.t0)
        th.rows = rows

    # -- activity -------------------------------------------------------------------------
    def feed_activity(self, batch: ActivityBatch) -> AttributedOps:
        """A block of activity records (one CUPTI buffer, or a piece of a recording)."""
        if self.native is not None and batch.op_count and not self._wait_api_n \
                and not self._wait_thread:
            return self._feed_native(batch)
        out: list[AttributedOps] = []
        if len(batch.api):
            self._add_api(batch.api)
        if len(batch.ops):
            ops = batch.ops
            mapped = GpuOps(**{c: getattr(ops, c) for c in GpuOps.columns()})
            mapped.start = self.clock.to_agent(ops.start)
            mapped.end = self.clock.to_agent(ops.end)
            self.ops_in += len(ops)
            self._wait_api.append(mapped)
            self._wait_api_n += len(mapped)
        if self._wait_api_n and (len(batch.api) or len(batch.ops)):
            out.append(self._join_api(force=False))
        if self._wait_thread:
            out.append(self._map_by_containment(final=False))
        return AttributedOps.concat(out)

    def _feed_native(self, batch: ActivityBatch) -> AttributedOps:
        """A buffer through the C kernels: its calls kept, its operations joined to theirs;
        when each has its call, one launching thread that is mapped, and that thread's
        ranges known past every launch (the usual), located and settled in C; else the
        general path from the join on."""
        native = self.native
        assert native is not None  # (with the lookup: self.locate)
        # the reader's tables read whole in C where the batch is one (no column made)
        tables = batch if isinstance(batch, TableBatch) else None
        calls = None  # the reader's table of calls: kept by the join's call, before it joins
        if batch.api_count:
            if tables is not None:
                calls = tables.api_table
            else:
                self._add_api(batch.api)
        n = batch.op_count
        # start, end, the attribution's columns, the depth hit (_BLOCK_ROWS): each row
        # written in C, the table handed over whole
        block = np.empty((_N_BLOCK_ROWS, n), _INT64)  # (positional: numpy parses less)
        self.ops_in += n
        if tables is not None:
            op_cols: object = tables.op_table
        else:
            ops = batch.ops
            op_cols = (ops.correlation, ops.start, ops.end)
        missing, thread, one, latest = native.join_block(  # (the map read in C)
            self._store, self.clock, op_cols, block, calls)
        tid = thread if self.identity_threads else self.thread_map.get(thread)
        th = self.threads.get(tid) if tid is not None else None
        if missing or not one or th is None or tid in self._wait_ranges or not (
                th.finished or latest <= th.done_ns):
            self._wait_api.append(BlockAttributedOps(batch.ops, block, n).ops)  # mapped times
            self._wait_api_n += n
            out = [self._join_api(force=False)]
            if self._wait_thread:
                out.append(self._map_by_containment(final=False))
            return AttributedOps.concat(out)
        kinds, link_ids = self._tables or self._kind_tables()  # (made anew on a new name)
        native.locate_block(th.depths, kinds, link_ids, block, (  # (the status sums added)
            self.warmup_skip, th.horizon_ns, PHASE_OUTSIDE, PHASE_OTHER, ATTRIBUTED,
            RANGES_DROPPED, tid), self.status_sums)
        return BlockAttributedOps(tables if tables is not None else batch.ops, block, n)

    def _add_api(self, api: ApiCalls) -> None:
        if self.native is not None:
            self.native.api_add(self._store, _API_COLUMNS_OF(api), self.clock)
            return
        mapped = ApiCalls(**{c: getattr(api, c) for c in ApiCalls.columns()})
        mapped.start = self.clock.to_agent(api.start)
        mapped.end = self.clock.to_agent(api.end)
        merged = ApiCalls.concat([self._api, mapped])
        order = np.argsort(merged.correlation, kind="stable")
        merged = merged.take(order)
        if len(merged) > self.max_api:
            merged = merged.take(slice(len(merged) - self.max_api, None))
        self._api = merged

    def _join_api(self, force: bool) -> AttributedOps:
        ops = GpuOps.concat(self._wait_api)
        self._wait_api, self._wait_api_n = [], 0
        found, calls = self._lookup(ops.correlation)
        out: list[AttributedOps] = []
        every = bool(found.all())  # the usual: no row taken apart
        missing = None if every else ops.take(~found)
        if missing is not None and len(missing):
            if force:
                out.append(self._conclude(missing, NO_API))
            else:
                if len(missing) > self.max_pending:  # the oldest launches give up
                    order = np.argsort(missing.correlation, kind="stable")
                    cut = len(missing) - self.max_pending
                    out.append(self._conclude(missing.take(order[:cut]), NO_API))
                    missing = missing.take(order[cut:])
                self._wait_api = [missing]
                self._wait_api_n = len(missing)
        if every or found.any():
            got = ops if every else ops.take(found)
            attr = _unlocated(len(got), ATTRIBUTED, {  # tid: CUPTI's until tied to the agent's
                k: v if every else v[found] for k, v in calls.items()})
            out.append(self._to_threads(AttributedOps(got, attr), force))
        return AttributedOps.concat(out)

    def _lookup(self, correlation: Int64Array) -> tuple[npt.NDArray[np.bool_],
                                                        dict[str, Int64Array]]:
        """Which operations' calls are kept, and those calls' columns (rows where found)."""
        if self.native is not None:
            cols = np.full((6, len(correlation)), -1, dtype=np.int64)
            self.native.api_join(self._store, np.ascontiguousarray(correlation), cols)
            return cols[5] == 1, dict(zip(_CALL_COLUMNS, cols[:5]))
        api = self._api
        if not len(api):
            return np.zeros(len(correlation), dtype=bool), {}
        pos = np.searchsorted(api.correlation, correlation)
        ok = pos < len(api)
        pos = np.where(ok, pos, 0)
        found = ok & (api.correlation[pos] == correlation)
        return found, {"api_start": api.start[pos], "api_end": api.end[pos],
                       "api_domain": api.domain[pos], "cbid": api.cbid[pos],
                       "tid": api.thread[pos]}

    def _to_threads(self, items: AttributedOps, force: bool) -> AttributedOps:
        """Give each operation its agent thread and queue it there (or wait for the map)."""
        cupti = items.attr.tid
        out: list[AttributedOps] = []
        touched: set[int] = set()
        first = int(cupti[0]) if len(cupti) else 0
        one = bool((cupti == first).all())  # the usual: one launching thread
        for c in [first] if one else np.unique(cupti).tolist():
            part = items if one else items.take(cupti == c)
            tid = c if self.identity_threads else self.thread_map.get(c)
            if tid is None:
                prev = self._wait_thread.get(c)
                part = part if prev is None else AttributedOps.concat([prev, part])
                if len(part) > self.max_pending:
                    out.append(self._conclude_attributed(
                        part.take(slice(0, len(part) - self.max_pending)), NO_THREAD))
                    part = part.take(slice(len(part) - self.max_pending, None))
                self._wait_thread[c] = part
                continue
            part.attr.tid[:] = tid
            prev = self._wait_ranges.get(tid)
            self._wait_ranges[tid] = part if prev is None else AttributedOps.concat([prev, part])
            touched.add(tid)
        for tid in touched:
            out.append(self._release(tid, force))
        return AttributedOps.concat(out)

    # -- resolving ---------------------------------------------------------------------
    def _release(self, tid: int, force: bool) -> AttributedOps:
        """Attribute what waits on thread ``tid`` and can be (everything when forced)."""
        waiting = self._wait_ranges.get(tid)
        if waiting is None or not len(waiting):
            return AttributedOps.empty()
        th = self.threads.get(tid)
        launch = waiting.attr.api_start
        if force or (th is not None and th.finished):
            ready = np.ones(len(waiting), dtype=bool)
        elif th is None:
            ready = np.zeros(len(waiting), dtype=bool)
        else:
            ready = launch <= th.done_ns
        every = bool(ready.all())  # the usual: no row taken apart
        rest = None if every else waiting.take(~ready)
        forced = None
        if rest is not None and len(rest) > self.max_pending:  # the oldest launches are
            order = np.argsort(rest.attr.api_start, kind="stable")  # attributed as they stand
            cut = len(rest) - self.max_pending
            forced = rest.take(order[:cut])
            rest = rest.take(order[cut:])
        if rest is not None and len(rest):
            self._wait_ranges[tid] = rest
        else:
            del self._wait_ranges[tid]
        done = waiting if every else AttributedOps.concat(
            [waiting.take(ready), *([forced] if forced is not None else [])])
        if not len(done):
            return done
        return self._locate(tid, th, done, open_known=not (force or forced is None))

    def _locate(self, tid: int, th: _ThreadRanges | None, items: AttributedOps,
                open_known: bool) -> AttributedOps:
        """Fill in the ranges around each launch of thread ``tid``."""
        attr = items.attr
        t = attr.api_start
        if th is None:
            self._count(items.ops, np.full(len(items), ATTRIBUTED, dtype=np.int64))
            return items
        kinds, link_ids = self._kind_tables()
        n = len(items)
        depth_hit = np.full(n, -1, dtype=np.int64)
        out = (attr.range, attr.range_t0, attr.range_t1, attr.range_depth, attr.link,
               attr.backward, attr.phase, attr.iteration, attr.number, attr.iter_end, depth_hit)
        if self.locate is not None and all(c.flags.c_contiguous and c.flags.writeable
                                           for c in out):
            self.locate(np.ascontiguousarray(t), th.levels(), kinds, link_ids, out)
        else:
            self._locate_numpy(t, th, kinds, link_ids, attr, depth_hit)
        in_iter = attr.iteration >= 0
        attr.phase[in_iter & (attr.phase == PHASE_OUTSIDE)] = PHASE_OTHER
        attr.counted[:] = (in_iter & (attr.iteration >= self.warmup_skip)).astype(np.int64)
        status = np.full(n, ATTRIBUTED, dtype=np.int64)
        status[t < th.horizon_ns] = RANGES_DROPPED
        if open_known:  # forced before the thread's ranges got past the launch
            status[(depth_hit < 0) & (t > th.done_ns) & ~th.finished] = OPEN
        attr.status[:] = status
        self._count(items.ops, status)
        return items

    def _locate_numpy(self, t: Int64Array, th: _ThreadRanges, kinds: Int64Array,
                      link_ids: Int64Array, attr: Attribution, depth_hit: Int64Array) -> None:
        """The range lookup in NumPy (the C one's twin): per depth, shallowest first, the
        range holding each launch fills the columns (a deeper one over a shallower one)."""
        for d in sorted(th.depths):
            slot = th.depths[d]
            if not len(slot.t0):
                continue
            k = np.searchsorted(slot.t0, t, side="right") - 1
            valid = k >= 0
            k = np.where(valid, k, 0)
            hit = valid & (t <= slot.t1[k])
            if not hit.any():
                continue
            idx = slot.index[k]
            known = (idx >= 0) & (idx < len(kinds))
            kind = np.where(known, kinds[np.where(known, idx, 0)], K_OTHER)
            inner = hit & (kind != K_GC)
            attr.range[inner] = idx[inner]
            attr.range_t0[inner] = slot.t0[k][inner]
            attr.range_t1[inner] = slot.t1[k][inner]
            attr.range_depth[inner] = d
            depth_hit[hit] = d
            is_link = hit & ((kind == K_LINK) | (kind == K_LINK_BWD))
            lid = np.where(known, link_ids[np.where(known, idx, 0)], -1)
            attr.link[is_link] = lid[is_link]
            attr.backward[is_link] = (kind[is_link] == K_LINK_BWD).astype(np.int64)
            is_phase = hit & (kind >= K_PHASE0)
            attr.phase[is_phase] = kind[is_phase] - K_PHASE0
            is_iter = hit & (kind == K_ITER)
            attr.iteration[is_iter] = slot.ordinal[k][is_iter]
            attr.number[is_iter] = slot.number[k][is_iter]
            attr.iter_end[is_iter] = slot.t1[k][is_iter]

    def _conclude(self, ops: GpuOps, status: int) -> AttributedOps:
        """Operations that get no attribution at all (their API call is missing)."""
        attr = _unlocated(len(ops), status)
        self._count(ops, attr.status)
        return AttributedOps(ops, attr)

    def _conclude_attributed(self, items: AttributedOps, status: int) -> AttributedOps:
        items.attr.status[:] = status
        items.attr.tid[:] = -1
        self._count(items.ops, items.attr.status)
        return items

    def _count(self, ops: GpuOps, status: Int64Array) -> None:
        if not len(status):
            return
        n = len(STATUSES)  # float sums of integer ns: exact below 2**53 ns (104 days)
        sums = self.status_sums
        sums[:, 0] += np.bincount(status, minlength=n)
        sums[:, 1] += np.bincount(status, weights=ops.end - ops.start,
                                  minlength=n).astype(np.int64)

    # -- threads without a map ----------------------------------------------------------
    def _map_by_containment(self, final: bool) -> AttributedOps:
        """Tie waiting CUPTI threads to agent threads whose top-level ranges contain
        their launches (recordings without the agent's thread map)."""
        out: list[AttributedOps] = []
        for c in sorted(self._wait_thread, key=lambda c: -len(self._wait_thread[c])):
            waiting = self._wait_thread.get(c)
            if waiting is None:
                continue
            launch = np.sort(waiting.attr.api_start)
            best, best_share, best_votes = None, 0.0, 0
            for tid, th in self.threads.items():
                if tid in self._claimed or 0 not in th.depths:
                    continue
                top = th.depths[0]
                decidable = launch[(launch <= th.done_ns) | th.finished]
                decidable = decidable[decidable >= th.horizon_ns]
                if not len(decidable):
                    continue
                k = np.searchsorted(top.t0, decidable, side="right") - 1
                valid = k >= 0
                inside = valid & (decidable <= top.t1[np.where(valid, k, 0)])
                share = float(inside.mean())
                if share > best_share:
                    best, best_share, best_votes = tid, share, len(decidable)
            if best is not None and best_share >= MIN_SHARE and (
                    best_votes >= MIN_VOTES or final):
                out.append(self.map_thread(c, best))
        return AttributedOps.concat(out)

    # -- the end -------------------------------------------------------------------------
    def finish(self) -> AttributedOps:
        """Everything still waiting, attributed with what is known (each op comes out)."""
        out: list[AttributedOps] = []
        if self._wait_api_n:
            out.append(self._join_api(force=True))
        if self._wait_thread:
            out.append(self._map_by_containment(final=True))
            for c in list(self._wait_thread):
                out.append(self._conclude_attributed(self._wait_thread.pop(c), NO_THREAD))
        for tid in list(self._wait_ranges):
            out.append(self._release(tid, force=True))
        return AttributedOps.concat(out)

    @property
    def pending(self) -> int:
        """Operations fed and not yet attributed."""
        return (self._wait_api_n + sum(len(v) for v in self._wait_thread.values())
                + sum(len(v) for v in self._wait_ranges.values()))

    def statuses(self) -> dict[str, dict[str, float]]:
        """Operations and their GPU time (ms) per attribution status."""
        sums = self.status_sums.tolist()
        return {name: {"ops": sums[i][0], "ms": sums[i][1] / 1e6}
                for i, name in enumerate(STATUSES) if sums[i][0]}
