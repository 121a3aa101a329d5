"""Events: begin/end of named ranges on a thread, and the iteration state machine.

Patches call the :class:`Tracer`; the tracer applies the policies (sync level,
capture window) and hands each range to the sinks.  Nothing here knows Chainer
or NVTX.

Hot-path contract: a range is a :class:`RangeInfo` created once per distinct
name (attributes for every sink built then, not per call).  ``begin`` returns
a token that must be passed to ``end`` (``None`` when nothing was emitted, so
``end(None)`` is a cheap no-op).

``begin``, ``end`` and ``state`` are the tracer's ``core``, made by the hot
path's implementation (:mod:`.hotpath`: in C, or its pure-Python twin), on
the same ThreadState objects (``ts.stack`` stays a list of ``(RangeInfo,
t0)`` tuples, outermost first).  The core calls each sink for the ranges of
the categories it wants (its ``categories``; every one by default).

Bounds: at most :data:`MAX_RANGE_NAMES` names are kept (a program that puts a
step number into an ``annotate()`` name would otherwise grow them forever);
a name beyond gets a RangeInfo for that call only, recorded under one
:data:`OVERFLOW_NAME` per category (NVTX still shows it).  A thread's state
goes when the thread ends, and what it left open ends then, on that thread
(:meth:`Tracer.thread_ended`).

Exit: ranges still open on other threads when the process ends are ended in
the recorder's view at the exit time; NVTX ranges can only be popped by the
thread that pushed them, so each such thread pops its own at its next
instrumented call, while the exiting thread waits a little
(:meth:`Tracer.close`, :meth:`Tracer.wait_for_threads`).
"""

from __future__ import annotations

import os
import threading
import weakref
from time import monotonic, perf_counter_ns, sleep
from typing import TYPE_CHECKING, Callable, Protocol

from ..common import names
from . import hotpath
from .policies import CaptureWindow, SyncPolicy
from .ranges import RangeInfo as RangeInfo
from .ranges import ThreadState as ThreadState

if TYPE_CHECKING:
    from ..common.typedefs import Facts

#: Distinct range names kept (each with its attributes for every sink, built once).
MAX_RANGE_NAMES = 4096
#: What the ranges beyond :data:`MAX_RANGE_NAMES` names are recorded as (per category).
OVERFLOW_NAME = "(other names)"
#: Names of ended threads remembered for the trace's thread tracks.
MAX_ENDED_THREAD_NAMES = 4096
#: After a thread's state ended on that thread (its teardown), for how long a state it asks
#: for again is taken as its teardown's: a thread-local's finalizer calling a Link (seconds).
TEARDOWN_S = 1.0
#: Threads in their teardown remembered at once (the newest).
MAX_TORN_DOWN = 64
#: At exit, how long other threads get to end their open ranges themselves (seconds).
CLOSE_GRACE_S = 0.05
#: At most how long the exit waits for threads ending their open ranges in the recorder.
RECORDING_WAIT_S = 1.0
#: At exit, with other threads but none inside a range, how long they get to finish a range's
#: end that is under way (seconds).
IN_FLIGHT_S = 0.01
#: A thread's entry in ``Tracer._closing`` while it ends its open ranges at exit.
_POPPING = "popping"


class SinkBasics(Protocol):
    """What every sink has (:class:`Sink`'s other parts, ``begin``/``end`` too, are looked up
    with ``getattr``: a sink may leave them to its native part, or time only)."""

    def prepare(self, info: RangeInfo) -> None: ...
    def close(self, tracer: Tracer) -> None: ...


class Sink(SinkBasics, Protocol):
    """Where ranges go.  ``prepare`` runs once per RangeInfo, off the hot path.

    Optional: ``categories`` (the categories of the ranges it is called for;
    absent or None: every one), ``timed = False`` (it ignores ``t0``/``t1``),
    ``native`` (a part made by the hot path's implementation, its NVTX domain
    or recorder hook, which the native core runs in C instead of calling
    ``begin``/``end``); ``prepare_transient(info)`` for a name beyond
    :data:`MAX_RANGE_NAMES` (nothing may be cached for it); ``abandon(ts,
    entries, end_ns)`` ends, in the sink's own view and from any thread, ranges
    their thread will never end (it ended, or the process is ending; every open
    entry of ``ts``, whatever its category): a sink without it is one whose
    ranges only their own thread can end (NVTX); ``thread_ended(ts)``;
    ``reset_after_fork``.
    """

    def begin(self, info: RangeInfo, ts: ThreadState) -> None: ...
    def end(self, info: RangeInfo, t0: int, t1: int, ts: ThreadState) -> None: ...


class _ThreadEnd:
    """Kept in a thread's locals: dropped when the thread ends, it says so."""

    __slots__ = ("tracer", "ts")

    def __init__(self, tracer: Tracer, ts: ThreadState) -> None:
        self.tracer = weakref.ref(tracer)
        self.ts = ts

    def __del__(self) -> None:
        tracer = self.tracer()
        if tracer is not None:
            try:
                tracer.thread_ended(self.ts)
            except Exception:  # noqa: BLE001
                pass  # a thread's teardown: nowhere to report to


class Tracer:
    """Turns begin/end calls into sink calls, under the sync and window policies."""

    def __init__(self, granularity_level: int, sync: SyncPolicy,
                 window: CaptureWindow | None = None, sinks: list[SinkBasics] | None = None,
                 clock: Callable[[], int] = perf_counter_ns,
                 implementation: hotpath.Implementation | None = None) -> None:
        self.granularity_level = granularity_level
        self.sync = sync
        self.window = window
        self.clock = clock
        self.sinks: list[SinkBasics] = []
        self._timed = False  # a sink reads t0/t1: read the clock (else both are 0)
        self.infos: list[RangeInfo] = []
        self._by_key: dict[tuple[str, str], RangeInfo] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # each thread's _ThreadEnd (its state is the core's)
        self.states: dict[int, ThreadState] = {}
        self.ended_names: dict[int, str] = {}  # names of ended threads (the newest)
        self._torn_down: dict[tuple[int, int], float] = {}  # (tid, ident) -> when it ended
        # threads still to unwind at exit: True, False (nothing open) or _POPPING
        self._closing: dict[ThreadState, bool | str] | None = None
        self._unrecorded: dict[ThreadState, bool] = {}  # ...whose ranges the recorder awaits
        self._unwound = threading.Event()
        self.iterations = 0           # iterations begun in this process
        #: Run facts: batch_size... seen by patches; ``iterations`` begun (the record's copy).
        self.facts: Facts = {"iterations": 0}
        #: Told of each thread's new state, on that thread, once (the GPU activity's thread map).
        self.on_new_thread: Callable[[ThreadState], None] | None = None
        self.pid = os.getpid()
        self.start_ns = clock()
        #: The hot path's implementation, and what its wrappers call (``tracer.core``).
        self.hotpath = implementation or hotpath.PYTHON
        self.core = core = self.hotpath.core(
            ThreadState, RangeInfo, self._new_state, sync.synchronize, window,
            None if clock is perf_counter_ns else clock)
        #: This thread's state; open a range (the token for ``end``); close it: the core's.
        self.state: Callable[[], ThreadState] = core.state
        self.begin: Callable[..., RangeInfo | None] = core.begin
        self.end: Callable[..., None] = core.end
        for sink in sinks or ():
            self.add_sink(sink)

    # -- setup ------------------------------------------------------------
    def add_sink(self, sink: SinkBasics) -> None:
        self.sinks.append(sink)
        for info in self.infos:
            sink.prepare(info)
        # A sink that ignores t0/t1 says so with ``timed = False`` (NVTX): two clock reads saved
        self._timed = any(getattr(s, "timed", True) for s in self.sinks)
        self._sinks_changed()

    def remove_sinks(self) -> None:
        """No sink gets anything any more (the agent switched off in this process)."""
        self.sinks = []
        self._sinks_changed()

    def _sinks_changed(self) -> None:
        """Hand the sinks to the core: each with its native part, its calls and its mask."""
        self.core.set_sinks([(getattr(sink, "native", None), getattr(sink, "begin", None),
                              getattr(sink, "end", None), _mask(sink))
                             for sink in self.sinks], self._timed)

    def info(self, name: str, category: str) -> RangeInfo:
        """The RangeInfo for ``name`` in ``category`` (created once)."""
        key = (name, category)
        info = self._by_key.get(key)
        if info is None:
            with self._lock:
                info = self._by_key.get(key)
                if info is None:
                    if len(self.infos) >= MAX_RANGE_NAMES:
                        return self._transient(name, category)
                    info = self._by_key[key] = self._new_info(name, category)
        return info

    def _new_info(self, name: str, category: str) -> RangeInfo:
        level, color = names.CATEGORIES[category]
        info = RangeInfo(len(self.infos), name, category, level, color)
        info.emit = level <= self.granularity_level
        # level S syncs ranges coarser than S; S=3 (finest) every range emitted
        info.sync = level < self.sync.level or self.sync.level >= names.FUNCTION_LEVEL
        for sink in self.sinks:
            sink.prepare(info)
        self.infos.append(info)
        return info

    def _transient(self, name: str, category: str) -> RangeInfo:
        """A name beyond the cap: a RangeInfo for this range only, recorded as the overflow."""
        key = (OVERFLOW_NAME, category)
        shared = self._by_key.get(key)
        if shared is None:
            shared = self._by_key[key] = self._new_info(OVERFLOW_NAME, category)
        info = RangeInfo(shared.index, name, category, shared.level, shared.color)
        info.emit, info.sync = shared.emit, shared.sync
        for sink in self.sinks:
            prepare = getattr(sink, "prepare_transient", None)
            if prepare is not None:
                prepare(info)
        return info

    def kept(self, info: RangeInfo) -> bool:
        """Whether ``info`` is kept by the tracer (not a name past the cap): callers that
        cache RangeInfos by their own keys cache only these."""
        return self.infos[info.index] is info

    def _new_state(self) -> ThreadState:
        """A new state for this thread, registered in :attr:`states`."""
        ts = ThreadState()
        guard: _ThreadEnd | None = getattr(self._local, "end", None)
        if guard is not None and self.states.get(ts.tid) is guard.ts:
            # made meanwhile, by a call nested in this one (a finalizer run by the collector):
            # that one stays, or replacing its guard would end it while the thread runs on
            return guard.ts
        ended = self._torn_down.pop((ts.tid, threading.get_ident()), None)
        if ended is not None and monotonic() - ended < TEARDOWN_S:
            # the thread is being torn down (its locals are gone, so no guard would ever say
            # it ended): what it still runs is not training, and opens no iteration
            ts.quiet = 1
        else:
            self._local.end = _ThreadEnd(self, ts)  # goes with the thread's locals: says it ended
        self.states[ts.tid] = ts
        told = self.on_new_thread
        if told is not None:
            try:
                told(ts)
            except Exception:  # noqa: BLE001
                pass  # an observer's error never reaches the program's call
        return ts

    def forget_thread(self) -> None:
        """This thread drops its state (the tracer is done, or the thread is ending): the
        native core's entry in the thread's dict would otherwise outlive it."""
        self.core.forget()

    def _current(self) -> ThreadState | None:
        """This thread's state, if it has one (none is created)."""
        return self.core.current()

    def thread_ended(self, ts: ThreadState) -> None:
        """``ts``'s thread has ended: the sinks take what it left, and its state goes."""
        if self.states.get(ts.tid) is not ts:
            return  # another process's (after a fork), or already gone
        if threading.get_native_id() == ts.tid:  # on that thread: its teardown
            self.forget_thread()  # the native core's entry: a later call gets a new state
            torn = self._torn_down
            torn[(ts.tid, threading.get_ident())] = monotonic()
            while len(torn) > MAX_TORN_DOWN:
                del torn[next(iter(torn))]
        if ts.stack:  # left open: an implicit iteration, a block entered by hand
            if threading.get_native_id() == ts.tid and self._closing is None:
                self.close_thread(ts)  # still on that thread (its teardown): end them all
            else:
                self._abandon(ts, list(ts.stack))
        for sink in list(self.sinks):
            ended = getattr(sink, "thread_ended", None)
            if ended is not None:
                ended(ts)
        self.states.pop(ts.tid, None)
        names_kept = self.ended_names
        names_kept[ts.tid] = ts.thread_name
        while len(names_kept) > MAX_ENDED_THREAD_NAMES:
            del names_kept[next(iter(names_kept))]

    def _abandon(self, ts: ThreadState, entries: list[tuple[RangeInfo, int]]) -> None:
        """End ``entries`` of ``ts`` now in the sinks that can do so from any thread."""
        end_ns = self.clock()
        if ts.iter_busy and not ts.iter_counts and ts.iter_tok is not None \
                and ts.phase is None:
            # an implicit iteration that reached no update, not cut short: none (_no_update)
            token, instead = ts.iter_tok, self._no_update_info()
            entries = [(instead, t0) if info is token else (info, t0) for info, t0 in entries]
        for sink in list(self.sinks):
            abandon = getattr(sink, "abandon", None)
            if abandon is not None:
                abandon(ts, entries, end_ns)

    # -- the iteration state machine --------------------------------------
    # An explicit iteration is an updater's (``Updater.update``); an implicit one is a step of
    # a loop of the program's own, opened by its first training event and closed by the patches
    # when its last optimizer update returns.  An implicit one that ends without having reached
    # an update (a training-mode forward after the loop) was no iteration: it is recorded as
    # :data:`~..common.names.NO_UPDATE` instead, and not counted; unless the end came from
    # outside while one of its phases ran (the program's end, a signal), or an exception left
    # one (:meth:`confirm_iteration`): a step cut short counts, as an updater's does.  NVTX
    # shows it as pushed (an ``iteration``): what follows a range's push cannot change it.

    def when_training_begins(self, call: Callable[[], object]) -> None:
        """``call()`` once, at the start of this process's first iteration (at once if one has
        begun): what needs a run to exist waits for it, and costs nothing per iteration after
        (the instance's ``begin_iteration`` is the class's own again)."""
        if self.iterations:
            call()
            return

        def first(ts: ThreadState, explicit: bool, opener: int | None = None) -> None:
            self.__dict__.pop("begin_iteration", None)
            try:
                call()
            except Exception:  # noqa: BLE001
                pass  # an observer's error never reaches the program's call
            self.begin_iteration(ts, explicit, opener)

        self.begin_iteration = first  # type: ignore[method-assign]

    def begin_iteration(self, ts: ThreadState, explicit: bool, opener: int | None = None
                        ) -> None:
        """Open an iteration on ``ts`` (caller checked ``ts.iter_busy`` is False); ``opener``:
        the ``id()`` of what opened an implicit one (its first event: an iterator, a link)."""
        n = self.iterations
        self.iterations = self.facts["iterations"] = n + 1  # the run's progress, in its record
        if self.window is not None:
            self.window.at_iteration(n)
        ts.iter_busy = True
        ts.iter_explicit = explicit
        ts.iter_counts = explicit
        ts.iter_owed = ts.iter_trained = ts.iter_by_data = False
        ts.iter_opener = opener
        ts.iter_samples = ts.iter_converted = 0
        ts.iter_tok = self.begin(self.info(names.ITERATION, names.ITERATION), ts)

    def end_iteration(self, ts: ThreadState) -> None:
        if ts.phase is not None:
            self.end_phase(ts)
        token = ts.iter_tok
        if not ts.iter_counts:
            token = self._no_update(ts, 0)
        self.end(token, ts)
        self._iteration_over(ts)
        waiting = ts.after_iteration
        if waiting:
            ts.after_iteration = None
            for work in waiting:
                work()  # (the agent's own: contains its errors)

    def _iteration_over(self, ts: ThreadState) -> None:
        """Forget the iteration of ``ts`` (its range ended, or is no longer ours to end)."""
        ts.iter_tok = None
        ts.iter_busy = ts.iter_explicit = ts.iter_counts = ts.iter_owed = False
        ts.iter_trained = ts.iter_by_data = False
        ts.iter_opener = None
        ts.iter_samples = ts.iter_converted = 0
        ts.step_links.clear()
        ts.step_optimizers.clear()

    def _no_update(self, ts: ThreadState, depth: int) -> RangeInfo | None:
        """The open implicit iteration of ``ts`` reached no update and is about to end with
        everything above ``depth``: it was no iteration.  Its range becomes
        :data:`~..common.names.NO_UPDATE` (what the sinks that record get at its end), it is
        not counted, and the capture window sees its number again.  Returns the new token."""
        if self.iterations > 0:
            self.iterations = self.facts["iterations"] = self.iterations - 1
        token = ts.iter_tok
        if token is None:
            return None
        stack = ts.stack
        for at in range(len(stack) - 1, depth - 1, -1):
            if stack[at][0] is token:
                instead = self._no_update_info()
                stack[at] = (instead, stack[at][1])
                return instead
        return token

    def _no_update_info(self) -> RangeInfo:
        info = self.info(names.NO_UPDATE, names.INFERENCE)
        # it began as an iteration: it ends as one would (a sync at level 1 too)
        info.sync = self.info(names.ITERATION, names.ITERATION).sync
        return info

    def confirm_iteration(self, ts: ThreadState) -> None:
        """The open iteration of ``ts`` is one: it reached a parameter update, or the program's
        end cut it short (an exception out of one of its phases)."""
        ts.iter_counts = True

    def begin_phase(self, ts: ThreadState, phase: str, opener: int | None = None) -> None:
        """Open phase ``phase``, opening an implicit iteration if none is open (``opener``:
        the ``id()`` of the event's object, see :meth:`begin_iteration`)."""
        if not ts.iter_busy:
            self.begin_iteration(ts, explicit=False, opener=opener)
            ts.iter_by_data = phase == names.DATA
        if phase != names.DATA:
            ts.iter_trained = True
            if phase == names.UPDATE:
                ts.iter_counts = True  # a step that reaches its update is an iteration
        ts.phase = phase
        ts.phase_tok = self.begin(self.info(phase, phase), ts)

    def end_phase(self, ts: ThreadState) -> None:
        tok = ts.phase_tok
        ts.phase = None
        ts.phase_tok = None
        self.end(tok, ts)

    def end_block(self, token: RangeInfo | None, ts: ThreadState | None = None) -> None:
        """Close ``token`` and whatever opened after it is still open (a user block's end).

        A block such as ``with annotate("x"):`` may open an implicit iteration
        that outlives it; NVTX ranges must nest, so that iteration ends with
        the block and the next training event opens a new one.
        """
        if token is None:
            return
        if ts is None:
            ts = self.state()
        stack = ts.stack
        if stack and stack[-1][0] is token:
            self.end(token, ts)
            return
        for depth in range(len(stack) - 2, -1, -1):
            if stack[depth][0] is token:
                self._unwind(ts, depth)
                return

    def _unwind(self, ts: ThreadState, depth: int) -> int:
        """End every range of ``ts`` above ``depth``, innermost first; forget their state."""
        stack = ts.stack
        closed = 0
        error: Exception | None = None
        if ts.iter_busy and not ts.iter_counts and any(
                entry[0] is ts.iter_tok for entry in stack[depth:]):
            self._no_update(ts, depth)  # it ends below: it was no iteration
            ts.iter_counts = True  # settled (the state is forgotten below)
        while len(stack) > depth:
            size = len(stack)
            try:
                self.end(stack[-1][0], ts)
            except Exception as exc:  # the first error is raised after every range is ended  # noqa: BLE001
                error = error or exc
            if len(stack) == size:  # a sync or sink failed before popping: drop it
                stack.pop()
            closed += 1
        open_infos = [entry[0] for entry in stack]
        if ts.iter_tok is not None and ts.iter_tok not in open_infos:
            self._iteration_over(ts)
            ts.phase = ts.phase_tok = None
        elif ts.phase_tok is not None and ts.phase_tok not in open_infos:
            ts.phase = ts.phase_tok = None
        if ts.bwd_link_tok is not None and ts.bwd_link_tok not in open_infos:
            ts.bwd_link = ts.bwd_link_tok = None
        if error is not None:
            raise error
        return closed

    # -- process end and fork ---------------------------------------------
    def close_thread(self, ts: ThreadState) -> int:
        """Close every range still open on ``ts`` (call on its own thread)."""
        try:
            if ts.phase is not None:  # the end came while a step ran: cut short, it counts
                ts.iter_counts = True
            elif ts.iter_busy and not ts.iter_counts and ts.iter_tok is None:
                self._no_update(ts, 0)  # not emitted (outside the window): not counted either
            return self._unwind(ts, 0)
        finally:
            self._iteration_over(ts)
            ts.phase_tok = ts.bwd_link_tok = ts.bwd_link = None
            ts.await_update = False
            ts.phase = ts.extension = None
            ts.quiet = ts.opt_depth = ts.in_trainer = 0
            ts.links.clear()
            ts.user.clear()

    def reset_after_fork(self) -> None:
        """Give a forked child clean state: no inherited open ranges.

        The forking thread keeps its state object, so that calls in flight
        unwind through it, but its open ranges are dropped: ending them is a
        no-op, and the child never pops a range it did not push.  The other
        threads do not exist in the child.
        """
        current = self._current()
        for ts in self.states.values():
            ts.stack.clear()
        self.states = {}
        self._lock = threading.Lock()
        self._unwound = threading.Event()  # the parent's may be mid-use by a thread not copied
        if current is not None:
            current.tid = threading.get_native_id()
            current.record = None
            self.states[current.tid] = current
        self.pid = os.getpid()
        self.iterations = 0
        self.facts["iterations"] = 0
        for sink in self.sinks:
            reset = getattr(sink, "reset_after_fork", None)
            if reset is not None:
                reset(self)

    def close(self) -> None:
        """End of the process: close this thread's ranges, then the others', then every sink.

        Another thread's open ranges end now in the sinks that can end them
        from here (the recorder); each such thread pops its NVTX ranges itself
        at its next instrumented call (:meth:`wait_for_threads`).  From now on
        nothing new is emitted.
        """
        try:
            self.close_thread(self.state())
        finally:
            try:
                self._close_other_threads()
            finally:
                for sink in list(self.sinks):
                    sink.close(self)

    def _close_other_threads(self) -> None:
        me = self.state()
        others = [ts for ts in list(self.states.values()) if ts is not me]
        # made at exit, not with the tracer: the running program carries none of it
        self._closing_lock = threading.Lock()  # the threads' entries in _closing
        self._closing_done = threading.Condition(self._closing_lock)
        self._recording = 0  # threads ending their open ranges in the recorder now
        # Each thread unwinds itself at its next call (see _pop_on_thread).  The late
        # functions go in first: from then on no range is pushed, so what a thread has open
        # is fixed, and one whose stack is empty then has nothing to pop (it is not waited
        # for).  Looking before the swap would miss the ranges a thread pushes in between.
        closing = self._closing = dict.fromkeys(others, True)
        unrecorded = self._unrecorded = dict.fromkeys(others, True)
        self._late_unwinders()
        with self._closing_lock:
            for ts in others:
                if not ts.stack and closing.get(ts) is True:
                    closing[ts] = False
            if not any(closing.values()):
                self._unwound.set()
        # A short grace: a thread in the middle of a range's end finishes it in every sink;
        # what the threads still away left open then ends in the recorder's view, from here,
        # once the threads that are ending theirs there have done so (their rows in hand).
        if self._unwound.wait(CLOSE_GRACE_S) and others:
            # nothing (more) open, yet a thread may be between a range's end and its record
            # (the recorder's Python part of an iteration's end), its stack already popped:
            # a switch interval or two for it to finish before the recorder closes
            sleep(IN_FLIGHT_S)
        with self._closing_done:
            away = [ts for ts in others if unrecorded.pop(ts, None) is not None]
            self._closing_done.wait_for(lambda: not self._recording, RECORDING_WAIT_S)
        for ts in away:
            if ts.stack:
                self._abandon(ts, list(ts.stack))

    def _late_unwinders(self) -> None:
        """From now on a begin or end only ends what its thread left open (once)."""
        self.core.set_sinks([(None, self._late_begin, self._late_end, names.ALL_CATEGORIES)],
                            self._timed)

    def _late_begin(self, info: RangeInfo, ts: ThreadState) -> None:
        """After close, a thread's first begin: end what it had open (not this new range)."""
        if self._closing is not None:
            self._pop_on_thread(ts, ts.stack[:-1])

    def _late_end(self, info: RangeInfo, t0: int, t1: int, ts: ThreadState) -> None:
        """After close, a thread's first end: end this range and what is still open below it."""
        if self._closing is not None:
            self._pop_on_thread(ts, [*ts.stack, (info, t0)])

    def _pop_on_thread(self, ts: ThreadState, entries: list[tuple[RangeInfo, int]]) -> None:
        """On ``ts``'s own thread, once: end ``entries`` (outermost first) in every sink."""
        closing = self._closing
        if closing is None:
            return
        with self._closing_lock:
            state = closing.get(ts)
            if state is None or state is _POPPING:
                return  # a thread that started later, done, or at it
            closing[ts] = _POPPING  # still waited for: the exit goes on once it is done
            record = self._unrecorded.pop(ts, None) is not None and bool(entries)
            self._recording += record
        try:
            if record:
                try:  # before the recorder closes, in this thread's order
                    self._abandon(ts, entries)
                finally:
                    with self._closing_done:
                        self._recording -= 1
                        self._closing_done.notify_all()
            t1 = self.clock()
            for info, t0 in reversed(entries):
                for sink in self.sinks:
                    end = getattr(sink, "end", None)
                    if end and not hasattr(sink, "abandon") \
                            and _mask(sink) >> info.category_index & 1:
                        try:
                            end(info, t0, t1, ts)
                        except Exception:  # one sink's error: the others still end the range  # noqa: BLE001
                            pass
        finally:
            with self._closing_lock:
                closing.pop(ts, None)
                if not any(closing.values()):
                    self._unwound.set()

    def wait_for_threads(self, timeout: float) -> bool:
        """After :meth:`close`: wait up to ``timeout`` s for the threads left to pop their
        NVTX ranges; whether all did (a thread blocked outside instrumented code cannot)."""
        if self._closing is None:
            return True
        return self._unwound.wait(timeout)


def _mask(sink: SinkBasics) -> int:
    """The category mask of ``sink`` (its ``categories``; none declared: every category)."""
    return names.category_mask(getattr(sink, "categories", None))
