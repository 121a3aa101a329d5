"""What the hot path works on: a range name's :class:`RangeInfo`, a thread's :class:`ThreadState`.

Both are built off the hot path (a RangeInfo once per distinct name, with every
sink's attributes; a ThreadState once per thread) and read on it by the core of
either implementation (:mod:`.hotpath`), the patches and the sinks.  Only their
slots live here, apart from the :class:`~.events.Tracer` that makes them, so
that the hot path's modules depend on these and not on the tracer.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

from ..common import names


class RangeInfo:
    """A distinct range name: what sinks need to emit it, built once."""

    __slots__ = ("category", "category_index", "color", "emit", "index", "level", "name", "nvtx",
                 "stack_entry", "sync")

    def __init__(self, index: int, name: str, category: str, level: int, color: int) -> None:
        self.index = index
        self.name = name
        self.category = category
        self.category_index = names.CATEGORY_INDEX[category]  # its bit in the sinks' masks
        self.level = level
        self.color = color
        self.emit = True
        self.sync = False
        self.nvtx: Any = None  # the NVTX sink's prepared attributes
        self.stack_entry = (self, 0)  # what ts.stack holds while it is open, untimed

    def __repr__(self) -> str:
        return f"RangeInfo({self.name!r}, {self.category!r})"


class ThreadState:
    """Per-thread state: the open ranges and the training-loop state machine."""

    __slots__ = (
        "after_iteration",
        "await_update",
        "bwd_link",
        "bwd_link_tok",
        "by_updater",
        "extension",
        "in_trainer",
        "iter_busy",
        "iter_by_data",
        "iter_converted",
        "iter_counts",
        "iter_explicit",
        "iter_opener",
        "iter_owed",
        "iter_samples",
        "iter_tok",
        "iter_trained",
        "links",
        "loop_source",
        "opt_depth",
        "phase",
        "phase_tok",
        "quiet",
        "record",
        "record_samples",
        "stack",
        "step_links",
        "step_optimizers",
        "thread_name",
        "tid",
        "user",
    )

    def __init__(self) -> None:
        self.tid = threading.get_native_id()
        self.thread_name = threading.current_thread().name
        self.stack: list[tuple[RangeInfo, int]] = []
        self.iter_tok: RangeInfo | None = None
        self.iter_explicit = False  # opened by an updater rather than implicitly
        self.iter_busy = False      # an iteration is open (even if not emitted)
        self.iter_counts = False    # ...and it is one: explicit, updated, or cut short
        self.iter_owed = False      # ...updated, but another optimizer is still to update
        self.iter_trained = False   # ...a phase other than data began in it
        self.iter_by_data = False   # ...a batch fetched or converted opened it
        self.iter_opener: int | None = None  # id() of what opened the implicit one
        # ...the samples its training batches held: fetched from an iterator, converted
        self.iter_samples = 0
        self.iter_converted = 0
        self.by_updater = False     # this thread trains in an updater: outside one, no training
        # the patches': outermost links called in the step (id -> weak reference), the ids of
        # the optimizers updated in it, the id() of the data source whose fetch began the last
        self.step_links: dict[int, weakref.ref[Any]] = {}
        self.step_optimizers: set[int] = set()
        self.loop_source: int | None = None
        self.phase: str | None = None
        self.phase_tok: RangeInfo | None = None
        self.quiet = 0              # >0 inside an extension or inference: not training
        self.links: list[Any] = []  # entries of the links being called (patches' business)
        self.await_update = False
        self.opt_depth = 0
        self.bwd_link: int | None = None  # the link entry whose backward range is open
        self.bwd_link_tok: RangeInfo | None = None
        self.extension: Any = None  # the extension being called (its own super() calls pass)
        self.user: list[RangeInfo | None] = []  # tokens of the open annotate() blocks
        self.in_trainer = 0         # >0 inside Trainer.run
        self.record: Any = None     # the recorder sink's per-thread buffer
        #: the recorder's: ``(t1, samples)`` of this thread's iterations not yet aggregated
        self.record_samples: list[tuple[int, int]] | None = None
        #: the agent's own work waiting for this thread's iteration to end (the probes'
        #: checks in an updater's iteration): run after it, between two iterations
        self.after_iteration: list[Callable[[], None]] | None = None
