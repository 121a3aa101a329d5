"""GPU figures from attributed activity: per link, per phase, per iteration, top kernels.

:class:`GpuFigureBuilder` takes blocks of :class:`~.gpu_attribution.AttributedOps` in
any order and keeps bounded state; :meth:`GpuFigureBuilder.result` gives a
:class:`~.gpu_record.GpuFigures` (declared with the run record's field, :mod:`.gpu_record`).

By launch (order-free sums, over the counted iterations: warm-up excluded as the
aggregator counts):

* per link: kernel time and kernel count forward (launched in the link's range, its
  innermost link) and backward (in its link-backward range), and copy/memset time;
* per phase: kernel time and copy time launched in data / forward / backward / update,
  and "other" (in the iteration, outside its phases);
* the top kernels by time, each with the link (and direction) that launched it;
* outside the counted iterations: the warm-up's and the rest's kernel time.

On the GPU's timeline (per device, in start order): the GPU time is cut into iteration
windows, each from the first operation launched in an iteration of the loop thread to
the first one of the next (or of what the loop thread launched after the iteration, or
the last operation's end).  In a window:

* ``busy``: a kernel runs (the union of kernel intervals, all streams);
* ``copies``: only copies or memsets run;
* idle (nothing runs), each gap between two operations whole to one cause, by
  HolisticTraceAnalysis's rules for its idle-time breakdown (``host wait``, ``kernel
  wait``, ``other``), so that both split the same trace alike: ``host`` (the operation
  that ends the gap was launched -- its CUDA call started -- after the GPU fell idle: the
  host was late), ``between iterations`` (the same at a window's end: the gap before the
  next iteration's first operation, launched after the GPU fell idle; HTA's host wait
  too), ``launch`` (launched before the GPU fell idle and a gap under
  :data:`LAUNCH_GAP_NS`: the launch's own latency; HTA's kernel wait) and ``other``
  (launched before, a longer gap: the operation waited on something else, an event, a
  dependency; HTA's other).  HTA judges each stream apart; here the gaps are the
  device's (all streams), which is the same on one stream.

``busy_share`` = busy / span over the counted windows (``active_share`` adds the copies:
HolisticTraceAnalysis's non-idle share).  A window's operations may arrive late and out
of order: they are placed once nothing earlier can come (:meth:`advance`, or a bounded
reorder pool of :attr:`max_pool` operations per device, the oldest half placed when it
fills); one arriving behind what was placed is counted as late and left off the timeline.
"""

from __future__ import annotations

from operator import attrgetter
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..common.gpu_records import KERNEL, MEMCPY, MEMSET, GpuOps, NameTable
from .aggregate import Series
from .gpu_attribution import PHASE_OUTSIDE, AttributedOps, Attribution, BlockAttributedOps
from .gpu_record import GpuFigures, KernelGpuDict, LinkGpuDict, PhaseGpuDict, TimelineDict
from .stats import MAX_KEPT_ITERATIONS, PHASE_KEYS

Int64Array = npt.NDArray[np.int64]
__all__ = ["IDLE_KEYS", "TOP_KERNELS", "WINDOW_COLUMNS", "GpuFigureBuilder", "GpuFigures"]

#: Kernels listed in :attr:`GpuFigures.top_kernels`.
TOP_KERNELS = 20
#: Distinct (kernel, link, direction) keys counted for the top kernels; beyond, "other".
MAX_KERNEL_KEYS = 4096
#: Idle categories, in the order of the per-iteration columns.
IDLE_KEYS = ("host", "copies", "between iterations", "launch", "other")
#: A gap shorter than this before an operation launched while the GPU still ran is the
#: launch's own latency (HolisticTraceAnalysis's ``consecutive_kernel_delay``, 30: it
#: compares it with the trace's time unit, microseconds in Kineto's traces and ours).
LAUNCH_GAP_NS = 30_000
#: Per-iteration columns (ms): the window, the kernels, then each idle category.
WINDOW_COLUMNS = ("span", "busy", *IDLE_KEYS)
_NEG = -(1 << 62)
#: A top kernel's key: its name id above this many bits, below them (link + 1) * 2 + backward.
_NAME_SHIFT = 32
#: Links :attr:`GpuFigureBuilder.link_sums` has rows for at first (a model's links, usually:
#: no new table at its first buffer).
LINK_ROOM = 256
#: The columns the figures' pass in C reads (``figure_add``), each tuple in one C call.
_OPS_COLUMNS_OF = attrgetter("kind", "start", "end", "name", "device")
#: A timeline's open window's sums and counted windows' sums before any (read only: shared).
_NO_WINDOW_SUMS = np.zeros(6, dtype=np.int64)
_NO_WINDOW_SUMS.flags.writeable = False
_NO_TOTALS = np.zeros(len(WINDOW_COLUMNS), dtype=np.int64)
_NO_TOTALS.flags.writeable = False
_INT64 = np.dtype(np.int64)
#: The operation kinds figure_add counts, in its order.
_OP_KINDS = (KERNEL, MEMCPY, MEMSET)
_ATTR_COLUMNS_OF = attrgetter("counted", "iteration", "link", "backward", "phase", "api_start",
                              "iter_end", "tid")
#: Kernel keys (names x links x directions) counted by a dense index rather than sorted.
_DENSE_KEYS = 1 << 16


def _unpacked(key: int) -> tuple[int, int, int]:
    """A packed top-kernel key -> (name id, link id, backward)."""
    low = key & ((1 << _NAME_SHIFT) - 1)
    return key >> _NAME_SHIFT, (low >> 1) - 1, low & 1


class _Timeline:
    """One device's GPU timeline cut into iteration windows (see the module docstring)."""

    # What a new timeline starts with, on the class (numbers, or arrays never written: each
    # replaced, not changed): its __init__ sets only its own objects (a device's first
    # buffer makes it).
    pool_n = 0
    placed_ns = _NEG                  # everything starting before was placed
    late = 0
    # carried across chunks
    key = -1                          # current window key (2*ordinal, +1 outside)
    max_ord = -1
    fa = _NEG                         # union frontier, all operations
    fk = _NEG                         # union frontier, kernels
    win_start = _NEG
    # the open window's sums: busy, active (kernels or copies), host, other, between,
    # launch (none yet: the zeros shared, never written: each chunk makes its own)
    acc: Int64Array = _NO_WINDOW_SUMS
    # the counted windows' rows and sums, made at the first one (eight arrays, some
    # 20,000 instructions: not on the device's first buffer, where none is placed yet)
    series: Series | None = None
    totals: Int64Array = _NO_TOTALS
    counted = 0
    warmup_skip = 0
    #: What the placement in C takes as data: the sentinel and the launch gap.
    _constants = (_NEG, LAUNCH_GAP_NS)

    def __init__(self, device: int, max_kept: int, native: ModuleType | None = None) -> None:
        self.device = device
        self.pool: list[Int64Array] = []      # (n, 7) rows waiting to be placed
        self.iter_end: dict[int, int] = {}    # ordinal -> host end of that iteration
        self.max_kept = max_kept
        #: The placement in C (the ``_cupti`` extension's ``timeline_place``), else NumPy's
        #: :meth:`_process` (its twin): chosen here.
        self.native = native if hasattr(native, "timeline_place") else None

    def add(self, rows: Int64Array, earliest: int | None = None) -> None:
        """Pool ``rows`` (``earliest``: their earliest start, where known)."""
        late = rows[:, 0] < self.placed_ns if earliest is None or earliest < self.placed_ns \
            else None
        if late is not None and late.any():
            self.late += int(late.sum())
            rows = rows[~late]
        if len(rows):
            self.pool.append(rows)
            self.pool_n += len(rows)

    def place(self, upto: int | None) -> None:
        """Place the pooled operations that start before ``upto`` (all: ``None``)."""
        if not self.pool_n:
            return
        native = self.native
        if native is not None:  # one copy, its runs in order merged (the same rows)
            rows = np.empty((self.pool_n, 7), _INT64)
            native.timeline_sort(self.pool, rows)
        else:
            rows = np.concatenate(self.pool) if len(self.pool) > 1 else self.pool[0]
            rows = rows[np.argsort(rows[:, 0], kind="stable")]
        cut = len(rows) if upto is None else int(np.searchsorted(rows[:, 0], upto, "left"))
        if cut:
            if native is not None:
                self._process_in_c(rows[:cut], native)
            else:
                self._process(rows[:cut])
            self.placed_ns = max(self.placed_ns, int(rows[cut - 1, 0]) + 1
                                 if upto is None else upto)
        rest = rows[cut:]
        self.pool = [rest] if len(rest) else []
        self.pool_n = len(rest)

    def _process(self, r: Int64Array) -> None:
        start, end, is_kernel = r[:, 0], r[:, 1], r[:, 2] == 1
        launch, ordinal, iter_end, loop = r[:, 3], r[:, 4], r[:, 5], r[:, 6] == 1
        n = len(r)
        has = (ordinal >= 0) & (iter_end >= 0)
        if has.any():
            seen, first = np.unique(ordinal[has], return_index=True)
            for o, e in zip(seen.tolist(), iter_end[has][first].tolist()):
                self.iter_end[o] = max(e, self.iter_end.get(o, -1))
        running = np.maximum.accumulate(np.maximum(np.where(loop, ordinal, -1), self.max_ord))
        uniq, inverse = np.unique(running, return_inverse=True)
        ends_of = np.array([self.iter_end.get(o, -1) for o in uniq.tolist()],
                           dtype=np.int64)[np.asarray(inverse).reshape(-1)]
        flip = loop & (ordinal < 0) & (running >= 0) & (ends_of >= 0) & (launch > ends_of)
        key = np.where(running < 0, -1, 2 * running + flip.astype(np.int64))
        window = np.maximum.accumulate(np.maximum(key, self.key))
        prev_window = np.concatenate(([self.key], window[:-1]))
        boundary = window > prev_window
        # union frontiers before each operation
        fa_prev = np.maximum(np.concatenate(([self.fa], np.maximum.accumulate(end)[:-1])),
                             self.fa)
        kend = np.where(is_kernel, end, _NEG)
        fk_prev = np.maximum(np.concatenate(([self.fk], np.maximum.accumulate(kend)[:-1])),
                             self.fk)
        gap = np.maximum(0, start - np.maximum(fa_prev, _NEG + 1))
        gap = np.where(fa_prev == _NEG, 0, gap)
        all_c = np.maximum(0, end - np.maximum(start, fa_prev))
        busy_c = np.where(is_kernel, np.maximum(0, end - np.maximum(start, fk_prev)), 0)
        # the whole gap to one cause: the host was late when the call launching the
        # operation started after everything before had ended (HTA's host wait)
        late = (launch >= 0) & (launch > fa_prev) & (fa_prev != _NEG)
        host = np.where(late & ~boundary, gap, 0)
        between = np.where(late & boundary, gap, 0)
        short = ~late & (gap < LAUNCH_GAP_NS)
        launched = np.where(short, gap, 0)
        other = np.where(~late & ~short, gap, 0)
        # window index inside this chunk: 0 the carried one, then each boundary
        wi = np.cumsum(boundary)
        n_w = int(wi[-1]) + 1 if n else 1
        sums = np.zeros((n_w, 6), dtype=np.int64)
        # gap before a boundary belongs to the window it ends
        gap_w = np.where(boundary, wi - 1, wi)
        for col, values, owner in ((0, busy_c, wi), (1, all_c, wi), (2, host, gap_w),
                                   (3, other, gap_w), (4, between, gap_w),
                                   (5, launched, gap_w)):
            sums[:, col] += np.bincount(owner, weights=values, minlength=n_w).astype(np.int64)
        # union time that ran on past a boundary moves to the window it ran in
        b_idx = np.flatnonzero(boundary)
        if len(b_idx):
            b = start[b_idx]
            over_all = np.maximum(0, fa_prev[b_idx] - b)
            over_k = np.maximum(0, fk_prev[b_idx] - b)
            w_new = wi[b_idx]
            np.subtract.at(sums[:, 1], w_new - 1, over_all)
            np.add.at(sums[:, 1], w_new, over_all)
            np.subtract.at(sums[:, 0], w_new - 1, over_k)
            np.add.at(sums[:, 0], w_new, over_k)
        sums[0] += self.acc
        starts = [self.win_start, *start[b_idx].tolist()]
        keys = [self.key, *window[b_idx].tolist()]
        if n_w > 1:  # the windows finished here: (key, t0, t1, six sums) each
            self._close_windows(np.column_stack((keys[:-1], starts[:-1], starts[1:],
                                                 sums[:-1])).astype(np.int64))
        self.key, self.win_start = keys[-1], starts[-1]
        self.acc = sums[-1]
        self.max_ord = int(running[-1]) if n else self.max_ord
        if len(self.iter_end) > 4096:  # only the newest iterations' ends are looked up
            self.iter_end = {o: e for o, e in self.iter_end.items() if o >= self.max_ord - 1024}
        self.fa = max(self.fa, int(end.max())) if n else self.fa
        if is_kernel.any():
            self.fk = max(self.fk, int(end[is_kernel].max()))

    def _process_in_c(self, r: Int64Array, native: ModuleType) -> None:
        """:meth:`_process` in one C pass: the same windows closed, the same state after."""
        out, self.key, self.win_start, self.max_ord, self.fa, self.fk = native.timeline_place(
            r, self.iter_end, (self.key, self.max_ord, self.fa, self.fk, self.win_start),
            self.acc, self._constants)
        sums = np.frombuffer(out, _INT64)
        self.acc = sums[-6:]  # (read only: never written, as the NumPy twin's)
        if len(sums) > 6:  # the windows finished: (key, t0, t1, six sums) each
            self._close_windows(sums[:-6].reshape(-1, 9))
        if len(self.iter_end) > 4096:  # only the newest iterations' ends are looked up
            self.iter_end = {o: e for o, e in self.iter_end.items() if o >= self.max_ord - 1024}

    def _close_windows(self, closed: Int64Array) -> None:
        """The finished windows, rows (key, t0, t1, six sums) of ``closed``: those of counted
        iterations (not before the first, nor what the loop ran outside one, nor the
        warm-up) added to the series and totals, as one block (a run's windows at its end
        are many)."""
        key, t0 = closed[:, 0], closed[:, 1]
        counted = (key >= 0) & (key % 2 == 0) & (t0 != _NEG) & (key // 2 >= self.warmup_skip)
        if not counted.any():
            return
        c = closed[counted]
        busy, active = c[:, 3], c[:, 4]
        rows = np.column_stack((c[:, 2] - c[:, 1], busy, c[:, 5], np.maximum(0, active - busy),
                                c[:, 7], c[:, 8], c[:, 6]))  # (span, busy, host, copies, ...)
        self.counted += len(rows)
        if self.series is None:
            self.series = Series(self.max_kept, len(WINDOW_COLUMNS))
            self.totals = np.zeros(len(WINDOW_COLUMNS), dtype=np.int64)
        self.totals += rows.sum(axis=0)
        self.series.extend(rows.astype(np.float64) / 1e6)

    def finish(self) -> None:
        self.place(None)
        if self.win_start != _NEG and self.fa != _NEG:
            end = max(self.fa, self.win_start)
            self._close_windows(np.array([[self.key, self.win_start, end, *self.acc.tolist()]],
                                         dtype=np.int64))
        self.key, self.win_start, self.acc = -1, _NEG, np.zeros(6, dtype=np.int64)


class GpuFigureBuilder:
    """Attributed operations in (any order, any blocks), :class:`GpuFigures` out."""

    def __init__(self, link_keys: list[str], names: NameTable, warmup_skip: int = 0, *,
                 loop_tid: int | None = None, max_pool: int = 1 << 16,
                 max_kept: int = MAX_KEPT_ITERATIONS, native: ModuleType | None = None) -> None:
        self.link_keys = link_keys        # the attributor's list, growing
        self.names = names
        self.warmup_skip = warmup_skip
        self.loop_tid = loop_tid
        self.max_pool = max(2, max_pool)
        self.max_kept = max_kept
        #: per link (rows beyond the links known: room, zeros): fwd ns, fwd n, bwd ns, bwd n,
        #: copy ns
        self.link_sums = np.zeros((LINK_ROOM, 5), dtype=np.int64)
        self.phase_sums = np.zeros((len(PHASE_KEYS), 3), dtype=np.int64)  # kernel ns, n, copy ns
        self.kernel_keys: dict[int, int] = {}  # packed (name, link, direction) -> row
        self.kernel_sums = np.zeros((0, 2), dtype=np.int64)  # ns, calls
        self.other_kernels = np.zeros(2, dtype=np.int64)
        self.warmup_ns = 0
        self.outside_ns = 0
        self.op_counts = [0, 0, 0]
        #: figure_add's counts of the buffers since (kernels, copies, memsets, outside ns,
        #: warm-up ns first): added to the three above when the figures are made
        self._counted: list[tuple[Any, ...]] = []
        self.timelines: dict[int, _Timeline] = {}
        #: The sums in C (the ``_cupti`` extension: ``runtime/cupti_locate.c``), else NumPy.
        self.native = native
        #: With the extension: the kernels' sums kept in C (read into the three above once,
        #: by :meth:`result`).
        self._kernel_table = native.kernel_table(MAX_KERNEL_KEYS) if native else None

    def add(self, items: AttributedOps) -> None:
        n = len(items)
        if not n:
            return
        if len(self.link_sums) < len(self.link_keys):
            self._grow_links()
        native = self.native
        if native is not None:  # the sums, the kernels' sums and the timeline's rows: one pass
            rows = np.empty((n, 7), _INT64)  # (positional: numpy parses less)
            # the usual buffer: the C tables' rows, read there (no column made)
            if isinstance(items, BlockAttributedOps):
                table = items.op_table
                ops_cols = _OPS_COLUMNS_OF(items.ops) if table is None else table
                attr_cols: object = items.block
            else:
                ops_cols, attr_cols = _OPS_COLUMNS_OF(items.ops), _ATTR_COLUMNS_OF(items.attr)
            got = native.figure_add(self._kernel_table, ops_cols, attr_cols, self.link_sums,
                                    self.phase_sums, _OP_KINDS, PHASE_OUTSIDE, self.loop_tid,
                                    rows)
            counted = self._counted  # (kernels, copies, memsets, outside, warm-up ns ...)
            counted.append(got)
            if len(counted) > 1024:
                self._fold_counted()
            self.loop_tid, only, earliest = got[5:]
            if only is not None:  # (the devices read only where they differ)
                self._add_device_rows(only, rows, earliest)
            else:
                self._add_timeline(items.ops.device, rows)
        else:
            ops, attr = items.ops, items.attr
            dur = ops.end - ops.start
            kernel = ops.kind == KERNEL
            in_iter = attr.iteration >= 0
            kernel_counted = self._add_sums(ops, attr, dur, kernel, in_iter)
            # top kernels: (name, link, direction) packed in one key, sorted as the triples
            if kernel_counted.any():
                self._add_kernels(ops.name[kernel_counted], attr.link[kernel_counted],
                                  attr.backward[kernel_counted], dur[kernel_counted])
            self._add_timeline(ops.device, self._timeline_rows(ops, attr, kernel, in_iter))

    def _grow_links(self) -> None:
        """Room for twice as many links (a model's links: once)."""
        grown = np.zeros((max(len(self.link_keys), 2 * len(self.link_sums)), 5), dtype=np.int64)
        grown[:len(self.link_sums)] = self.link_sums
        self.link_sums = grown

    def _fold_counted(self) -> None:
        """figure_add's counts since added to :attr:`op_counts`, :attr:`outside_ns` and
        :attr:`warmup_ns`."""
        for kernels, copies, memsets, outside_ns, warmup_ns, *_ in self._counted:
            self.op_counts[KERNEL] += kernels
            self.op_counts[MEMCPY] += copies
            self.op_counts[MEMSET] += memsets
            self.outside_ns += outside_ns
            self.warmup_ns += warmup_ns
        self._counted.clear()

    def _add_sums(self, ops: GpuOps, attr: Attribution, dur: Int64Array,
                  kernel: npt.NDArray[np.bool_],
                  in_iter: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        """The per-link and per-phase sums in NumPy (the C ones' twin); the counted kernels."""
        kind = ops.kind
        copy = ~kernel & ((kind == MEMCPY) | (kind == MEMSET))
        for k, c in enumerate(np.bincount(kind, minlength=3)[:3].tolist()):
            self.op_counts[k] += c
        counted = attr.counted == 1
        outside = kernel & ~in_iter
        if outside.any():
            self.outside_ns += int(dur[outside].sum())
        kernel_counted: npt.NDArray[np.bool_] = kernel & counted
        warm = kernel & in_iter & ~counted
        if warm.any():
            self.warmup_ns += int(dur[warm].sum())
        # per link: kernels by (link, direction) slot, copies by link (float sums of integer
        # nanoseconds are exact below 2**53 ns, 104 days per buffer)
        n_links = len(self.link_keys)
        link = attr.link
        linked = counted & (link >= 0)
        sel = linked & kernel
        if sel.any():
            slot = 2 * link[sel] + (attr.backward[sel] == 1)
            ns = np.bincount(slot, weights=dur[sel], minlength=2 * n_links)
            calls = np.bincount(slot, minlength=2 * n_links)
            self.link_sums[:n_links, 0:4] += np.column_stack(
                (ns[0::2], calls[0::2], ns[1::2], calls[1::2])).astype(np.int64)
        sel = linked & copy
        if sel.any():
            self.link_sums[:n_links, 4] += np.bincount(
                link[sel], weights=dur[sel], minlength=n_links).astype(np.int64)
        # per phase
        phased = counted & (attr.phase != PHASE_OUTSIDE)
        n_phases = len(PHASE_KEYS)
        sel = phased & kernel
        if sel.any():
            phase = attr.phase[sel]
            self.phase_sums[:, 0] += np.bincount(phase, weights=dur[sel],
                                                 minlength=n_phases).astype(np.int64)
            self.phase_sums[:, 1] += np.bincount(phase, minlength=n_phases)
        sel = phased & copy
        if sel.any():
            self.phase_sums[:, 2] += np.bincount(attr.phase[sel], weights=dur[sel],
                                                 minlength=n_phases).astype(np.int64)
        return kernel_counted

    def _timeline_rows(self, ops: GpuOps, attr: Attribution, kernel: npt.NDArray[np.bool_],
                       in_iter: npt.NDArray[np.bool_]) -> Int64Array:
        """Each operation's row on the timeline, in NumPy (the C one's twin; see _Timeline)."""
        if self.loop_tid is None:
            with_iter = attr.tid[in_iter]
            if len(with_iter):
                self.loop_tid = int(with_iter[0])
        loop = (attr.tid == self.loop_tid).astype(np.int64)
        return np.column_stack([ops.start, ops.end, kernel.astype(np.int64), attr.api_start,
                                np.where(loop == 1, attr.iteration, -1), attr.iter_end, loop])

    def _add_timeline(self, device: Int64Array | None, rows: Int64Array,
                      only: int | None = None, earliest: int | None = None) -> None:
        """The rows onto their devices' timelines (``only``: every row's device, where known,
        else ``device``, each row's; ``earliest``: their earliest start, where known)."""
        if only is not None:  # (the usual: one device, no column read)
            self._add_device_rows(only, rows, earliest)
            return
        each: Int64Array = device if device is not None else np.zeros(0, dtype=np.int64)
        first = int(each[0])
        only = first if bool((each == first).all()) else None
        for dev in [only] if only is not None else np.unique(each).tolist():
            if only is not None:
                self._add_device_rows(dev, rows, earliest)
            else:
                self._add_device_rows(dev, rows[each == dev], None)

    def _add_device_rows(self, dev: int, rows: Int64Array, earliest: int | None) -> None:
        """Device ``dev``'s rows onto its timeline (``earliest``: their earliest start, where
        known)."""
        tl = self.timelines.get(dev)
        if tl is None:
            tl = self.timelines[dev] = _Timeline(dev, self.max_kept, self.native)
            tl.warmup_skip = self.warmup_skip
        tl.add(rows, earliest)
        if tl.pool_n > self.max_pool:  # place the oldest half
            starts = np.sort(np.concatenate([p[:, 0] for p in tl.pool]))
            tl.place(int(starts[len(starts) // 2]))

    def _add_kernels(self, name: Int64Array, link: Int64Array, backward: Int64Array,
                     dur: Int64Array) -> None:
        """Add counted kernels to the (name, link, direction) sums, new keys in that order."""
        width = 2 * (len(self.link_keys) + 1)  # (link + 1) * 2 + backward below width
        top = int(name.max()) + 1
        if top * width <= _DENSE_KEYS and int(name.min()) >= 0 and int(link.min()) >= -1:
            # few names and links: counted by a dense index, no sort (the usual)
            dense = name * width + (link + 1) * 2 + (backward & 1)
            calls = np.bincount(dense, minlength=top * width)
            present = np.flatnonzero(calls)
            ns = np.bincount(dense, weights=dur, minlength=top * width)[present].astype(
                np.int64)
            calls = calls[present]
            uniq = ((present // width) << _NAME_SHIFT) | (present % width)
        else:
            key = (name << _NAME_SHIFT) | ((link + 1) << 1) | (backward == 1)
            uniq, inverse = np.unique(key, return_inverse=True)
            ns = np.bincount(inverse, weights=dur).astype(np.int64)
            calls = np.bincount(inverse)
        found = self.kernel_keys
        pos = [found.get(k, -1) for k in uniq.tolist()]
        if -1 in pos:  # new keys, in key order; beyond MAX_KERNEL_KEYS they are "other"
            new = 0
            for i, k in enumerate(uniq.tolist()):
                if pos[i] < 0 and len(found) < MAX_KERNEL_KEYS:
                    pos[i] = found[k] = len(found)
                    new += 1
            if new:
                self.kernel_sums = np.vstack([self.kernel_sums,
                                              np.zeros((new, 2), dtype=np.int64)])
            over = np.array([p < 0 for p in pos])
            if over.any():
                self.other_kernels += (int(ns[over].sum()), int(calls[over].sum()))
                keep = ~over
                uniq, ns, calls = uniq[keep], ns[keep], calls[keep]
                pos = [p for p in pos if p >= 0]
        at = np.array(pos, dtype=np.intp)
        self.kernel_sums[at, 0] += ns
        self.kernel_sums[at, 1] += calls

    def advance(self, watermark_ns: int) -> None:
        """No operation starting before ``watermark_ns`` (agent ns) will arrive any more."""
        for tl in self.timelines.values():
            tl.place(watermark_ns)

    @property
    def pooled(self) -> int:
        return sum(tl.pool_n for tl in self.timelines.values())

    def result(self, statuses: dict[str, dict[str, float]] | None = None,
               clock: dict[str, float | int] | None = None) -> GpuFigures:
        """The figures (places everything still pooled: call once all activity is in)."""
        for tl in self.timelines.values():
            tl.finish()
        self._fold_counted()
        if self.native is not None:  # the kernels' sums kept in C
            keys, ns, calls, other_ns, other_calls = self.native.kernel_rows(self._kernel_table)
            self.kernel_keys = {k: i for i, k in enumerate(keys)}
            self.kernel_sums = np.array([ns, calls], dtype=np.int64).T.reshape(-1, 2)
            self.other_kernels = np.array([other_ns, other_calls], dtype=np.int64)
        totals = np.zeros(len(WINDOW_COLUMNS), dtype=np.int64)
        counted = 0
        devices: list[TimelineDict] = []
        columns: dict[str, list[float]] = {c: [] for c in WINDOW_COLUMNS}
        stride = 1
        for device in sorted(self.timelines):
            tl = self.timelines[device]
            totals += tl.totals
            counted = max(counted, tl.counted)
            devices.append(TimelineDict(
                device=device, windows=tl.counted, span_ms=int(tl.totals[0]) / 1e6,
                busy_ms=int(tl.totals[1]) / 1e6,
                idle_ms={k: int(tl.totals[2 + i]) / 1e6 for i, k in enumerate(IDLE_KEYS)}))
            if not columns["span"] and tl.series is not None:  # the first device's iterations
                columns = {c: tl.series.values[i].tolist()
                           for i, c in enumerate(WINDOW_COLUMNS)}
                stride = tl.series.stride
        span, busy = int(totals[0]), int(totals[1])
        copies = int(totals[2 + IDLE_KEYS.index("copies")])
        links: list[LinkGpuDict] = []
        for i, key in enumerate(self.link_keys[:len(self.link_sums)]):
            s = self.link_sums[i].tolist()
            if any(s):
                links.append(LinkGpuDict(name=key, fwd_ms=s[0] / 1e6, fwd_kernels=s[1],
                                         bwd_ms=s[2] / 1e6, bwd_kernels=s[3],
                                         copy_ms=s[4] / 1e6))
        links.sort(key=lambda x: (-(x["fwd_ms"] + x["bwd_ms"]), x["name"]))
        tops: list[KernelGpuDict] = []
        if len(self.kernel_sums):
            order = np.argsort(-self.kernel_sums[:, 0], kind="stable")[:TOP_KERNELS]
            keys = list(self.kernel_keys)
            for pos in order.tolist():
                name, link, back = _unpacked(keys[pos])
                ns, calls = self.kernel_sums[pos].tolist()
                tops.append(KernelGpuDict(
                    name=self.names.name(name),
                    link=self.link_keys[link] if 0 <= link < len(self.link_keys) else None,
                    backward=bool(back), ms=ns / 1e6, calls=calls))
        return GpuFigures(
            iterations=counted, warmup_skip=self.warmup_skip, span_ms=span / 1e6,
            busy_ms=busy / 1e6, busy_share=busy / span if span else None,
            active_share=(busy + copies) / span if span else None,
            idle_ms={k: int(totals[2 + i]) / 1e6 for i, k in enumerate(IDLE_KEYS)},
            iteration_ms=columns, sample_stride=stride, devices=devices,
            phases={key: PhaseGpuDict(kernel_ms=int(self.phase_sums[i, 0]) / 1e6,
                                      kernels=int(self.phase_sums[i, 1]),
                                      copy_ms=int(self.phase_sums[i, 2]) / 1e6)
                    for i, key in enumerate(PHASE_KEYS)},
            links=links, top_kernels=tops,
            warmup_kernel_ms=self.warmup_ns / 1e6, outside_kernel_ms=self.outside_ns / 1e6,
            ops={"kernel": self.op_counts[KERNEL], "memcpy": self.op_counts[MEMCPY],
                 "memset": self.op_counts[MEMSET]},
            statuses=dict(statuses or {}), late_ops=sum(tl.late for tl in self.timelines.values()),
            clock=dict(clock or {}))
