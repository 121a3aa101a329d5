"""Input queue statistics: how many batches were ready when training asked for the next one.

tensorpack's performance guide: "pay attention to the queue size
statistics".  A prefetching iterator whose queue is empty whenever training
asks cannot keep up, and the data phase is its wait.  This probe wraps the
``__next__`` of :class:`chainer.iterators.MultiprocessIterator` (ready: the
batches in its queue, out of ``n_prefetch``) and
:class:`chainer.iterators.MultithreadIterator` (ready: whether its one
prefetched batch is done) and counts, per iterator class, the fetches made
for training (not in an extension or inference) by the number of batches
ready, in ``tracer.facts["input_queue"]``.  The first fetch of an iterator
(nothing can be ready yet) is not counted.

One Python call per fetch, not per range: the data wrapper is untouched.
The last training iterator is also kept (weakly) to describe its queue in a
stall report.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

from .base import Around, Hooks, Instrumentor, Patch

if TYPE_CHECKING:
    from types import ModuleType

    import chainer

    from ..common.typedefs import Args, Kwargs
    from ..runtime.events import Tracer


def _multiprocess_ready(it: chainer.dataset.Iterator) -> tuple[int, int] | None:
    """(ready, capacity) of a MultiprocessIterator, ``None`` before its first batch."""
    loop = getattr(it, "_prefetch_loop", None)
    comm = getattr(it, "_comm", None)
    if loop is None or comm is None or getattr(loop, "_thread", None) is None:
        return None
    return len(comm._batch_queue), int(getattr(it, "n_prefetch", 1) or 1)


def _multithread_ready(it: chainer.dataset.Iterator) -> tuple[int, int] | None:
    """(ready, capacity) of a MultithreadIterator, ``None`` before its first batch."""
    pending = getattr(it, "_next", None)
    if pending is None:
        return None
    return (1 if pending.ready() else 0), 1


#: iterator class name -> its queue reader
READERS: dict[str, Callable[[Any], tuple[int, int] | None]] = {
    "MultiprocessIterator": _multiprocess_ready,
    "MultithreadIterator": _multithread_ready,
}


class InputQueueProbe(Instrumentor):
    """Counts the batches ready at each training fetch of the prefetching iterators."""

    library = "chainer"
    name = "Chainer (input queue)"
    reported = False
    requires = ("chainer",)

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer
        self.stats: dict[str, dict[str, Any]] = {}
        self._last: Any = None  # weak reference to the last training iterator

    def targets(self, chainer: ModuleType) -> list[Patch]:
        # Chainer's submodules, once Chainer itself is imported (never imported by us first)
        from chainer.iterators import multiprocess_iterator, multithread_iterator

        return [
            Patch("probe:MultiprocessIterator.__next__", multiprocess_iterator.MultiprocessIterator,
                  "__next__", self._wrap, subclasses=True, also=("next",)),
            Patch("probe:MultithreadIterator.__next__", multithread_iterator.MultithreadIterator,
                  "__next__", self._wrap, subclasses=True, also=("next",)),
        ]

    def _wrap(self, patch: Patch) -> Hooks:
        state = self.tracer.state
        facts = self.tracer.facts
        stats = self.stats
        probed: dict[type, str] = {}  # iterator class -> the probed class it is

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> None:
            if state().quiet:
                return
            cls = type(instance)
            name = probed.get(cls)
            if name is None:
                name = probed[cls] = _class_name(instance)
            ready = READERS[name](instance)
            if ready is not None:
                entry = stats.get(name)
                if entry is None:
                    entry = stats[name] = {"capacity": ready[1], "fetches": 0,
                                           "ready": [0] * (ready[1] + 1)}
                    facts["input_queue"] = stats
                counts = entry["ready"]
                counts[min(ready[0], len(counts) - 1)] += 1
                entry["fetches"] += 1
            last = self._last
            if last is None or last() is not instance:
                self._last = weakref.ref(instance)
            return  # nothing to do after the fetch

        return Around(enter)

    def describe(self) -> list[str]:
        """The last training iterator's queue now, for a stall report."""
        it = self._last() if self._last is not None else None
        if it is None:
            return []
        name = _class_name(it)
        ready = READERS[name](it)
        if ready is None:
            return [f"input queue: {name}, no batch fetched yet"]
        text = f"input queue: {name}, {ready[0]} of {ready[1]} batches ready"
        loop = getattr(it, "_prefetch_loop", None)
        thread = getattr(loop, "_thread", None)
        if thread is not None and not thread.is_alive():
            text += "; its prefetch thread has ended"
        pool = getattr(loop, "_pool", None)
        workers = getattr(pool, "_pool", None)
        if workers:
            dead = [w for w in workers if not w.is_alive()]
            text += f"; {len(workers) - len(dead)} of {len(workers)} worker processes alive"
        return [text]


def _class_name(it: chainer.dataset.Iterator) -> str:
    """The probed base class an iterator is (subclasses count as their base)."""
    for cls in type(it).__mro__:
        if cls.__name__ in READERS:
            return cls.__name__
    return type(it).__name__
