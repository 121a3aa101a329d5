"""The trace keeper as it was before its groups became keys in sorted lists (one object and
one heap entry a group, NumPy's grouping): the reference its successor must match, group for
group, over many buffers at its limit."""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

from chainer_autoprof.analysis.gpu_analysis import COUNTED, OUTSIDE, WARMUP
from chainer_autoprof.analysis.gpu_attribution import AttributedOps
from chainer_autoprof.common import figures

Int64Array = npt.NDArray[np.int64]


class _Block:
    """A block of kept operations as it came, each row's group (an index in ``groups``);
    rows of dropped groups stay, marked dead, until half of the block is dead, then the
    live rows are copied.  A block whose groups came as runs keeps their lengths
    (``runs``) and makes ``group_of`` only when a group of it is dropped."""

    __slots__ = ("_group_of", "dead", "groups", "items", "live", "runs", "size")

    def __init__(self, items: AttributedOps, group_of: Int64Array | None,
                 groups: list[_Group], runs: Int64Array) -> None:
        self.items = items
        self._group_of = group_of
        self.runs = runs
        self.groups = groups
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

    def rows_of(self, locals_: list[int]) -> npt.NDArray[np.bool_]:
        """Whether each row is of one of the groups ``locals_``: by a table of the block's
        groups (np.isin: ~40k instructions), repeated over its runs where it came so."""
        if self._group_of is not None and len(locals_) == 1:
            return np.equal(self._group_of, locals_[0])
        gone = np.zeros(len(self.groups), dtype=bool)
        gone[locals_] = True
        if self._group_of is None:  # runs, as they came (its rows never copied)
            return np.repeat(gone, self.runs)
        return gone[self._group_of]


class _Group:
    """The kept operations of one iteration of one thread (or one block's operations outside
    any iteration): ``parts``, each a block and the group's index there, oldest first."""

    __slots__ = ("complete", "iter_end", "key", "parts", "rows")

    def __init__(self, key: tuple[int, int, int], iter_end: int,
                 first: tuple[_Block, int], rows: int) -> None:
        self.key = key                   # (OUTSIDE/WARMUP/COUNTED, ordinal or arrival, tid)
        self.iter_end = iter_end
        self.parts: list[tuple[_Block, int]] = [first]
        self.rows = rows
        self.complete = True             # none of its operations dropped


#: A buffer kept whose groups are not made yet: its operations, each group's first row
#: (``bytes`` of native int64 from C, or an array), rows per group (``None``: up to the next
#: group's first row, the groups runs in order), each row's group (``None``: runs) and its
#: arrival (the key of its group outside any iteration).
_Pending = tuple[AttributedOps, bytes | Int64Array, Int64Array | None, Int64Array | None,
                 int]


def _copied(items: AttributedOps, a: int, b: int) -> AttributedOps:
    """Rows ``a:b`` of ``items``, copied (a view would keep every row's memory alive)."""
    ops, attr = items.ops, items.attr
    return AttributedOps(
        type(ops)(**{c: getattr(ops, c)[a:b].copy() for c in ops.columns()}),
        type(attr)(**{c: getattr(attr, c)[a:b].copy() for c in attr.columns()}))


class ReferenceKeeper:
    """The operations the trace keeps, at most ``limit``, whole iterations first.

    Over the limit, whole groups go, in this order: the operations launched outside any
    iteration (oldest first), warm-up iterations, counted iterations (oldest first); an
    iteration's operations that come after it was dropped are dropped as they come.  So
    every iteration kept holds all its operations (:meth:`complete_iterations`: the
    ``ProfilerStep`` marks the trace keeps), and an evaluation after training never
    pushes the training's iterations out.  Only an iteration alone larger than the limit
    keeps its newest operations, and then counts as incomplete.  Memory: the kept rows,
    and at most as many dropped ones waiting in half-live blocks.

    A buffer is kept as it comes, with its groups' first rows (found in one C call for the
    usual buffer); its groups are made (a Python object and a heap entry each, some
    thousands of instructions) only when an eviction or a question needs them
    (:meth:`_settle`), in the order the buffers came: the same groups as made at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        #: the blocks and groups made (``_settle`` first: buffers may be pending)
        self.blocks: list[_Block] = []
        self.groups: dict[tuple[int, int, int], _Group] = {}
        self._pending: list[_Pending] = []
        self._heap: list[tuple[int, int, int]] = []
        self._dropped_upto: dict[int, int] = {}  # tid -> its newest iteration dropped
        self._arrivals = 0
        self.kept = 0
        self.dropped = 0
        #: operations dropped, by OUTSIDE / WARMUP / COUNTED
        self.dropped_by = [0, 0, 0]
        #: iterations whose operations were dropped (all, or all but the newest)
        self.dropped_iterations = 0

    def add(self, items: AttributedOps) -> None:
        ordinal, tid = items.attr.iteration, items.attr.tid
        n = len(ordinal)
        if not n:
            return
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
        self._keep(items, n, firsts, counts, group_of)

    def _keep(self, items: AttributedOps, n: int, firsts: bytes | Int64Array,
              counts: Int64Array | None, group_of: Int64Array | None) -> None:
        """Keep the ``n`` operations ``items``, its groups at rows ``firsts`` (``bytes``
        of int64 from C), of ``counts`` rows each (``None``: runs up to the next one), each
        row's group ``group_of`` (``None``: the groups are runs of rows, in order); their
        groups made when needed."""
        self._arrivals += 1
        self._pending.append((items, firsts, counts, group_of, self._arrivals))
        self.kept += n
        if self.kept > self.limit:
            self._settle()
            self._evict()

    def _settle(self) -> None:
        """Make the pending buffers' blocks and groups, in the order they came."""
        pending, self._pending = self._pending, []
        for items, firsts, counts, group_of, arrival in pending:
            attr = items.attr
            if isinstance(firsts, bytes):
                firsts = np.frombuffer(firsts, dtype=np.int64)
            if counts is None:  # runs: each up to the next one's first row, the last to n
                counts = np.empty(len(firsts), dtype=np.int64)
                counts[:-1] = firsts[1:] - firsts[:-1]
                counts[-1] = len(attr.iteration) - firsts[-1]
            groups: list[_Group] = []
            block = _Block(items, group_of, groups, counts)
            made, heap, push = self.groups, self._heap, heapq.heappush
            for local, (o, c, t, end, rows) in enumerate(zip(
                    attr.iteration[firsts].tolist(), attr.counted[firsts].tolist(),
                    attr.tid[firsts].tolist(), attr.iter_end[firsts].tolist(),
                    counts.tolist())):
                gkey = ((OUTSIDE, arrival, 0) if o < 0 else
                        (COUNTED if c == 1 else WARMUP, o, t))
                group = made.get(gkey)
                if group is None:
                    group = made[gkey] = _Group(gkey, end, (block, local), rows)
                    push(heap, gkey)
                else:
                    group.parts.append((block, local))
                    group.rows += rows
                groups.append(group)
            self.blocks.append(block)

    def _count_dropped(self, items: AttributedOps) -> None:
        attr = items.attr
        self.dropped += len(items)
        self.dropped_by[OUTSIDE] += int((attr.iteration < 0).sum())
        self.dropped_by[WARMUP] += int(((attr.iteration >= 0) & (attr.counted != 1)).sum())
        self.dropped_by[COUNTED] += int(((attr.iteration >= 0) & (attr.counted == 1)).sum())

    def _evict(self) -> None:
        """Drop the groups first in line until the rest fits (then free their rows)."""
        victims: dict[int, tuple[_Block, list[int]]] = {}
        groups, heap, upto, by = self.groups, self._heap, self._dropped_upto, self.dropped_by
        over, gone = self.kept - self.limit, 0  # (counted into kept and dropped at the end)
        while over > 0:
            if len(groups) == 1:  # alone larger than the limit: its newest rows stay
                self.kept -= gone
                self.dropped += gone
                gone = 0
                self._trim(groups[heap[0]], over)
                break
            group = groups.pop(heapq.heappop(heap))
            for block, local in group.parts:
                victim = victims.get(id(block))
                if victim is None:
                    victim = victims[id(block)] = (block, [])
                victim[1].append(local)
            group.parts = []  # no cycle left for the collector (a block's arrays in it)
            cls, order, tid = group.key
            rows = group.rows
            over -= rows
            gone += rows
            by[cls] += rows
            if cls != OUTSIDE:
                if group.complete:
                    self.dropped_iterations += 1
                if order > upto.get(tid, -1):
                    upto[tid] = order
        self.kept -= gone
        self.dropped += gone
        for block, locals_ in victims.values():
            dead = block.rows_of(locals_)
            if block.dead is not None:  # a group's rows die once: the others' stay
                dead |= block.dead
            block.live = block.size - int(np.count_nonzero(dead))
            block.dead = dead
        self._compact([block for block, _ in victims.values()])

    def _trim(self, group: _Group, count: int) -> None:
        """Drop the oldest ``count`` rows of ``group``."""
        if group.key[0] != OUTSIDE and group.complete:
            self.dropped_iterations += 1
        group.complete = False
        self.kept -= count
        self.dropped += count
        self.dropped_by[group.key[0]] += count
        group.rows -= count
        touched = []
        while count > 0:
            block, local = group.parts[0]
            if block.dead is None:
                block.dead = np.zeros(block.size, dtype=bool)
            rows = np.flatnonzero((block.group_of == local) & ~block.dead)
            n = min(count, len(rows))
            block.dead[rows[:n]] = True
            block.live -= n
            count -= n
            touched.append(block)
            if n == len(rows):
                group.parts.pop(0)
        self._compact(touched)

    def _compact(self, touched: list[_Block]) -> None:
        """Free the blocks whose rows are all dead, copy the live rows of those half dead."""
        if any(not block.live for block in touched):
            self.blocks = [block for block in self.blocks if block.live]
        for block in touched:
            if not block.live:
                block.groups = []
            elif block.live * 2 < block.size and block.dead is not None:
                live = np.flatnonzero(~block.dead)
                a, b = int(live[0]), int(live[-1]) + 1
                if b - a == len(live):  # one run of rows (the usual): copied, not gathered
                    block.items = _copied(block.items, a, b)
                    block.group_of = block.group_of[a:b].copy()
                else:
                    block.items = block.items.take(live)
                    block.group_of = block.group_of[live]
                block.dead = None
                block.size = len(live)

    def records(self) -> AttributedOps:
        self._settle()
        return AttributedOps.concat([b.items if b.dead is None else b.items.take(~b.dead)
                                     for b in self.blocks])

    def complete_iterations(self) -> set[tuple[int, int]]:
        """``(tid, end of the iteration range)`` of each iteration kept whole."""
        self._settle()
        return {(g.key[2], g.iter_end) for g in self.groups.values()
                if g.key[0] != OUTSIDE and g.complete}

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


def attributed_ops(iteration: object, first_corr: int, tid: object, counted_from: int, *,
                   end_scale: int = 1000, end_offset: int = 0,
                   first_start: int | None = None) -> AttributedOps:
    """Attributed operations for the keeper, one per entry of ``iteration`` (its ordinal,
    -1: none): correlation ids from ``first_corr`` on, starts from ``first_start`` (default
    the same), launched by ``tid`` (one or each), counted from iteration ``counted_from``,
    each iteration ending at ``end_scale * ordinal + end_offset``."""
    from chainer_autoprof.analysis.gpu_attribution import Attribution
    from chainer_autoprof.common.gpu_records import GpuOps

    it = np.asarray(iteration, dtype=np.int64)
    n = len(it)
    start = (first_corr if first_start is None else first_start) + np.arange(n)
    ops = GpuOps.from_columns(n, {"kind": np.zeros(n), "start": start, "end": start + 1,
                                  "correlation": first_corr + np.arange(n)})
    tids = np.empty(n, dtype=np.int64)
    tids[:] = tid  # one thread, or each row's (a column of its own: contiguous, writable)
    attr = Attribution.from_columns(n, {
        "tid": tids, "iteration": it,
        "iter_end": np.where(it >= 0, end_scale * it + end_offset, -1),
        "counted": (it >= counted_from).astype(np.int64)})
    return AttributedOps(ops, attr)


def long_run_buffers(seed: int, count: int, size: int = 60,
                     extensions: bool = False) -> list[AttributedOps]:
    """``count`` buffers of a long training run as CUPTI cuts them (``size`` operations or
    so each, iterations of 20 to 40 going on from one buffer to the next): start-up
    operations outside any iteration, three warm-up iterations, then now and then an
    evaluation outside any iteration, late operations of an old iteration, a second
    thread's buffer, a buffer out of order, and at the end one iteration larger than any
    limit under 400.  ``extensions``: after most iterations, up to three operations outside
    any (a Trainer's extensions, e.g. LogReport summing the reported values on the GPU)."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[int, int]] = [(-1, 1)] * 13  # (iteration, thread)
    for i in range(count * size // 30):
        rows += [(i, 1)] * int(rng.integers(20, 41))
        if extensions:
            rows += [(-1, 1)] * int(rng.integers(0, 4))
        if i % 40 == 39:
            rows += [(-1, 1)] * int(rng.integers(5, 90))  # an evaluation
    buffers, at, corr = [], 0, 0
    for turn in range(count):
        if turn == count - 1:
            cut = [(rows[at - 1][0] + 1, 1)] * 400
        elif turn % 17 == 16:  # an old iteration's late operations
            cut = [(max(0, rows[at - 1][0] - 12), 1)] * 5
        elif turn % 23 == 22:  # another thread, its iterations in order
            cut = [(-1, 2)] * 3 + [(rows[at - 1][0], 2)] * 9
        else:
            n = int(rng.integers(size // 2, size * 3 // 2))
            cut, at = rows[at:at + n], at + n
            if turn % 29 == 28:  # out of order
                cut = cut[::-1]
        buffers.append(attributed_ops([r[0] for r in cut], corr, [r[1] for r in cut], 3,
                                      end_offset=7))
        corr += len(cut)
    return buffers


def keeper_state(keeper: object) -> tuple[object, ...]:
    """What a keeper says: the trace's operations, its counts, whole iterations and note."""
    kept = keeper.records()  # type: ignore[attr-defined]
    return (kept.ops.correlation.tolist(), kept.attr.iteration.tolist(),
            keeper.kept, keeper.dropped, list(keeper.dropped_by),  # type: ignore[attr-defined]
            keeper.dropped_iterations,  # type: ignore[attr-defined]
            keeper.complete_iterations(), keeper.note())  # type: ignore[attr-defined]
