"""The replay experiment (``CHAINER_PROF_REPLAY_BATCH=1``): how fast if data were free?

The data phase of every training iteration returns the first batch again:

* the iterator: the first ``next`` runs for real and its batch is kept.  After
  that, for Chainer's own iterators (``SerialIterator``,
  ``MultithreadIterator``, ``MultiprocessIterator``) the iterator's epoch state
  is advanced exactly as its own ``next`` would (same state machine, same
  order sampler) without reading the dataset, so ``epoch``,
  ``epoch_detail`` and ``is_new_epoch`` move as in the normal run and an
  epoch-based stop trigger ends the training after the same number of
  iterations.  Any other iterator is still called (its state is its own
  business) and its batch is replaced: its loading time stays in the figures,
  and the facts say so.
* the converter: the first converted batch is kept and returned again, so
  neither conversion nor the host-to-device copy runs.

What remains of the data phase is the bookkeeping above: the replayed run's
data time is the floor that any input pipeline could reach.  The model then
trains on one batch over and over: the experiment measures speed, its results
are meaningless.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

from ..common import log

if TYPE_CHECKING:
    from ..common.typedefs import AnyFunction, Args, Kwargs

#: Iterators whose epoch state the replay advances without loading.
KNOWN_ITERATORS = ("SerialIterator", "MultithreadIterator", "MultiprocessIterator")


class Replay:
    """Replays the first training batch; called by the data-phase wrapper."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts
        self.on = True
        self._batches: dict[int, tuple[Any, list[Any]]] = {}
        self._converted: dict[int, tuple[Any, Any]] = {}
        self._statemachine: Any = None
        self.info: dict[str, Any] = {"iterator": None, "iterator_mode": None,
                                     "converter": False, "replayed": 0}
        facts["replay"] = self.info

    def call(self, kind: str, wrapped: AnyFunction, instance: Any, args: Args,
             kwargs: Kwargs) -> Any:
        """The data call ``kind`` (``__next__``/``next``, ``__call__``, ``_call_converter``)."""
        if not self.on:
            return wrapped(*args, **kwargs)
        if kind in ("__next__", "next"):
            return self._next(wrapped, instance, args, kwargs)
        converter = instance if kind == "__call__" else (args[0] if args else None)
        return self._convert(converter, wrapped, args, kwargs)

    # -- iterator ----------------------------------------------------------------
    def _next(self, wrapped: AnyFunction, iterator: Any, args: Args, kwargs: Kwargs) -> Any:
        try:
            kept = self._batches.get(id(iterator))
            if kept is not None and kept[0]() is not iterator:
                kept = None
            advance = self._advancer(iterator) if kept is not None else None
        except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
            return self._fail(exc, wrapped, args, kwargs)
        if kept is None:
            batch = wrapped(*args, **kwargs)
            try:
                self._keep_batch(iterator, batch)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                self._fail(exc)
            return batch
        if advance is None:
            wrapped(*args, **kwargs)  # advance it its own way; its batch is dropped
        else:
            advance()  # raises StopIteration at the end, as the iterator would
        self.info["replayed"] += 1
        return list(kept[1])

    def _keep_batch(self, iterator: Any, batch: Any) -> None:
        try:
            ref: Any = weakref.ref(iterator)
        except TypeError:
            ref = _Strong(iterator)
        self._batches[id(iterator)] = (ref, list(batch))
        cls = type(iterator).__name__
        self.info["iterator"] = cls
        self.info["iterator_mode"] = ("epoch state advanced without loading"
                                      if self._can_advance(iterator)
                                      else "its own next still runs (loading time included)")

    def _can_advance(self, iterator: Any) -> bool:
        if type(iterator).__name__ not in KNOWN_ITERATORS:
            return False
        if type(iterator).__module__.split(".")[0] != "chainer":
            return False
        if self._statemachine is None:
            from chainer.iterators import _statemachine  # Chainer's: once it is imported
            self._statemachine = _statemachine
        return isinstance(getattr(iterator, "_state", None), self._statemachine.IteratorState)

    def _advancer(self, iterator: Any) -> Callable[[], None] | None:
        if not self._can_advance(iterator):
            return None
        machine = self._statemachine.iterator_statemachine

        def advance() -> None:
            previous = iterator.epoch_detail
            state, indices = machine(iterator._state, iterator.batch_size, iterator.repeat,
                                     iterator.order_sampler, len(iterator.dataset))
            if indices is None:
                raise StopIteration
            iterator._previous_epoch_detail = previous
            iterator._state = state

        return advance

    # -- converter -----------------------------------------------------------------
    def _convert(self, converter: Any, wrapped: AnyFunction, args: Args, kwargs: Kwargs) -> Any:
        key = id(converter)
        kept = self._converted.get(key)
        if kept is not None and kept[0] is converter:
            self.info["replayed"] += 1
            return kept[1]
        result = wrapped(*args, **kwargs)
        try:
            self._converted[key] = (converter, result)
            self.info["converter"] = True
        except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
            self._fail(exc)
        return result

    # -- errors ----------------------------------------------------------------------
    def _fail(self, exc: BaseException, wrapped: AnyFunction | None = None,
              args: Args = (), kwargs: Kwargs | None = None) -> Any:
        if self.on:
            self.on = False
            self.info["error"] = f"{type(exc).__name__}: {exc}"
            log.error(f"replay experiment stopped ({self.info['error']}); "
                      "the real batches are used from here on")
        if wrapped is not None:
            return wrapped(*args, **(kwargs or {}))
        return None


class _Strong:
    """A strong reference that answers like a weak one (objects without weakref support)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj
