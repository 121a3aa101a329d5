"""Aggregation: recorded ranges -> :class:`~.stats.RunStats`, with NumPy.

One event model feeds both the live recorder and a saved trace: *ranges in
end order per thread*, each ``(name index, t0 ns, t1 ns, depth)``.
:class:`Aggregator` turns that stream into a :class:`~.stats.RunStats`, so a
summary printed at exit and a summary computed from the trace of the same run
agree.

Aggregation, per thread, as each range ends (children end before parents):

* ``iteration`` ranges: one iteration; the phase ranges (data, forward,
  backward, update) that ended inside it are its phases, and
  ``other = iteration - sum(phases)``.  The first ``warmup`` iterations of a
  thread are excluded from the statistics (their time is reported as
  ``warm-up``).  The figures are the loop thread's (below): threads that
  train at the same time would otherwise add up to more than the wall time;
  the other threads' iterations are only counted.
* ``gc`` ranges: their time inside each counted iteration (a per-iteration
  column beside the phases); the few slowest counted iterations are kept
  with what ran inside them (:mod:`.outliers`).
* ``gpu_wait`` ranges (the agent's own waits for the GPU): their time inside
  each counted iteration, per place (the phase they lie in, or ``other``
  between phases), as columns beside the phases; the phases and ``other``
  still include them.  A wait outside any iteration is time outside
  iterations like any depth-0 range.
* ``link`` ranges: calls, inclusive time and self time (inclusive minus the
  child link ranges) per link path; ``link_backward`` ranges: backward calls
  and time, attributed to the link whose forward created each function.
  Both only inside counted iterations.
* depth-0 ranges on the loop thread (the thread that ran most iterations)
  and the gaps between them make up the wall time: ``startup`` (before the
  first iteration), ``warm-up``, extension / inference / user ranges,
  ``agent`` (the agent's own work, its overhead), ``idle`` (gaps between
  iterations that no range covers) and ``shutdown`` (after the last
  iteration), so ``sum(iterations) + sum(outside) == wall``.

Memory: totals are exact running sums; the per-iteration lists keep every
iteration up to :data:`MAX_KEPT_ITERATIONS`, then a uniform sample (every
``sample_stride``-th iteration), so median and p95 stay representative over
millions of iterations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..common import names
from .outliers import SlowestIterations
from .range_kinds import (
    K_COMM,
    K_FUNCTION,
    K_GC,
    K_ITER,
    K_LINK,
    K_LINK_BWD,
    K_NO_UPDATE,
    K_OTHER,
    K_PHASE0,
    K_QUIET,
    K_WAIT,
    LinkIds,
    range_kind,
)
from .series import Series as Series  # where the GPU figures take it from
from .stats import (
    AFTER_WINDOW,
    BEFORE_WINDOW,
    DEPTH_BITS,
    DEPTH_MASK,
    IDLE,
    MAX_KEPT_ITERATIONS,
    PHASE_KEYS,
    SHUTDOWN,
    STARTUP,
    WARMUP,
    LinkStat,
    RunStats,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

    I64 = NDArray[np.int64]  # the recorder's int64 rows and the columns cut from them
    Mask = NDArray[np.bool_]

#: Function ranges (a FunctionNode's), and names not registered yet, are not aggregated.
_K_SKIP = K_FUNCTION
#: Rows of an iteration still open at the end of a block kept for the slow-iteration details.
_TAIL_ROWS = 2048
#: Columns per counted iteration: its time, the 5 phase keys, gc, the waits per phase key,
#: communication.
_SERIES_WIDTH = 3 + 2 * len(PHASE_KEYS)


class _ThreadAgg:
    """Aggregation state of one thread carried from one block of ranges to the next,
    and the thread's figures (the result is the loop thread's)."""

    __slots__ = ("child_ns", "comm_pending", "comm_total", "counted", "gap_pending",
                 "gc_pending", "gc_total", "iter_total", "iterations", "last_top_end",
                 "link_totals", "links", "named_pending", "nested_counted", "nested_held",
                 "nested_warm", "outside", "phase_ns", "phase_total", "sampled", "samples",
                 "samples_pending", "seen_iter", "series", "slowest", "tail", "wait_ns",
                 "wait_total", "waits_seen")

    def __init__(self, start_ns: int) -> None:
        self.counted = 0
        self.iter_total = 0
        self.phase_total = [0, 0, 0, 0, 0]
        self.link_totals: I64 | None = None  # int64 array (link keys, 5)
        self.series: Series | None = None  # made at the first counted iteration
        self.gc_total = 0                # collection time inside counted iterations
        self.slowest: SlowestIterations | None = None  # made at the first slow candidate
        self.phase_ns = [0, 0, 0, 0]     # phases of the iteration still open
        self.child_ns: dict[int, int] = {}  # depth -> child link time of the open range there
        self.links: I64 | None = None        # link figures not yet assigned to an iteration
        self.last_top_end = start_ns
        self.gap_pending = 0
        self.named_pending: dict[str, int] = {}  # named ranges after the last iteration, by key
        self.seen_iter = False
        self.nested_counted = 0          # iterations inside the open depth-0 range
        self.nested_warm = 0
        self.nested_held = 0             # ...and how many
        self.outside: dict[str, int] = {}
        self.iterations = 0
        self.gc_pending: I64 | None = None  # (t0, duration) of gc ranges not yet in an iteration
        self.tail: I64 | None = None        # rows of the open iteration (not links or functions)
        self.wait_ns = [0] * len(PHASE_KEYS)     # waits of the iteration still open, per place
        self.wait_total = [0] * len(PHASE_KEYS)  # waits inside counted iterations, per place
        self.waits_seen = False
        self.samples = 0                 # samples of the counted iterations whose count is known
        self.sampled = 0                 # ...and how many
        self.samples_pending: dict[int, int] = {}  # t1 of an iteration row -> its samples
        self.comm_pending: I64 | None = None  # (t0, duration, index) of comm ranges to place
        self.comm_total: dict[str, int] = {}  # communication in counted iterations, by name


class Aggregator:
    """Ranges in end order per thread -> :class:`RunStats`.

    :meth:`feed` takes a block of rows ``(index, t0, t1, depth)`` and works on
    the whole block with NumPy (the per-range cost is a few array
    operations); state that spans blocks (open iteration, open parents,
    gaps) is carried per thread, so any split into blocks gives the same
    result.  ``warmup_skip`` iterations are excluded (counted from the first
    recorded one); ``window`` (``(start, stop)`` or ``None``) only renames
    the time before and after it.
    """

    def __init__(self, start_ns: int = 0, warmup_skip: int = 0,
                 window: tuple[int, int] | None = None,
                 max_kept: int = MAX_KEPT_ITERATIONS) -> None:
        self.start_ns = start_ns
        self.warmup_skip = warmup_skip
        self.before_label = BEFORE_WINDOW if window and window[0] > 0 else STARTUP
        self.after_label = AFTER_WINDOW if window else SHUTDOWN
        self.names: list[str] = []
        self.kinds: list[int] = []
        self.keys: list[str] = []          # outside key per name index
        self.link_ids: list[int] = []      # link key id per name index (-1: not a link)
        self.gens: list[int] = []          # collected generation per gc name index
        self.wait_places: list[int] = []   # PHASE_KEYS index per wait name index (-1: outside)
        self._link_ids = LinkIds()
        self.link_keys = self._link_ids.keys
        self._np_tables: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None
        self.threads: dict[int, _ThreadAgg] = {}
        self.max_kept = max_kept
        self.seen = 0                      # iterations seen, every thread, warm-up included
        self.ranges = 0
        self.phase_seen = False

    # -- names ----------------------------------------------------------------
    def add_name(self, index: int, name: str, category: str) -> None:
        """Register name ``index`` (indexes may arrive in any order)."""
        while len(self.names) <= index:
            self.names.append("")
            self.kinds.append(_K_SKIP)
            self.keys.append("")
            self.link_ids.append(-1)
            self.gens.append(0)
            self.wait_places.append(-1)
        self.names[index] = name
        kind, key = range_kind(name, category)
        if kind == K_GC:
            self.gens[index] = names.gc_generation(name) or 0
        if kind == K_WAIT:
            place = names.gpu_wait_place(name)
            self.wait_places[index] = names.WAIT_PLACES.index(place) if place else -1
        self.kinds[index], self.keys[index] = kind, key
        if kind in (K_LINK, K_LINK_BWD):
            self.link_ids[index] = self._link_ids.id_of(key)
        self._np_tables = None

    def _tables(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        tables = self._np_tables
        n = min(len(self.kinds), len(self.link_ids))  # another thread may be adding a name
        if tables is None or len(tables[0]) != n:
            tables = self._np_tables = (np.array(self.kinds[:n], dtype=np.int64),
                                        np.array(self.link_ids[:n], dtype=np.int64))
        return tables

    # -- feeding --------------------------------------------------------------
    def feed(self, tid: int, rows: ArrayLike,
             samples: Sequence[tuple[int, int]] | None = None) -> None:
        """Aggregate a block of rows of thread ``tid``, in end order.

        ``rows``: an int64 array of shape ``(n, 4)`` (or anything NumPy turns
        into one).  ``samples``: ``(t1, samples)`` of iterations of this thread, each told
        by the end of its row (:meth:`_samples`): of this block, or of a later one (kept
        until its row comes).
        """
        a = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
        n = len(a)
        th = self.threads.get(tid)
        if th is None and (n or samples):
            th = self.threads[tid] = _ThreadAgg(self.start_ns)
        if samples:
            assert th is not None
            th.samples_pending.update(samples)
        if not n or th is None:
            return
        self.ranges += n
        kinds_t, link_ids_t = self._tables()
        index = a[:, 0]
        known = index < len(kinds_t)
        safe = np.where(known, index, 0)
        kind = np.where(known, kinds_t[safe] if len(kinds_t) else 0, _K_SKIP)
        t0, t1 = a[:, 1], a[:, 2]
        depth = a[:, 3] & DEPTH_MASK
        dur = t1 - t0

        is_iter = kind == K_ITER
        it_pos = np.flatnonzero(is_iter)
        n_it = len(it_pos)
        seq = th.iterations + np.arange(1, n_it + 1)
        it_counted = seq > self.warmup_skip
        self.seen += n_it
        th.iterations += n_it

        if th.samples_pending and n_it:
            self._samples(th, t1[it_pos], it_counted)
        self._links(th, a, kind, depth, dur, is_iter, it_pos, it_counted, link_ids_t)
        phases = self._phases(th, kind, dur, is_iter)
        gc_ns = self._gc(th, kind, t0, dur, it_pos)
        waits = self._waits(th, kind, index, dur, is_iter)
        comm = self._comm(th, kind, index, t0, dur, it_pos, it_counted)
        if n_it:
            it_dur = dur[it_pos]
            other = it_dur - phases.sum(axis=1)
            full = np.column_stack([it_dur, phases, other, gc_ns, waits, comm])
            table = full[it_counted]
            if len(table):
                th.counted += len(table)
                th.iter_total += int(table[:, 0].sum())
                sums = table[:, 1:].sum(axis=0).tolist()
                for i in range(5):
                    th.phase_total[i] += int(sums[i])
                    th.wait_total[i] += int(sums[6 + i])
                th.gc_total += int(sums[5])
                if th.series is None:
                    # per counted iteration: its time, its phases (and the rest), its gc
                    # time, its waits for the GPU per place
                    th.series = Series(self.max_kept, _SERIES_WIDTH)
                th.series.extend(table / 1e6)
                self._slowest(th, a, kind, it_pos, it_counted, full, seq)
        self._keep_tail(th, a, kind, it_pos)
        self._top_level(th, kind, index, t0, t1, depth, dur, is_iter, it_pos, it_counted)

    def _samples(self, th: _ThreadAgg, ends: I64, counted: Mask) -> None:
        """The samples of the block's iterations (``ends``: their rows' ``t1``): summed over
        the counted ones; those told for rows already fed and never matched are dropped,
        those of rows still to come kept (bounded: one block's iterations at most)."""
        pending = th.samples_pending
        found = [pending.pop(t, 0) for t in ends.tolist()]
        for (n, ok) in zip(found, counted.tolist()):
            if ok and n:
                th.samples += n
                th.sampled += 1
        last = int(ends.max())
        for t in [t for t in pending if t <= last]:
            del pending[t]

    def _phases(self, th: _ThreadAgg, kind: I64, dur: I64, is_iter: Mask) -> I64:
        """(iterations in block, 4) phase sums; the phases of an open iteration are carried.

        A phase belongs to the range holding it: the next iteration or no-update range to end
        (ranges nest); those of a no-update range count nowhere."""
        holders = np.flatnonzero(is_iter | (kind == K_NO_UPDATE))
        holder_is_iter = is_iter[holders]
        n_it = int(holder_is_iter.sum())
        iteration_of = np.cumsum(holder_is_iter) - 1  # per holder: its iteration's index
        ph = np.flatnonzero(kind >= K_PHASE0)
        sums = np.zeros((n_it, 4), dtype=np.int64)
        if len(ph):
            self.phase_seen = True
            owner = np.searchsorted(holders, ph)
            slot = kind[ph] - K_PHASE0
            inside = owner < len(holders)
            counted = inside.copy()
            counted[inside] = holder_is_iter[owner[inside]]
            flat = _bincount(iteration_of[owner[counted]] * 4 + slot[counted], dur[ph][counted],
                             n_it * 4)
            sums += flat.reshape(n_it, 4)
            left = _bincount(slot[~inside], dur[ph][~inside], 4)
        else:
            left = None
        carried = th.phase_ns
        if len(holders):
            if holder_is_iter[0]:
                sums[0] += np.array(carried, dtype=np.int64)
            carried = [0, 0, 0, 0]
        if left is not None:
            carried = [c + int(x) for c, x in zip(carried, left.tolist())]
        th.phase_ns = carried
        return sums

    def _waits(self, th: _ThreadAgg, kind: I64, index: I64, dur: I64, is_iter: Mask) -> I64:
        """(iterations in block, 5) the agent's waits per place; an open iteration's are carried.

        A wait belongs, as a phase does, to the range holding it: the next iteration or
        no-update range to end (those of a no-update range count nowhere); its name says its
        place (a phase, or the iteration between phases).
        """
        holders = np.flatnonzero(is_iter | (kind == K_NO_UPDATE))
        holder_is_iter = is_iter[holders]
        n_it = int(holder_is_iter.sum())
        iteration_of = np.cumsum(holder_is_iter) - 1  # per holder: its iteration's index
        width = len(PHASE_KEYS)
        sums = np.zeros((n_it, width), dtype=np.int64)
        w = np.flatnonzero(kind == K_WAIT)
        carried = th.wait_ns
        if len(holders):
            if holder_is_iter[0]:
                sums[0] += np.array(carried, dtype=np.int64)
            carried = [0] * width
        if len(w):
            th.waits_seen = True
            table = self.wait_places
            place = np.array([table[i] if i < len(table) else -1 for i in index[w].tolist()],
                             dtype=np.int64)
            keep = place >= 0
            w, place = w[keep], place[keep]
            owner = np.searchsorted(holders, w)
            inside = owner < len(holders)
            counted = inside.copy()
            counted[inside] = holder_is_iter[owner[inside]]
            flat = _bincount(iteration_of[owner[counted]] * width + place[counted],
                             dur[w][counted], n_it * width)
            sums += flat.reshape(n_it, width)
            left = _bincount(place[~inside], dur[w][~inside], width)
            carried = [c + int(x) for c, x in zip(carried, left.tolist())]
        th.wait_ns = carried
        return sums

    def _gc(self, th: _ThreadAgg, kind: I64, t0: I64, dur: I64, it_pos: I64) -> I64:
        """Collection time inside each iteration of the block; later ones are carried."""
        n_it = len(it_pos)
        sums = np.zeros(n_it, dtype=np.int64)
        g = np.flatnonzero(kind == K_GC)
        pending = th.gc_pending
        if n_it and pending is not None:
            inside = pending[:, 0] >= t0[it_pos[0]]
            sums[0] += int(pending[inside, 1].sum())
            pending = None
        if len(g):
            owner = np.searchsorted(it_pos, g)
            within = owner < n_it
            rows, own = g[within], owner[within]
            ok = t0[rows] >= t0[it_pos[own]]  # not a collection between iterations
            sums += _bincount(own[ok], dur[rows[ok]], n_it)
            left = g[~within]
            if len(left):
                later = np.column_stack([t0[left], dur[left]])
                pending = later if pending is None else np.vstack([pending, later])[-_TAIL_ROWS:]
        th.gc_pending = pending
        return sums

    def _comm(self, th: _ThreadAgg, kind: I64, index: I64, t0: I64, dur: I64, it_pos: I64,
              it_counted: Mask) -> I64:
        """Communication time inside each iteration of the block, and its total per operation
        over the counted ones; a range belongs to the next iteration to end when it began
        inside it (not before: between iterations, in an extension, before the loop)."""
        n_it = len(it_pos)
        sums = np.zeros(n_it, dtype=np.int64)
        c = np.flatnonzero(kind == K_COMM)
        pending = th.comm_pending
        if not len(c) and (pending is None or not n_it):
            return sums
        rows = np.column_stack([t0[c], dur[c], index[c]])
        owner = np.searchsorted(it_pos, c)
        if pending is not None:  # ended before this block: the block's first iteration's
            rows = np.vstack([pending, rows])
            owner = np.concatenate([np.zeros(len(pending), dtype=np.int64), owner])
        within = owner < n_it
        inside = within.copy()
        inside[within] = rows[within, 0] >= t0[it_pos[owner[within]]]
        sums += _bincount(owner[inside], rows[inside, 1], n_it)
        counted = inside.copy()
        counted[inside] = it_counted[owner[inside]]
        if counted.any():
            totals, keys = th.comm_total, self.keys
            for idx, ns in _sum_by(rows[counted, 2], rows[counted, 1]):
                key = keys[idx] if idx < len(keys) else "?"
                totals[key] = totals.get(key, 0) + ns
        later = rows[~within]
        th.comm_pending = later[-_TAIL_ROWS:] if len(later) else None
        return sums

    def _keep_tail(self, th: _ThreadAgg, a: I64, kind: I64, it_pos: I64) -> None:
        """Keep the rows after the block's last iteration (no links, no functions)."""
        start = int(it_pos[-1]) + 1 if len(it_pos) else 0
        rest = a[start:]
        rest = rest[_wanted(kind[start:])]
        if len(it_pos) or th.tail is None:
            th.tail = rest if len(rest) else None
        elif len(rest):
            th.tail = np.vstack([th.tail, rest])[-_TAIL_ROWS:]

    def _slowest(self, th: _ThreadAgg, a: I64, kind: I64, it_pos: I64, it_counted: Mask,
                 table: I64, seq: I64) -> None:
        """Offer the block's slowest counted iterations, with their details, to the keeper."""
        keeper = th.slowest
        if keeper is None:
            keeper = th.slowest = SlowestIterations()
        slow = np.flatnonzero(it_counted & (table[:, 0] > keeper.threshold()))
        if not len(slow):
            return
        if len(slow) > keeper.keep:
            slow = slow[np.argpartition(-table[slow, 0], keeper.keep)[:keeper.keep]]
        for j in slow.tolist():
            packed = int(a[it_pos[j], 3]) >> DEPTH_BITS  # the iteration's number + 1, if recorded
            number = packed - 1 if packed > 0 else int(seq[j]) - 1
            keeper.add(int(table[j, 0]), self._details(th, a, kind, it_pos, j, table[j], number))

    def _details(self, th: _ThreadAgg, a: I64, kind: I64, it_pos: I64, j: int, row: I64,
                 number: int) -> dict[str, Any]:
        """What ran inside iteration ``j`` of the block: phases, collections, named ranges."""
        p = int(it_pos[j])
        start = int(it_pos[j - 1]) + 1 if j else 0
        rows, kinds = a[start:p], kind[start:p]
        keep = _wanted(kinds)
        rows, kinds = rows[keep], kinds[keep]
        if not j and th.tail is not None:
            kinds_t = self._tables()[0]
            tail = th.tail[th.tail[:, 0] < len(kinds_t)]
            rows = np.vstack([tail, rows])
            kinds = np.concatenate([kinds_t[tail[:, 0]], kinds])
        it_t0, it_t1 = int(a[p, 1]), int(a[p, 2])
        inside = (rows[:, 1] >= it_t0) & (rows[:, 2] <= it_t1)
        phases_seen: list[tuple[str, int, int]] = []
        gcs: list[tuple[int, int, int]] = []
        named: list[tuple[int, int, int, int]] = []
        for (index, t0, t1, _depth), k in zip(rows[inside].tolist(), kinds[inside].tolist()):
            if k >= K_PHASE0:
                phases_seen.append((PHASE_KEYS[k - K_PHASE0], t0, t1))
            elif k == K_GC:
                gcs.append((index, t0, t1))
            else:
                named.append((index, t0, t1, k))

        def phase_of(t0: int, t1: int) -> str:
            for key, p0, p1 in phases_seen:
                if p0 <= t0 and t1 <= p1:
                    return key
            return "other"

        gc_rows = sorted(([self.gens[i] if i < len(self.gens) else 0, (t1 - t0) / 1e6,
                           phase_of(t0, t1)] for i, t0, t1 in gcs), key=_longest_first)
        ranges = sorted(([self.names[i] if i < len(self.names) else "?", (t1 - t0) / 1e6,
                          phase_of(t0, t1)] for i, t0, t1, _k in named), key=_longest_first)
        values = (row / 1e6).tolist()
        return {"iteration": number, "ms": values[0],
                "phases": {key: values[1 + i] for i, key in enumerate(PHASE_KEYS)},
                "gc_ms": values[6], "gc": gc_rows[:5], "ranges": ranges[:3]}

    def _links(self, th: _ThreadAgg, a: I64, kind: I64, depth: I64, dur: I64, is_iter: Mask,
               it_pos: I64, it_counted: Mask, link_ids_t: I64) -> None:
        """Link calls, inclusive/self time and attributed backward time, per counted iteration."""
        n = len(a)
        is_link = kind == K_LINK
        is_bwd = kind == K_LINK_BWD
        lk = np.flatnonzero(is_link | is_bwd)
        if not len(lk) and th.links is None and not th.child_ns:
            return
        # child link time: a range's parent is the next range to end one level up
        child = np.zeros(n, dtype=np.int64)
        for d, carried in list(th.child_ns.items()):
            first = np.flatnonzero(depth == d)
            if len(first):
                child[first[0]] += carried
                del th.child_ns[d]
        fwd = np.flatnonzero(is_link & (depth > 0))
        if len(fwd):
            fwd_depth = depth[fwd]
            for d in np.unique(fwd_depth).tolist():
                rows = fwd[fwd_depth == d]
                parents = np.flatnonzero(depth == d - 1)
                k = np.searchsorted(parents, rows, side="right")
                inside = k < len(parents)
                child += _bincount(parents[k[inside]], dur[rows[inside]], n)
                rest = int(dur[rows[~inside]].sum())
                if rest:
                    th.child_ns[d - 1] = th.child_ns.get(d - 1, 0) + rest
        n_keys = len(self.link_keys)
        # which iteration each link range belongs to: the next iteration or quiet range
        markers = np.flatnonzero(is_iter | (kind == K_QUIET) | (kind == K_NO_UPDATE))
        marker_counted = np.zeros(len(markers), dtype=bool)
        marker_counted[np.searchsorted(markers, it_pos)] = it_counted
        if th.links is not None and len(markers):
            if marker_counted[0]:
                self._add_links(th, th.links)
            th.links = None
        if not len(lk):
            return
        m = np.searchsorted(markers, lk, side="right")
        pending = m >= len(markers)
        keep = np.zeros(len(lk), dtype=bool)
        keep[~pending] = marker_counted[m[~pending]]
        ids = link_ids_t[a[lk, 0]]
        ones = is_link[lk].astype(np.int64)
        bwd = 1 - ones
        d_lk = dur[lk]
        self_ns = (d_lk - child[lk]) * ones
        cols = (ones, d_lk * ones, self_ns, bwd, d_lk * bwd)

        def block(sel: Mask) -> I64:
            return np.column_stack([_bincount(ids[sel], col[sel], n_keys) for col in cols])

        if keep.any():
            self._add_links(th, block(keep))
        if pending.any():
            part = block(pending)
            th.links = part if th.links is None else _grow(th.links, n_keys) + part

    @staticmethod
    def _add_links(th: _ThreadAgg, part: I64) -> None:
        if th.link_totals is None:
            th.link_totals = part.copy()
        else:
            n = max(len(th.link_totals), len(part))
            th.link_totals = _grow(th.link_totals, n) + _grow(part, n)

    def _top_level(self, th: _ThreadAgg, kind: I64, index: I64, t0: I64, t1: I64, depth: I64,
                   dur: I64, is_iter: Mask, it_pos: I64, it_counted: Mask) -> None:
        """Wall-time accounting of the depth-0 ranges and the gaps between them.

        Only what runs between two iterations is between iterations: a gap or a named range
        (an evaluation, an extension, a block of the program's) before the first one is
        start-up, and after the last one it is after the last iteration.  A depth-0 range
        holding iterations (an ``annotate()`` block around the loop) counts as one of them
        for this, its own time under its name.
        """
        top = np.flatnonzero(depth == 0)
        nested = np.flatnonzero(is_iter & (depth > 0))
        nested_counted = it_counted[np.searchsorted(it_pos, nested)] if len(nested) else None
        # iterations nested in a depth-0 range: assign to the next depth-0 range to end
        counted_in = np.zeros(len(top) + 1, dtype=np.int64)
        warm_in = np.zeros(len(top) + 1, dtype=np.int64)
        held = np.zeros(len(top) + 1, dtype=np.int64)  # and how many
        if len(nested):
            assert nested_counted is not None  # made above whenever nested is not empty
            owner = np.searchsorted(top, nested)
            counted_in += _bincount(owner, dur[nested] * nested_counted, len(top) + 1)
            warm_in += _bincount(owner, dur[nested] * ~nested_counted, len(top) + 1)
            held += np.bincount(owner, minlength=len(top) + 1)
        counted_in[0] += th.nested_counted
        warm_in[0] += th.nested_warm
        held[0] += th.nested_held
        th.nested_counted = int(counted_in[-1])
        th.nested_warm = int(warm_in[-1])
        th.nested_held = int(held[-1])
        if not len(top):
            return
        outside = th.outside
        top_is_iter = is_iter[top]
        anchors = np.flatnonzero(top_is_iter | (held[:-1] > 0))  # iterations, or holding some
        ends = t1[top]
        gaps = t0[top] - np.concatenate(([th.last_top_end], ends[:-1]))
        np.maximum(gaps, 0, out=gaps)
        th.last_top_end = max(th.last_top_end, int(ends.max()))
        iters = np.flatnonzero(top_is_iter)
        # a gap before the first iteration is start-up; later gaps are idle once
        # another iteration follows them, pending until then
        seen_before = np.ones(len(top), dtype=bool)
        if not th.seen_iter:
            seen_before[:anchors[0] + 1 if len(anchors) else len(top)] = False
        before = int(gaps[~seen_before].sum())
        if before:
            outside[self.before_label] = outside.get(self.before_label, 0) + before
        later = np.where(seen_before, gaps, 0)
        last = int(anchors[-1]) if len(anchors) else -1
        if len(anchors):
            idle = th.gap_pending + int(later[:last + 1].sum())
            if idle:
                outside[IDLE] = outside.get(IDLE, 0) + idle
            th.gap_pending = int(later[last + 1:].sum())
            for key, ns in th.named_pending.items():  # an iteration followed them
                outside[key] = outside.get(key, 0) + ns
            th.named_pending = {}
            th.seen_iter = True
        else:
            th.gap_pending += int(later.sum())
        warm = 0
        if len(iters):
            counted = it_counted[np.searchsorted(it_pos, top[iters])]
            warm = int(dur[top[iters]][~counted].sum())
        others = np.flatnonzero(~top_is_iter)
        if len(others):
            rows = top[others]
            warm += int(warm_in[others].sum())
            own = dur[rows] - counted_in[others] - warm_in[others]
            keys = self.keys
            # before the first iteration: start-up; after the last: pending until another
            # comes (then between iterations), else after the last iteration
            place = np.where(~seen_before[others] & (held[others] == 0), 0,
                             np.where(others > last, 2, 1))
            for where, label in ((0, self.before_label), (1, None), (2, "")):
                chosen = place == where
                if not chosen.any():
                    continue
                if label:
                    outside[label] = outside.get(label, 0) + int(own[chosen].sum())
                    continue
                into = outside if label is None else th.named_pending
                for idx, ns in _sum_by(index[rows[chosen]], own[chosen]):
                    key = keys[idx] if idx < len(keys) else "?"
                    into[key] = into.get(key, 0) + ns
        if warm:
            outside[WARMUP] = outside.get(WARMUP, 0) + warm

    # -- result -----------------------------------------------------------------
    def loop_thread(self, prefer: int | None = None) -> int | None:
        """The thread that ran most iterations (``prefer`` when none did)."""
        best, best_n = prefer, 0
        for tid, th in self.threads.items():
            if th.iterations > best_n:
                best, best_n = tid, th.iterations
        if best is None and self.threads:
            best = next(iter(self.threads))
        return best

    def samples_of(self, main_tid: int | None = None) -> dict[str, int]:
        """The loop thread's samples in its counted iterations (the run record's fields)."""
        tid = self.loop_thread(main_tid)
        th = self.threads.get(tid) if tid is not None else None
        return {"samples": th.samples if th is not None else 0,
                "sampled_iterations": th.sampled if th is not None else 0}

    def thread_ended(self, tid: int) -> None:
        """Thread ``tid`` ended: forget it unless it may still be the loop thread."""
        th = self.threads.get(tid)
        if th is None:
            return
        if th.iterations == 0 or any(other.iterations >= th.iterations
                                     for key, other in self.threads.items() if key != tid):
            del self.threads[tid]

    def result(self, end_ns: int, main_tid: int | None = None, sample: int | None = None,
               **extra: Any) -> RunStats:
        """The statistics so far (the loop thread's), the run ending at ``end_ns``; ``sample``:
        at most that many values per per-iteration list (a uniform sample, for the trace so
        far written every few seconds: its size must not follow the run's length)."""
        tid = self.loop_thread(main_tid)
        outside_ns: dict[str, int] = {}
        th = self.threads.get(tid) if tid is not None else None
        if th is not None:
            outside_ns = dict(th.outside)
            tail = max(0, end_ns - th.last_top_end) + th.gap_pending \
                + sum(th.named_pending.values())  # what ran after the last iteration
            label = self.after_label if th.seen_iter else self.before_label
            if tail:
                outside_ns[label] = outside_ns.get(label, 0) + tail
        elif end_ns > self.start_ns:
            outside_ns[self.before_label] = end_ns - self.start_ns
        if th is None:
            th = _ThreadAgg(self.start_ns)
        series = th.series or Series(self.max_kept, _SERIES_WIDTH)
        values: Sequence[Sequence[float]] = series.values
        stride = series.stride
        if sample is not None and len(values[0]) > sample > 0:
            step = -(-len(values[0]) // sample)
            values = [column[::step] for column in values]
            stride *= step
        links = []
        if th.link_totals is not None:
            for key, s in zip(self.link_keys, th.link_totals.tolist()):
                if s[0] or s[3]:
                    links.append(LinkStat(key, s[0], s[1] / 1e6, s[2] / 1e6, s[3], s[4] / 1e6))
        links.sort(key=lambda link: (-link.incl_ms, -link.bwd_ms, link.name))
        fields: dict[str, Any] = {
            "iterations": th.counted,
            "warmup": th.iterations - th.counted,
            "other_thread_iterations": self.seen - th.iterations,
            "iteration_ms": list(values[0]),
            "phase_ms": {key: list(values[i + 1]) for i, key in enumerate(PHASE_KEYS)},
            "outside_ms": {k: v / 1e6 for k, v in outside_ns.items() if v > 0},
            "wall_ms": max(0, end_ns - self.start_ns) / 1e6,
            "links": links,
            "batch_size": None, "sync_level": 0, "sync_calls": 0, "overhead_ms": 0.0,
            "samples": th.samples, "sampled_iterations": th.sampled,
            "gpu_phase_ms": None, "meta": {},
            "iteration_total_ms": th.iter_total / 1e6,
            "phase_total_ms": {key: th.phase_total[i] / 1e6
                               for i, key in enumerate(PHASE_KEYS)},
            "sample_stride": stride,
            "ranges": self.ranges,
            "has_phases": self.phase_seen or th.counted == 0,
            "gc_ms": list(values[6]),
            "gc_total_ms": th.gc_total / 1e6,
            "wait_phase_ms": {key: list(values[7 + i]) for i, key in enumerate(PHASE_KEYS)},
            "wait_phase_total_ms": {key: th.wait_total[i] / 1e6
                                    for i, key in enumerate(PHASE_KEYS)},
            "waits_recorded": th.waits_seen,
            "comm_ms": list(values[12]),
            "comm_total_ms": {key: ns / 1e6 for key, ns in th.comm_total.items()},
            "slowest": th.slowest.items() if th.slowest is not None else [],
        }
        fields.update(extra)
        return RunStats(**fields)


def _wanted(kinds: I64) -> Mask:
    """Rows the slow-iteration details look at: phases, collections, named ranges."""
    wanted: Mask = ((kinds >= K_PHASE0) | (kinds == K_GC) | (kinds == K_QUIET)
                    | (kinds == K_OTHER) | (kinds == K_NO_UPDATE) | (kinds == K_COMM))
    return wanted


def _sum_by(keys: I64, values: I64) -> list[tuple[int, int]]:
    """``(key, sum of values)`` for each distinct key (small non-negative ints)."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    sums = _bincount(inverse, values, len(uniq))
    return list(zip(uniq.tolist(), sums.tolist()))


def _bincount(bins: I64, values: I64, size: int) -> I64:
    """Integer sums of ``values`` per bin (exact below 2**53 ns, about 104 days)."""
    if not len(bins):
        return np.zeros(size, dtype=np.int64)
    return np.rint(np.bincount(bins, weights=values, minlength=size)).astype(np.int64)


def _grow(table: I64, rows: int) -> I64:
    """``table`` padded with zero rows to ``rows`` rows."""
    if len(table) >= rows:
        return table
    return np.vstack([table, np.zeros((rows - len(table), table.shape[1]), dtype=table.dtype)])


def _longest_first(row: Sequence[Any]) -> float:
    """Sort key of a ``[name, ms, phase]`` row: the longest first."""
    ms: float = row[1]
    return -ms
