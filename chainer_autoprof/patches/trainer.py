"""Trainer-level targets: what runs between iterations is never training.

* ``Trainer.run``: on its thread, everything outside ``Updater.update`` is
  quiet (extensions, initializers, triggers): a model called there is not the
  start of a training iteration.
* ``Trainer.extend``: an extension given as a plain function (or one made by
  ``make_extension``) is wrapped so that its calls get an extension range too;
  ``Extension`` instances are covered by the ``Extension.__call__`` patch.
* ``multiprocess_parallel_updater.gather_grads`` / ``scatter_params``: the
  update phase and the end of an iteration in MultiprocessParallelUpdater
  workers, which never call an optimizer.
"""

from __future__ import annotations

from typing import Any, Callable

import wrapt

from ..common import names
from .base import Patch


def wrap_trainer_run(tracer: Any, patch: Patch) -> Callable:
    """Everything inside ``Trainer.run`` but outside an update is quiet."""
    state = tracer.state

    def wrapper(wrapped, instance, args, kwargs):
        patch.hits += 1
        if not patch.on:
            return wrapped(*args, **kwargs)
        ts = state()
        ts.quiet += 1
        ts.in_trainer += 1
        try:
            return wrapped(*args, **kwargs)
        finally:
            ts.quiet -= 1
            ts.in_trainer -= 1

    return wrapper


def wrap_trainer_extend(tracer: Any, patch: Patch, extension_cls: type) -> Callable:
    """Give function extensions an extension range of their own."""
    def wrapper(wrapped, instance, args, kwargs):
        patch.hits += 1
        if not patch.on:
            return wrapped(*args, **kwargs)
        try:
            ext = args[0] if args else kwargs.get("extension")
            if ext is not None and not isinstance(ext, extension_cls) and callable(ext) \
                    and not isinstance(ext, wrapt.ObjectProxy):
                name = (args[1] if len(args) > 1 else kwargs.get("name")) \
                    or getattr(ext, "name", None) or getattr(ext, "default_name", None) \
                    or getattr(ext, "__name__", "extension")
                info = tracer.info(names.extension_text(str(name), ""), names.EXTENSION)
                proxy = wrapt.FunctionWrapper(ext, _extension_call(tracer, patch, info))
                args = (proxy, *args[1:]) if args else args
                if not args:
                    kwargs = dict(kwargs, extension=proxy)
        except Exception as exc:
            patch.fail(exc)
        return wrapped(*args, **kwargs)

    return wrapper


def _extension_call(tracer: Any, patch: Patch, info: Any) -> Callable:
    state, begin, end = tracer.state, tracer.begin, tracer.end

    def call(wrapped, instance, args, kwargs):
        if not patch.on:
            return wrapped(*args, **kwargs)
        ts = state()
        ts.quiet += 1
        tok = None
        try:
            tok = begin(info, ts)
        except Exception as exc:
            patch.fail(exc)
        try:
            return wrapped(*args, **kwargs)
        finally:
            ts.quiet -= 1
            try:
                end(tok, ts)
            except Exception as exc:
                patch.fail(exc)

    return call


def wrap_mpu_gather_grads(tracer: Any, patch: Patch) -> Callable:
    """``multiprocess_parallel_updater.gather_grads``: the update phase begins.

    MultiprocessParallelUpdater workers never call an optimizer: their
    iteration is data, forward, backward, then the gradient reduce and the
    parameter broadcast from the master.  Gathering the gradients opens the
    update phase of an implicit iteration (in the master, whose iteration is the
    updater's, it opens the update phase that ``optimizer.update`` joins).
    """
    state = tracer.state

    def wrapper(wrapped, instance, args, kwargs):
        patch.hits += 1
        if patch.on:
            ts = state()
            try:
                if ts.iter_busy and ts.phase is None and not ts.quiet:
                    tracer.begin_phase(ts, names.UPDATE)
            except Exception as exc:
                patch.fail(exc)
        return wrapped(*args, **kwargs)

    return wrapper


def wrap_mpu_scatter_params(tracer: Any, patch: Patch) -> Callable:
    """``multiprocess_parallel_updater.scatter_params``: a worker's iteration ends."""
    state = tracer.state

    def wrapper(wrapped, instance, args, kwargs):
        patch.hits += 1
        try:
            return wrapped(*args, **kwargs)
        finally:
            if patch.on:
                ts = state()
                try:
                    if ts.iter_busy and not ts.iter_explicit and not ts.quiet:
                        tracer.end_iteration(ts)
                except Exception as exc:
                    patch.fail(exc)

    return wrapper
