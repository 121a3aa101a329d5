"""One GPU analysis of a run: ranges and CUPTI activity in, figures and trace records out.

:class:`GpuAnalysis` composes :class:`~.gpu_attribution.LaunchAttributor` (which range
launched each operation), :class:`~.gpu_figures.GpuFigureBuilder` (the figures) and a
bounded keeper of attributed operations for the trace (at most ``record_limit``: whole
iterations, the newest first, before what ran outside them).  The same object serves the
live agent (fed from the recorder's blocks and the collector's buffers) and a replay of a
recording (fed from a saved trace and the recording's batches): one code path.

Feeding: :meth:`add_name` for each range name (as the recorder's ``prepare``),
:meth:`feed_ranges` with each thread's blocks of rows ``(name index, t0, t1, depth)``
in end order, :meth:`feed_activity` with each :class:`~..common.gpu_records.ActivityBatch`,
:meth:`map_thread` where the agent knows CUPTI's id of a thread; then :meth:`finish`.
Not thread-safe: one caller at a time (the live agent takes a lock).

Memory, bounded by the limits (defaults in brackets): the newest ``max_api`` API calls
[2**18] at 48 bytes; operations waiting for their call, their thread's map or their
thread's ranges, at most ``max_pending`` [2**16] per waiting thread, at 320 bytes;
per thread the newest ``max_ranges`` ranges [2**17] at 40 bytes; per device a reorder
pool of ``max_pool`` operations [2**16] at 56 bytes; the ``record_limit`` operations
kept for the trace [50,000] at 320 bytes (and as many dropped, until their block is
copied); the figures' per-iteration lists as the
aggregator's.  About 60 MB at most with the defaults for one training thread on one
GPU, whatever the length of the run
(``tests/test_gpu_bounded.py``: a million kernels in the memory of 100,000).
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections import deque
from dataclasses import dataclass
from itertools import accumulate, repeat
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..common import figures
from ..common.gpu_records import ActivityBatch, LocateKernel, NameTable
from .gpu_attribution import AttributedOps, BlockAttributedOps, LaunchAttributor
from .gpu_clock import ClockMap
from .gpu_figures import GpuFigureBuilder, GpuFigures
from .stats import MAX_KEPT_ITERATIONS

Int64Array = npt.NDArray[np.int64]

if TYPE_CHECKING:
    from ..common.typedefs import RangeRows


@dataclass(frozen=True)
class Limits:
    """The bounds of the analysis' state (see the module docstring)."""

    max_pending: int = 1 << 16
    max_api: int = 1 << 18
    max_ranges: int = 1 << 17
    max_pool: int = 1 << 16
    max_kept: int = MAX_KEPT_ITERATIONS


#: What the trace keeps of the GPU operations, the first dropped first: those launched
#: outside any iteration (start-up, an evaluation after training), warm-up iterations',
#: counted iterations'.
OUTSIDE, WARMUP, COUNTED = 0, 1, 2


#: A group's key: (OUTSIDE/WARMUP/COUNTED, ordinal or arrival, tid); groups go in its order.
_Key = tuple[int, int, int]
#: An iteration's class by whether it is counted.
_CLASS = (WARMUP, COUNTED)
#: Below every counted iteration's key, above every warm-up one's.
_FIRST_COUNTED = (COUNTED,)


class _Block:
    """A block of kept operations as it came, with its groups' keys (``keys``, its groups
    in order) and their rows: runs of rows (``runs``), or each row's group (``group_of``,
    made from the runs when needed).

    Its dead rows (of dropped groups) stay until the keeper's dead rows pass its limit. A
    block of runs whose keys ascend (the usual: one thread, iterations in order) loses its
    groups first to last, so its dead rows are its first ``lo`` (``head`` groups dropped):
    no mask.  Any other (or one trimmed) marks them in ``dead``, its dropped groups in
    ``gone``."""

    __slots__ = ("_group_of", "cum", "dead", "gone", "head", "items", "keys", "live", "lo",
                 "prefix", "runs", "size")

    def __init__(self, items: AttributedOps, group_of: Int64Array | None, keys: list[_Key],
                 runs: list[int], cum: list[int] | None) -> None:
        self.items = items
        self._group_of = group_of
        self.keys = keys
        self.runs = runs
        self.cum = cum                  # the runs' rows summed, where ``prefix``
        self.prefix = cum is not None   # dead rows: the first ``lo`` (else ``dead``)
        self.head = self.lo = 0
        self.gone: list[bool] = [] if self.prefix else [False] * len(keys)
        self.dead: npt.NDArray[np.bool_] | None = None  # none dead yet
        self.size = self.live = len(items)

    @property
    def group_of(self) -> Int64Array:
        if self._group_of is None:
            self._group_of = np.repeat(np.arange(len(self.runs), dtype=np.int64), self.runs)
        return self._group_of

    @group_of.setter
    def group_of(self, value: Int64Array) -> None:
        self._group_of = value

    def masked(self) -> None:
        """Its dead rows marked in ``dead`` from now on (a trim)."""
        if self.prefix:
            self.prefix = False
            self.gone = [True] * self.head + [False] * (len(self.keys) - self.head)
            if self.lo:
                self.dead = np.zeros(self.size, dtype=bool)
                self.dead[:self.lo] = True
                self.lo = 0

    def drop_upto(self, last: _Key) -> _Key | None:
        """Drop its groups up to the key ``last`` (those not dropped yet); its first key
        left (``None``: none)."""
        keys = self.keys
        if self.prefix and self.cum is not None:
            head = bisect.bisect_right(keys, last, self.head)
            lo = self.cum[head - 1] if head else 0
            self.live -= lo - self.lo
            self.head, self.lo = head, lo
            return keys[head] if head < len(keys) else None
        gone = self.gone
        locals_ = [i for i, key in enumerate(keys) if not gone[i] and key <= last]
        for i in locals_:
            gone[i] = True
        dead = self.rows_of(locals_)
        if self.dead is not None:  # a group's rows die once: the others' stay
            dead |= self.dead
        self.live = self.size - int(np.count_nonzero(dead))
        self.dead = dead
        return min((key for i, key in enumerate(keys) if not gone[i]), default=None)

    def rows_of(self, locals_: list[int]) -> npt.NDArray[np.bool_]:
        """Whether each row is of one of the groups ``locals_``: by a table of the block's
        groups (np.isin: ~40k instructions), repeated over its runs where it came so."""
        if self._group_of is not None and len(locals_) == 1:
            return np.equal(self._group_of, locals_[0])
        gone = np.zeros(len(self.keys), dtype=bool)
        gone[locals_] = True
        if self._group_of is None:  # runs, as they came (its rows never copied)
            return np.repeat(gone, self.runs)
        return gone[self._group_of]

    def live_items(self) -> AttributedOps:
        if self.dead is not None:
            return self.items.take(~self.dead)
        return _copied(self.items, self.lo, self.size) if self.lo else self.items

    def compact(self) -> None:
        """Its live rows copied, the dead ones freed."""
        if self.prefix and self.cum is not None:
            head, lo = self.head, self.lo
            self.items = _copied(self.items, lo, self.size)
            self.keys, self.runs = self.keys[head:], self.runs[head:]
            self.cum = [c - lo for c in self.cum[head:]]
            self.head = self.lo = 0
        elif self.dead is not None:
            live = np.flatnonzero(~self.dead)
            a, b = int(live[0]), int(live[-1]) + 1
            if b - a == len(live):  # one run of rows (the usual): copied, not gathered
                self.items = _copied(self.items, a, b)
                self.group_of = self.group_of[a:b].copy()
            else:
                self.items = self.items.take(live)
                self.group_of = self.group_of[live]
            self.dead = None
        self.size = self.live


class _LaneBlock:
    """A usual block in the lane (one thread, its groups' keys ascending after those of the
    groups kept before it): its groups are runs of rows (``firsts``: each one's first row,
    C's bytes until read, then seen as int64 and searched by bisection), no key made.  Its
    first ``len(pre)`` runs (rows up to ``start``) are not the lane's: one outside any
    iteration, and the end of the newest iteration kept before the lane began (``pre``:
    their keys); its counted runs from ``counted_row``; ``merged``: its first run goes on
    from the block before in the lane.  Its dead rows are its first ``lo`` (``head``
    runs)."""

    __slots__ = ("arrival", "count", "counted_row", "firsts", "head", "items", "live", "lo",
                 "merged", "pre", "size", "start", "tid")

    def __init__(self, items: AttributedOps, n: int, firsts: bytes | memoryview, arrival: int,
                 tid: int, pre: list[_Key], start: int, counted_row: int,
                 merged: bool) -> None:
        self.items = items
        self.firsts: bytes | memoryview | list[int] = firsts
        self.count = len(firsts) >> 3 if isinstance(firsts, bytes) else len(firsts)  # runs
        self.arrival = arrival
        self.tid = tid
        self.pre = pre  # (as many as its first runs not the lane's)
        self.start = start
        self.counted_row = counted_row
        self.merged = merged
        self.head = self.lo = 0
        self.size = self.live = n

    def rows(self) -> memoryview | list[int]:
        """Each run's first row."""
        if isinstance(self.firsts, bytes):
            self.firsts = memoryview(self.firsts).cast("q")
        return self.firsts

    def array(self) -> Int64Array:
        return np.asarray(self.rows(), dtype=np.int64)

    def drop_upto(self, last: _Key) -> _Key | None:
        """Drop its runs before the lane's up to the key ``last`` (the lane drops the
        others); the key of the next one (``None``: none)."""
        head, pre = self.head, self.pre
        while head < len(pre) and pre[head] <= last:
            head += 1
        if head > self.head:
            lo = self.start if head == len(pre) else self.rows()[head]
            self.live -= lo - self.lo
            self.head, self.lo = head, lo
        return pre[head] if head < len(pre) else None

    def live_items(self) -> AttributedOps:
        return _copied(self.items, self.lo, self.size) if self.lo else self.items

    def compact(self) -> None:
        """Its live rows copied, the dead ones freed."""
        lo, head = self.lo, self.head
        if not lo:
            return
        self.firsts = [first - lo for first in self.rows()[head:]]
        self.count -= head
        self.items = _copied(self.items, lo, self.size)
        if head > len(self.pre):  # (its first run gone)
            self.merged = False
        self.pre = self.pre[head:]
        self.start = max(self.start - lo, 0)
        self.head = self.lo = 0
        self.counted_row = max(self.counted_row - lo, 0)
        self.size = self.live

    def whole(self) -> list[tuple[int, int]]:
        """``(tid, iteration end)`` of each iteration whose first part it holds."""
        first = max(self.head, len(self.pre))
        if self.merged and self.head <= len(self.pre):
            first += 1
        ends = self.items.attr.iter_end[self.array()[first:]].tolist()
        return list(zip(repeat(self.tid), ends))

    def general(self) -> tuple[_Block, list[int]]:
        """The same as a :class:`_Block` with its keys made, and its groups' iteration
        ends."""
        firsts, attr = self.array(), self.items.attr
        bounds = firsts.tolist()
        bounds.append(self.size)
        runs = list(map(operator.sub, bounds[1:], bounds[:-1]))
        counted = (attr.counted[firsts] == 1).tolist()
        keys: list[_Key] = list(zip(map(_CLASS.__getitem__, counted),
                                    attr.iteration[firsts].tolist(), repeat(self.tid)))
        keys[:len(self.pre)] = self.pre
        block = _Block(self.items, None, keys, runs, list(accumulate(runs)))
        block.head, block.lo, block.live = self.head, self.lo, self.live
        return block, attr.iter_end[firsts].tolist()


class _Groups:
    """Groups in key order, from ``head``: their keys, rows summed from the first (``cum``,
    ``base`` before it) and the iteration end of each one's first part."""

    __slots__ = ("base", "cum", "ends", "head", "keys", "owners")

    def __init__(self) -> None:
        self.keys: list[_Key] = []
        self.cum: list[int] = []
        self.ends: list[int] = []
        self.owners: list[_Block | _LaneBlock] = []  # (of those outside: each one's block)
        self.head = 0
        self.base = 0  # the rows summed before ``keys[0]``

    def __len__(self) -> int:
        return len(self.keys) - self.head

    def before(self, at: int) -> int:
        """Rows summed before ``keys[at]``."""
        return self.cum[at - 1] if at else self.base

    def append(self, keys: list[_Key], runs: list[int], ends: list[int]) -> None:
        """Groups after every one here."""
        start = self.cum[-1] if self.cum else self.base
        self.keys += keys
        self.cum += accumulate(runs, initial=start)
        del self.cum[-len(runs) - 1]  # (the start)
        self.ends += ends

    def add(self, key: _Key, count: int, owner: _Block | _LaneBlock) -> None:
        """One group outside any iteration after every one here, of block ``owner``."""
        self.keys.append(key)
        self.cum.append((self.cum[-1] if self.cum else self.base) + count)
        self.ends.append(-1)
        self.owners.append(owner)

    def place(self, key: _Key, count: int, end: int) -> None:
        """A group's ``count`` rows in key order (added to the group's if here)."""
        keys, cum = self.keys, self.cum
        at = bisect.bisect_left(keys, key, self.head)
        if at < len(keys) and keys[at] == key:
            cum[at:] = [c + count for c in cum[at:]]
            return
        keys.insert(at, key)
        self.ends.insert(at, end)
        cum.insert(at, self.before(at))
        cum[at:] = [c + count for c in cum[at:]]

    def pop(self, over: int, most: int) -> tuple[int, int]:
        """Drop the first groups until ``over`` rows are gone (at most ``most`` groups):
        how many, and their rows."""
        head, cum = self.head, self.cum
        if over <= 0 or most <= 0 or head == len(cum):
            return 0, 0
        before = cum[head - 1] if head else self.base
        n = min(bisect.bisect_left(cum, before + over, head) - head + 1, len(cum) - head, most)
        self.head = head + n
        return n, cum[head + n - 1] - before

    def forget(self) -> None:
        """Free the dropped groups' room (now and then: each once)."""
        head = self.head
        if head > 64 and head * 2 > len(self.keys):
            self.base = self.cum[head - 1]
            del self.keys[:head], self.cum[:head], self.ends[:head], self.owners[:head]
            self.head = 0


#: ``keeper_runs``' word on a usual buffer: (thread, each run's first row, the first counted
#: run's row (-1: not read), the first run in an iteration, its row, its ordinal, the last
#: run's row, the last ordinal).  (On one thread's buffer whose operations outside any
#: iteration come between its iterations, as a Trainer's extensions launch them, it is
#: five: thread, first iteration's ordinal, and its groups' firsts, rows and each row's.)
_Usual = tuple[int, bytes, int, int, int, int, int, int]
#: A buffer kept whose groups are not made yet: its operations, each group's first row
#: (``bytes`` of native int64 from C, or an array), rows per group (``None``: up to the next
#: group's first row, the groups runs in order), each row's group (``None``: runs), its
#: arrival (the key of its group outside any iteration), its one thread (``None``: look)
#: and, for a usual buffer, C's word on it (``_Usual``).
_Pending = tuple[AttributedOps, bytes | Int64Array, Int64Array | None, Int64Array | None,
                 int, int | None, _Usual | None]


def _copied(items: AttributedOps, a: int, b: int) -> AttributedOps:
    """Rows ``a:b`` of ``items``, copied (a view would keep every row's memory alive)."""
    if isinstance(items, BlockAttributedOps) and (made := items.copied(a, b)) is not None:
        return made
    ops, attr = items.ops, items.attr
    return AttributedOps(
        type(ops)(**{c: getattr(ops, c)[a:b].copy() for c in ops.columns()}),
        type(attr)(**{c: getattr(attr, c)[a:b].copy() for c in attr.columns()}))


class AttributedKeeper:
    """The operations the trace keeps, at most ``limit``, whole iterations first.

    Over the limit, whole groups go, in this order: the operations launched outside any
    iteration (oldest first), warm-up iterations, counted iterations (oldest first); an
    iteration's operations that come after it was dropped are dropped as they come.  So
    every iteration kept holds all its operations (:meth:`complete_iterations`: the
    ``ProfilerStep`` marks the trace keeps), and an evaluation after training never
    pushes the training's iterations out.  Only an iteration alone larger than the limit
    keeps its newest operations, and then counts as incomplete.  Memory: the kept rows,
    and at most as many dropped ones waiting in their blocks (then the deadest blocks'
    live rows are copied).

    A buffer is kept as it comes, with its groups' first rows (found in one C call for the
    usual buffer); its groups are placed only when an eviction or a question needs them
    (:meth:`_settle`), in the order the buffers came.  A group is no object: a key in a
    sorted list with its rows summed (:class:`_Groups`: those outside any iteration, then
    the iterations), and in its blocks' lists of keys.  An eviction finds where the rest
    fits by bisection, then drops every block's groups up to the last key dropped (the
    blocks in a heap by their first key left): in the usual block, a count of rows.

    The lane: the usual buffers (one thread, keys ascending from one buffer to the next and
    above every iteration placed: C says so) are kept as :class:`_LaneBlock`, no key made
    at all; an eviction drops the iterations placed first, then the lane's first runs of
    rows by one bisection of a block's first rows.  So a usual buffer costs the same few
    operations at the limit, whatever its iterations.  Any other buffer with iterations (or
    the lane's newest group to drop) places the lane's groups as above first
    (:meth:`_leave_lane`): the same groups, in the same order.
    """

    def __init__(self, limit: int, native: ModuleType | None = None) -> None:
        self.limit = max(0, limit)
        #: The ``_cupti`` extension (``keeper_runs``: a usual buffer's groups in one call),
        #: or ``None``: NumPy groups every buffer.
        self.native = native if hasattr(native, "keeper_runs") else None
        #: the blocks made (``_settle`` first: buffers may be pending)
        self.blocks: list[_Block | _LaneBlock] = []
        self._pending: list[_Pending] = []
        # the lane (no other iteration kept meanwhile): its blocks, live rows and groups,
        # its newest group's key and rows
        self._lane: deque[_LaneBlock] = deque()
        self._lane_rows = self._lane_groups = self._lane_last_rows = 0
        self._lane_last: _Key | None = None
        self._outside = _Groups()     # outside any iteration: one a buffer at most
        self._iterations = _Groups()  # warm-up, then counted
        self._tids: set[int] = set()  # the threads of the iterations placed
        self._trimmed: set[_Key] = set()  # the groups kept in part (not whole)
        # the blocks with groups kept, by their first such key: (key, arrival, block)
        self._block_heap: list[tuple[_Key, int, _Block | _LaneBlock]] = []
        self._dead_rows = 0  # rows of dropped groups still in blocks
        self._dropped_upto: dict[int, int] = {}  # tid -> its newest iteration dropped
        self._arrivals = 0
        self.kept = 0
        self.dropped = 0
        #: operations dropped, by OUTSIDE / WARMUP / COUNTED
        self.dropped_by = [0, 0, 0]
        #: iterations whose operations were dropped (all, or all but the newest)
        self.dropped_iterations = 0

    def add(self, items: AttributedOps) -> None:
        n = len(items)
        if not n:
            return
        native, limit = self.native, self.limit
        if native is not None and limit:  # the usual: one thread, in order
            kept = self.kept + n
            try:  # (thread, each run's first row, ... as _Usual) or None; the runs'
                # classes read where the lane may take it at once (at the limit)
                if isinstance(items, BlockAttributedOps):  # the C table's rows, read in C
                    found = native.keeper_block_runs(items.block, kept > limit)
                else:
                    attr = items.attr
                    found = native.keeper_runs(
                        (attr.iteration, attr.tid, attr.counted) if kept > limit
                        else (attr.iteration, attr.tid))
            except (ValueError, BufferError):  # not contiguous int64: NumPy's path below
                found = None
            if found is not None and len(found) == 5:  # outside runs between iterations
                if not self._dropped_upto or found[1] > self._dropped_upto.get(found[0], -1):
                    self._keep(items, n, found[2], np.frombuffer(found[3], dtype=np.int64),
                               np.frombuffer(found[4], dtype=np.int64), found[0], None)
                    return  # (the groups np.unique makes below, made in C: no sort)
                found = None
            if found is not None and (  # none late: its first iteration after those dropped
                    not self._dropped_upto or found[4] == n or
                    found[5] > self._dropped_upto.get(found[0], -1)):
                self._arrivals += 1  # (_keep's, in line: the usual buffer's)
                self.kept = kept
                if kept <= limit:
                    self._pending.append((items, found[1], None, None, self._arrivals,
                                          found[0], found))
                elif self._pending or not self._to_lane(items, n, self._arrivals, found):
                    self._pending.append((items, found[1], None, None, self._arrivals,
                                          found[0], found))
                    self._settle()
                    self._evict()
                else:
                    self._evict()
                return
        ordinal, tid = items.attr.iteration, items.attr.tid
        one_thread = bool((tid == tid[0]).all())
        lowest = int(ordinal.min())
        if self._dropped_upto and not (  # late operations of an iteration already dropped
                one_thread and lowest > self._dropped_upto.get(int(tid[0]), -1)):
            if one_thread:
                late = ordinal <= self._dropped_upto.get(int(tid[0]), -1)
            else:
                upto = np.full(n, -1, dtype=np.int64)
                for t in np.unique(tid).tolist():
                    if t in self._dropped_upto:
                        upto[tid == t] = self._dropped_upto[t]
                late = ordinal <= upto
            late &= ordinal >= 0
            if late.any():
                self._count_dropped(items.take(late))
                items = items.take(~late)
                ordinal, tid = items.attr.iteration, items.attr.tid
                n = len(ordinal)
                lowest = int(ordinal.min()) if n else 0
        if not self.limit or not n:
            self._count_dropped(items)
            return
        # each row's group: (thread, iteration), or outside any iteration (ordinal -1)
        if one_thread:
            key = ordinal
        else:
            key = (np.searchsorted(np.unique(tid), tid) << 40) + ordinal
            if lowest < 0:
                key[ordinal < 0] = -1
        change = key[1:] != key[:-1]
        if not change.any() or bool(np.all(key[1:] >= key[:-1])):  # in order: no sort
            bounds = np.empty(int(np.count_nonzero(change)) + 2, dtype=np.int64)
            bounds[0], bounds[-1] = 0, n  # each group's first row, then the end
            bounds[1:-1] = np.flatnonzero(change) + 1
            firsts = bounds[:-1]
            counts: Int64Array = bounds[1:] - firsts  # (np.diff's prepend/append: ~100k)
            group_of: Int64Array | None = None  # runs of rows: made if a group is dropped
        else:
            _uniq, firsts, inverse, counts = np.unique(
                key, return_index=True, return_inverse=True, return_counts=True)
            group_of = np.asarray(inverse, dtype=np.int64).reshape(-1)
        self._keep(items, n, firsts, counts, group_of, None, None)  # (its thread: settled)

    def _keep(self, items: AttributedOps, n: int, firsts: bytes | Int64Array,
              counts: Int64Array | None, group_of: Int64Array | None,
              thread: int | None, usual: _Usual | None) -> None:
        """Keep the ``n`` operations ``items``, its groups at rows ``firsts`` (``bytes``
        of int64 from C), of ``counts`` rows each (``None``: runs up to the next one), each
        row's group ``group_of`` (``None``: the groups are runs of rows, in order), all of
        ``thread`` (``None``: look), ``usual`` C's word on a usual buffer; their groups made
        when needed (at the limit, at once: straight to the lane if it may go there)."""
        self._arrivals += 1
        self.kept += n
        if self.kept <= self.limit:
            self._pending.append((items, firsts, counts, group_of, self._arrivals, thread,
                                  usual))
            return
        if self._pending or usual is None or not self._to_lane(items, n, self._arrivals,
                                                               usual):
            self._pending.append((items, firsts, counts, group_of, self._arrivals, thread,
                                  usual))
            self._settle()
        self._evict()

    def _settle(self) -> None:
        """Make the pending buffers' blocks and place their groups, in the order they came
        (a group already kept: its rows added)."""
        pending, self._pending = self._pending, []
        for items, firsts, counts, group_of, arrival, thread, usual in pending:
            if usual is not None and self._to_lane(items, len(items.attr.iteration), arrival,
                                                   usual):
                continue
            attr = items.attr
            if isinstance(firsts, bytes):
                firsts = np.frombuffer(firsts, dtype=np.int64)
            if counts is None:  # runs: each up to the next one's first row, the last to n
                bounds = firsts.tolist()
                bounds.append(len(attr.iteration))
                runs = list(map(operator.sub, bounds[1:], bounds[:-1]))
            else:
                runs = counts.tolist()
            ordinals = attr.iteration[firsts].tolist()
            if self._lane and max(ordinals) >= 0:
                self._leave_lane()  # (iterations of another order)
            ends = attr.iter_end[firsts].tolist()
            counted = (attr.counted[firsts] == 1).tolist()
            if thread is None:
                run_tids: list[int] = attr.tid[firsts].tolist()
                if group_of is None and run_tids.count(run_tids[0]) == len(run_tids):
                    thread = run_tids[0]  # (runs of one thread's iterations in order)
            tids = run_tids if thread is None else repeat(thread)
            keys: list[_Key] = list(zip(map(_CLASS.__getitem__, counted), ordinals, tids))
            local = 0  # those outside any iteration come first (one run, usually)
            while local < len(ordinals) and ordinals[local] < 0:
                keys[local] = (OUTSIDE, arrival, 0)  # one group a buffer
                local += 1
            cum = None
            if thread is not None and group_of is None:  # one thread, iterations ascending
                if ordinals[-1] >= 0:
                    self._tids.add(thread)
                rest = counted[local:]  # warm-up iterations, then counted ones: in order
                if local <= 1 and (True not in rest or False not in rest[rest.index(True):]):
                    cum = list(accumulate(runs))  # (one run outside any iteration at most)
            else:
                self._tids.update(tid for o, tid in zip(ordinals, attr.tid[firsts].tolist())
                                  if o >= 0)
            block = _Block(items, group_of, keys, runs, cum)
            self.blocks.append(block)
            heapq.heappush(self._block_heap,
                           (keys[0] if cum is not None else min(keys), arrival, block))
            outside = False
            for o, key, count in zip(ordinals, keys, runs):  # outside any iteration
                if o < 0:
                    if outside:  # (runs of several ordinals below 0)
                        self._outside.cum[-1] += count
                    else:
                        self._outside.add(key, count, block)
                    outside = True
            if cum is not None:
                self._place_ascending(keys, runs, ends, local)
            else:
                for o, key, count, end in zip(ordinals, keys, runs, ends):
                    if o >= 0:
                        self._iterations.place(key, count, end)

    def _to_lane(self, items: AttributedOps, n: int, arrival: int, usual: _Usual) -> bool:
        """Keep a usual buffer in the lane if it may go there: its thread the lane's, its
        first key not below the lane's newest (no lane: above every iteration kept, or the
        newest one's end, then the lane's from its next run), one run outside any
        iteration at most."""
        tid, runs_bytes, counted_row, first_run, start, first, last_row, newest = usual
        firsts: bytes | memoryview = runs_bytes
        if first_run > 1 or start == n:
            return False
        if counted_row < 0:  # (C left the runs' classes unread: kept under the limit)
            lane_runs = np.frombuffer(runs_bytes, dtype=np.int64)[first_run:]
            counted = (items.attr.counted[lane_runs] == 1).tolist()
            if True not in counted:
                counted_row = n
            elif False in counted[counted.index(True):]:  # a warm-up run after a counted one
                return False
            else:
                counted_row = int(lane_runs[counted.index(True)])
        key = (COUNTED if counted_row == start else WARMUP, first, tid)
        runs = (len(firsts) >> 3) - first_run  # the lane's
        outside_rows = start
        pre: list[_Key] = [(OUTSIDE, arrival, 0)] if first_run else []
        last, merged = self._lane_last, False
        if last is not None:
            merged = key == last
            if tid != last[2] or not (merged or key > last):
                return False
        elif self._iterations.head < len(keys := self._iterations.keys) and \
                not key > keys[-1]:  # the newest iteration kept goes on: its rows
            if key != keys[-1] or runs == 1:
                return False
            view = memoryview(firsts).cast("q")
            self._iterations.cum[-1] += view[first_run + 1] - start
            start, runs, firsts = view[first_run + 1], runs - 1, view
            pre.append(key)
        self._lane_last = (COUNTED if counted_row < n else WARMUP, newest, tid)
        if merged and runs == 1:  # the newest group goes on
            self._lane_last_rows += n - start
        else:
            self._lane_last_rows = n - last_row
        self._lane_groups += runs - merged
        self._lane_rows += n - start
        block = _LaneBlock(items, n, firsts, arrival, tid, pre, start, counted_row, merged)
        self.blocks.append(block)
        self._lane.append(block)
        if first_run:  # (_Groups.add)
            outside = self._outside
            outside.keys.append(pre[0])
            outside.cum.append((outside.cum[-1] if outside.cum else outside.base) +
                               outside_rows)
            outside.ends.append(-1)
            outside.owners.append(block)
        if len(pre) > first_run:  # (dropped with the iteration kept before)
            heapq.heappush(self._block_heap, (pre[-1], arrival, block))
        return True

    def _leave_lane(self) -> None:
        """Place the lane's groups as any block's (its blocks made :class:`_Block`)."""
        made: dict[int, _Block] = {}
        heap = [entry for entry in self._block_heap if not isinstance(entry[2], _LaneBlock)]
        for lane_block in self._lane:
            block, ends = lane_block.general()
            made[id(lane_block)] = block
            self._tids.add(lane_block.tid)
            self._place_ascending(block.keys, block.runs, ends,
                                  max(block.head, len(lane_block.pre)))
            heap.append((block.keys[block.head], lane_block.arrival, block))
        heapq.heapify(heap)
        self._block_heap = heap
        self.blocks = [made.get(id(b), b) for b in self.blocks]
        owners = self._outside.owners
        owners[:] = [made.get(id(b), b) for b in owners]
        self._lane.clear()
        self._lane_rows = self._lane_groups = self._lane_last_rows = 0
        self._lane_last = None

    def _place_ascending(self, keys: list[_Key], runs: list[int], ends: list[int],
                         first: int) -> None:
        """Place a block's iterations, ascending from ``keys[first]``."""
        groups = self._iterations
        if first == len(keys):
            return
        if len(groups) and keys[first] <= groups.keys[-1]:
            if keys[first] == groups.keys[-1]:  # the newest iteration goes on
                groups.cum[-1] += runs[first]
                first += 1
            else:  # (not after every one kept: each placed)
                for key, count, end in zip(keys[first:], runs[first:], ends[first:]):
                    groups.place(key, count, end)
                return
        if first < len(keys):
            groups.append(keys[first:], runs[first:], ends[first:])

    def _count_dropped(self, items: AttributedOps) -> None:
        attr = items.attr
        self.dropped += len(items)
        self.dropped_by[OUTSIDE] += int((attr.iteration < 0).sum())
        self.dropped_by[WARMUP] += int(((attr.iteration >= 0) & (attr.counted != 1)).sum())
        self.dropped_by[COUNTED] += int(((attr.iteration >= 0) & (attr.counted == 1)).sum())

    def _evict(self) -> None:
        """Drop the groups first in line until the rest fits (then their blocks' rows): those
        outside any iteration, the iterations placed, the lane's."""
        outside, iterations = self._outside, self._iterations
        over = self.kept - self.limit
        most = (len(outside.keys) - outside.head + len(iterations.keys) - iterations.head +
                self._lane_groups - 1)  # (one group left: trimmed)
        n_out, gone = outside.pop(over, most)
        self.dropped_by[OUTSIDE] += gone
        if n_out == 1:  # (the usual: that of the buffer just come)
            block = outside.owners[outside.head - 1]
            live = block.live
            block.drop_upto(outside.keys[outside.head - 1])
            self._dead_rows += live - block.live
            if not block.live:
                self._free(1)
        elif n_out:
            self._drop_outside(outside.head - n_out)
        most -= n_out
        if gone < over and iterations.head < len(iterations.keys):
            n_it, gone_it = self._pop_placed(over - gone, most)
            gone += gone_it
            most -= n_it
        if gone < over and self._lane:
            if over - gone > self._lane_rows - self._lane_last_rows:
                self._leave_lane()  # (its newest group to drop or trim)
                gone += self._pop_placed(over - gone, most)[1]
            else:
                gone += self._pop_lane(over - gone)
        self.kept -= gone
        self.dropped += gone
        if gone < over:
            self._trim(over - gone)
        if self._dead_rows > self.limit:
            self._compact()

    def _pop_placed(self, need: int, most: int) -> tuple[int, int]:
        """Drop the first iterations placed until ``need`` rows are gone (``most`` at most):
        how many, and their rows."""
        iterations = self._iterations
        first = iterations.head
        n, gone = iterations.pop(need, most)
        if n:
            self._drop_upto(self._iterations_dropped(first, gone))
            if iterations.head > 64:
                iterations.forget()
        return n, gone

    def _drop_outside(self, first: int) -> None:
        """Drop the rows of the groups outside any iteration dropped, from ``first``."""
        outside, died, dead = self._outside, 0, 0
        for key, block in zip(outside.keys[first:outside.head],
                              outside.owners[first:outside.head]):
            live = block.live
            block.drop_upto(key)  # (its entry in the heap, if any, stays: then dropped)
            dead += live - block.live
            died += not block.live
        self._dead_rows += dead
        if outside.head > 64:
            outside.forget()
        if died:
            self._free(died)

    def _pop_lane(self, need: int) -> int:
        """Drop the lane's first groups until ``need`` rows are gone (never its newest
        group): the rows gone."""
        lane = self._lane
        gone = warm = groups = died = 0
        while True:
            block = lane[0]
            lo, size, first = block.lo, block.size, block.head
            if lo + need >= size:  # all its runs left
                head, end = block.count, size
            else:
                firsts = block.firsts
                if isinstance(firsts, bytes):
                    firsts = block.rows()
                head = bisect.bisect_left(firsts, lo + need, first)  # the first run left
                end = firsts[head] if head < len(firsts) else size
            counted_row = block.counted_row
            if counted_row > lo:
                warm += (end if end < counted_row else counted_row) - lo
            groups += head - first
            if block.merged and first == len(block.pre):  # (its first run: the group before)
                groups -= 1
            block.lo, block.head = end, head
            gone += end - lo
            need -= end - lo
            if end < size:
                block.live -= end - lo
                break
            block.live = 0
            died += 1
            lane.popleft()
            if need <= 0:
                if not lane[0].merged:
                    break
                need = 1  # the rest of its group goes too
        by, upto = self.dropped_by, self._dropped_upto
        by[WARMUP] += warm
        by[COUNTED] += gone - warm
        self.dropped_iterations += groups
        self._lane_groups -= groups
        self._lane_rows -= gone
        self._dead_rows += gone
        ordinal = block.items.attr.iteration.item(end - 1)  # the last dropped
        if ordinal > upto.get(block.tid, -1):
            upto[block.tid] = ordinal
        if died == 1 and not self.blocks[0].live:  # (_free's usual, in line)
            self._dead_rows -= self.blocks[0].size
            del self.blocks[0]
        elif died:
            self._free(died)
        return gone

    def _iterations_dropped(self, first: int, gone: int) -> _Key:
        """Count the iterations dropped, ``keys[first:head]`` of ``gone`` rows: by class,
        whole or not, each thread's newest; the last one's key."""
        groups, by, upto = self._iterations, self.dropped_by, self._dropped_upto
        keys, head = groups.keys, groups.head
        counted = bisect.bisect_left(keys, _FIRST_COUNTED, first, head)
        warm = groups.before(counted) - groups.before(first)
        by[WARMUP] += warm
        by[COUNTED] += gone - warm
        whole = head - first
        if self._trimmed:
            for key in keys[first:head]:
                if key in self._trimmed:
                    self._trimmed.discard(key)
                    whole -= 1
        self.dropped_iterations += whole
        if len(self._tids) == 1:  # one thread: each class's last key is its newest
            newest = max(keys[i][1] for i in {counted - 1, head - 1} if i >= first)
            tid = keys[head - 1][2]
            if newest > upto.get(tid, -1):
                upto[tid] = newest
        else:
            for _cls, order, tid in keys[first:head]:
                if order > upto.get(tid, -1):
                    upto[tid] = order
        return keys[head - 1]

    def _drop_upto(self, last: _Key) -> None:
        """Drop every block's groups up to the key ``last`` (all of them dropped)."""
        heap, died, dead = self._block_heap, 0, 0
        while heap and heap[0][0] <= last:
            _first, arrival, block = heapq.heappop(heap)
            if not block.live:  # (freed by a trim)
                continue
            live = block.live
            left = block.drop_upto(last)
            dead += live - block.live
            if not block.live:
                died += 1
            elif left is not None:
                heapq.heappush(heap, (left, arrival, block))
        self._dead_rows += dead
        if died:
            self._free(died)

    def _free(self, died: int) -> None:
        """Forget the ``died`` blocks whose rows are all dead (the oldest, usually)."""
        blocks = self.blocks
        if died == 1 and not blocks[0].live:  # (the usual)
            self._dead_rows -= blocks[0].size
            del blocks[0]
            return
        for block in blocks[:died]:
            if block.live:
                break
        else:
            for block in blocks[:died]:
                self._dead_rows -= block.size
            del blocks[:died]
            return
        for block in blocks:
            if not block.live:
                self._dead_rows -= block.size
        self.blocks = [block for block in blocks if block.live]

    def _trim(self, count: int) -> None:
        """Drop the oldest ``count`` rows of the one group left."""
        groups = self._outside if len(self._outside) else self._iterations
        key = groups.keys[groups.head]
        if key[0] != OUTSIDE:
            if key not in self._trimmed:
                self.dropped_iterations += 1
            self._trimmed.add(key)
        self.kept -= count
        self.dropped += count
        self.dropped_by[key[0]] += count
        groups.cum[groups.head] -= count
        self._dead_rows += count
        for block in self.blocks:  # its rows: every live row left, oldest block first
            if count <= 0:
                break
            if not isinstance(block, _Block):  # (none: a lane keeps its newest group)
                continue
            block.masked()
            if block.dead is None:
                block.dead = np.zeros(block.size, dtype=bool)
            live = np.flatnonzero(~block.dead)
            n = min(count, len(live))
            block.dead[live[:n]] = True
            block.live -= n
            count -= n
        died = sum(not block.live for block in self.blocks)
        if died:
            self._free(died)

    def _compact(self) -> None:
        """Copy the live rows of the deadest blocks until at most half the limit's rows
        are dead (each row copied once per ``limit / 2`` rows dropped, at most)."""
        for block in sorted(self.blocks, key=lambda b: b.live - b.size):
            if self._dead_rows * 2 <= self.limit:
                break
            self._dead_rows -= block.size - block.live
            block.compact()

    def records(self) -> AttributedOps:
        self._settle()
        return AttributedOps.concat([b.live_items() for b in self.blocks])

    def complete_iterations(self) -> set[tuple[int, int]]:
        """``(tid, end of the iteration range)`` of each iteration kept whole."""
        self._settle()
        groups = self._iterations
        whole = {(key[2], end) for key, end in zip(groups.keys[groups.head:],
                                                   groups.ends[groups.head:])
                 if key not in self._trimmed}
        for block in self._lane:
            whole.update(block.whole())
        return whole

    def note(self) -> str | None:
        """What the trace left out, in one line (``None``: nothing)."""
        if not self.dropped:
            return None
        outside = self.dropped_by[OUTSIDE]
        within = self.dropped_by[WARMUP] + self.dropped_by[COUNTED]
        parts = []
        if within:
            parts.append(f"{figures.count(self.dropped_iterations)} iterations' "
                         f"({figures.count(within)})")
        if outside:
            parts.append(f"{figures.count(outside)} outside any iteration")
        kept = len(self.complete_iterations())
        return (f"the trace keeps {figures.count(kept)} whole iterations' GPU operations "
                f"(record limit); left out: {', '.join(parts)}; the figures count all")


class GpuAnalysis:
    """Attribution + figures + what the trace keeps, for one process."""

    def __init__(self, clock: ClockMap, names: NameTable, warmup_skip: int = 0, *,
                 record_limit: int = 50_000, identity_threads: bool = False,
                 loop_tid: int | None = None, limits: Limits | None = None,
                 keep_outside: bool = True, locate: LocateKernel | None = None) -> None:
        lim = limits if limits is not None else Limits()
        #: Whether the trace keeps operations launched outside any iteration (a capture
        #: window keeps only its iterations': what runs after it would push them out).
        self.keep_outside = keep_outside
        self.names = names
        self.attributor = LaunchAttributor(
            clock, warmup_skip, identity_threads=identity_threads,
            max_pending=lim.max_pending, max_api=lim.max_api, max_ranges=lim.max_ranges,
            locate=locate)
        self.builder = GpuFigureBuilder(self.attributor.link_keys, names, warmup_skip,
                                        loop_tid=loop_tid, max_pool=lim.max_pool,
                                        max_kept=lim.max_kept,
                                        native=self.attributor.native)
        self.keeper = AttributedKeeper(record_limit, self.attributor.native)
        self.finished = False

    def _take(self, items: AttributedOps) -> None:
        """Attributed operations to the figures and the trace (each passes over none)."""
        self.builder.add(items)
        self.keeper.add(items if self.keep_outside else items.take(items.attr.iteration >= 0))

    def add_name(self, index: int, name: str, category: str) -> None:
        self.attributor.add_name(index, name, category)

    def set_clock(self, clock: ClockMap) -> None:
        """The clock map for the activity fed from now on (live: refitted as pairs come)."""
        self.attributor.clock = clock

    def map_thread(self, cupti_thread: int, tid: int) -> None:
        self._take(self.attributor.map_thread(cupti_thread, tid))

    def feed_ranges(self, tid: int, rows: RangeRows) -> None:
        self._take(self.attributor.feed_ranges(tid, rows))

    def thread_finished(self, tid: int) -> None:
        self._take(self.attributor.thread_finished(tid))

    def feed_activity(self, batch: ActivityBatch) -> None:
        self._take(self.attributor.feed_activity(batch))

    def advance(self, watermark_ns: int) -> None:
        """No operation starting before ``watermark_ns`` (agent ns) will arrive any more."""
        self.builder.advance(watermark_ns)

    def finish(self) -> GpuFigures:
        """Attribute what still waits and return the figures (once; later calls repeat)."""
        if not self.finished:
            self._take(self.attributor.finish())
            self.finished = True
            self._figures = self.builder.result(self.attributor.statuses(),
                                                self.attributor.clock.to_dict())
        return self._figures

    def records(self) -> AttributedOps:
        """The attributed operations kept for the trace (at most ``record_limit``, whole
        iterations first: :class:`AttributedKeeper`)."""
        return self.keeper.records()

    def trace_note(self) -> str | None:
        """What the trace left out of the operations, one line (``None``: nothing)."""
        return self.keeper.note()

    @property
    def link_keys(self) -> list[str]:
        return self.attributor.link_keys

    @property
    def range_names(self) -> list[str]:
        return self.attributor.range_names
