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

from typing import TYPE_CHECKING, Any

from ..common import names
from .base import Around, Patch

if TYPE_CHECKING:
    from ..common.typedefs import Args, Kwargs
    from ..runtime.events import RangeInfo, ThreadState, Tracer


def wrap_trainer_run(tracer: Tracer, patch: Patch) -> Around:
    """Everything inside ``Trainer.run`` but outside an update is quiet."""
    state = tracer.state

    def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
        ts = state()
        ts.quiet += 1
        ts.in_trainer += 1
        return ts

    def exit(ts: ThreadState, result: Any, exc: BaseException | None) -> None:
        ts.quiet -= 1
        ts.in_trainer -= 1

    return Around(enter, exit)


def wrap_trainer_extend(tracer: Tracer, patch: Patch, extension_cls: type) -> Around:
    """Give function extensions an extension range of their own."""
    impl = tracer.hotpath

    def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
        ext = args[0] if args else kwargs.get("extension")
        if ext is None or isinstance(ext, extension_cls) or not callable(ext) \
                or _ours(ext):
            return None
        name = (args[1] if len(args) > 1 else kwargs.get("name")) \
            or getattr(ext, "name", None) or getattr(ext, "default_name", None) \
            or getattr(ext, "__name__", "extension")
        info = tracer.info(names.extension_text(str(name), ""), names.EXTENSION)
        enter_ext, exit_ext = _extension_call(tracer, patch, info)
        proxy = impl.around(ext, impl.switch(), enter_ext, exit_ext, patch.fail, proxy=True)
        if args:
            return None, (proxy, *args[1:]), kwargs
        return None, args, dict(kwargs, extension=proxy)

    return Around(enter, replace_args=True)


def _ours(ext: Any) -> bool:
    return getattr(ext, "_chainer_autoprof_switch", None) is not None


def _extension_call(tracer: Tracer, patch: Patch, info: RangeInfo) -> tuple[Any, Any]:
    """The hooks of a function extension's call: quiet, and its extension range."""
    state, begin, end = tracer.state, tracer.begin, tracer.end

    def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
        if not patch.on:
            return None
        ts = state()
        ts.quiet += 1
        tok = None
        try:
            tok = begin(info, ts)
        except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
            patch.fail(exc)
        return (ts, tok)

    def exit(st: Any, result: Any, exc: BaseException | None) -> None:
        ts, tok = st
        ts.quiet -= 1
        try:
            end(tok, ts)
        except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
            patch.fail(err)

    return enter, exit


def wrap_mpu_gather_grads(tracer: Tracer, patch: Patch) -> Around:
    """``multiprocess_parallel_updater.gather_grads``: the update phase begins.

    MultiprocessParallelUpdater workers never call an optimizer: their
    iteration is data, forward, backward, then the gradient reduce and the
    parameter broadcast from the master.  Gathering the gradients opens the
    update phase of an implicit iteration (in the master, whose iteration is the
    updater's, it opens the update phase that ``optimizer.update`` joins).
    """
    state = tracer.state

    def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
        ts = state()
        try:
            if ts.iter_busy and not ts.quiet:
                tracer.confirm_iteration(ts)  # a worker's update: its iteration is one
            if ts.iter_busy and ts.phase is None and not ts.quiet:
                tracer.begin_phase(ts, names.UPDATE)
        except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
            patch.fail(exc)
        return None

    return Around(enter)


def wrap_mpu_scatter_params(tracer: Tracer, patch: Patch) -> Around:
    """``multiprocess_parallel_updater.scatter_params``: a worker's iteration ends."""
    state = tracer.state

    def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
        return True

    def exit(st: Any, result: Any, exc: BaseException | None) -> None:
        if patch.on:
            ts = state()
            try:
                if ts.iter_busy and not ts.iter_explicit and not ts.quiet:
                    tracer.end_iteration(ts)
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(err)

    return Around(enter, exit)
