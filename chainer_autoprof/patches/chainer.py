"""What is wrapped in Chainer, and how each call maps to ranges.

Targets (each a :class:`~.base.Patch`):

* ``Updater.update`` (and overrides): the iteration boundary, one iteration
  however many optimizers a custom updater steps.
* ``Iterator.__next__``/``next`` and ``Converter.__call__`` /
  ``convert._call_converter``: the *data* phase.
* ``Link.__call__`` and every subclass's own ``__call__`` (old-style models):
  the *forward* phase at the outermost link, link ranges below it.
* ``Variable.backward`` and ``chainer.grad``: the *backward* phase.
* ``Optimizer.update`` (``GradientMethod.update``, overrides, delegating
  wrappers): the *update* phase, which is the parameter update itself; with a
  ``lossfun`` the loss call is the forward phase and the update phase starts
  when the backward inside it returns.
* ``Extension.__call__`` (and overrides): an extension range; links called
  inside are not training.
* ``Trainer.run`` and ``Trainer.extend`` (:mod:`.trainer`): whatever the
  trainer runs outside ``Updater.update`` is not training, and extensions
  given as plain functions get an extension range too.
* ``FunctionNode.apply`` and ``_backprop_utils.backprop_step`` at function
  granularity (``backprop_step`` also at link granularity, for link ranges in
  backward).

Without an updater, an iteration opens at the first instrumented event after
the last one closed and closes when the outermost optimizer update returns.
A forward under ``train=False`` or ``no_backprop_mode`` outside an iteration is
*inference*.  Nothing here knows NVTX; no array or Variable is kept.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable

from ..common import names
from ..runtime.events import RangeInfo, ThreadState, Tracer
from . import trainer as trainer_patches
from .base import Around, Body, Hooks, Hot, Instrumentor, Patch


class LinkEntry:
    """A link as seen in the call tree: its path, depth and ranges.

    ``index`` names the entry whose backward range covers this link's
    backward: its own, or for a link deeper than the depth limit, its
    nearest ancestor's.
    """

    __slots__ = ("__weakref__", "bwd_info", "children", "depth", "index", "info", "path", "ref")

    def __init__(self, ref: weakref.ref, path: str, depth: int, index: int) -> None:
        self.ref = ref
        self.path = path
        self.depth = depth
        self.index = index
        self.info: RangeInfo | None = None
        self.bwd_info: RangeInfo | None = None
        self.children: dict[int, LinkEntry] = {}


class ChainerPatches(Instrumentor):
    """The Chainer patch set for one tracer."""

    library = "chainer"
    name = "Chainer"
    supported_majors = (6, 7)

    def __init__(self, tracer: Tracer, link_depth: int = 0,
                 replay: Any = None) -> None:
        super().__init__(tracer.hotpath)
        self.tracer = tracer
        self.link_depth = link_depth
        self.replay = replay  # optional: data-phase replay experiment hooks
        self.roots: dict[int, LinkEntry] = {}
        self.entries: dict[int, LinkEntry] = {}  # by number, while the link lives
        self._numbers = itertools.count()  # thread-safe numbering
        self.link_ranges = tracer.granularity_level >= names.LINK_LEVEL
        self.function_ranges = tracer.granularity_level >= names.FUNCTION_LEVEL
        self.config: Any = None
        self.variable_cls: Any = None

    # -- targets ----------------------------------------------------------
    def targets(self, chainer: Any) -> list[Patch]:
        # Chainer's submodules, once Chainer itself is imported (never imported by us first)
        from chainer import _backprop_utils, function_node, link, optimizer, variable
        from chainer.dataset import convert, iterator
        from chainer.training import extension, trainer, updater

        self.config = chainer.config
        self.variable_cls = variable.Variable
        self.function_node_cls = function_node.FunctionNode
        P = Patch  # noqa: N806
        patches = [
            P("Updater.update", updater.Updater, "update", self._wrap_updater, subclasses=True),
            P("Iterator.__next__", iterator.Iterator, "__next__", self._wrap_data,
              subclasses=True, also=("next",)),
            P("Converter.__call__", convert.Converter, "__call__", self._wrap_data,
              subclasses=True),
            P("convert._call_converter", convert, "_call_converter", self._wrap_data),
            P("Link.__call__", link.Link, "__call__", self._wrap_link, subclasses=True),
            P("Variable.backward", variable.Variable, "backward", self._wrap_backward),
            P("chainer.grad", function_node, "grad", self._wrap_backward),
            P("Optimizer.update", optimizer.Optimizer, "update", self._wrap_optimizer,
              subclasses=True),
            P("Extension.__call__", extension.Extension, "__call__", self._wrap_extension,
              subclasses=True),
            P("Trainer.run", trainer.Trainer, "run",
              lambda p: trainer_patches.wrap_trainer_run(self.tracer, p)),
            P("Trainer.extend", trainer.Trainer, "extend",
              lambda p: trainer_patches.wrap_trainer_extend(self.tracer, p,
                                                           extension.Extension)),
        ]
        try:
            # Chainer's, like the rest (it is missing from some builds)
            from chainer.training.updaters import multiprocess_parallel_updater as mpu
        except ImportError:
            mpu = None
        if mpu is not None:
            patches += [
                P("MultiprocessParallelUpdater gather_grads", mpu, "gather_grads",
                  lambda p: trainer_patches.wrap_mpu_gather_grads(self.tracer, p)),
                P("MultiprocessParallelUpdater scatter_params", mpu, "scatter_params",
                  lambda p: trainer_patches.wrap_mpu_scatter_params(self.tracer, p)),
            ]
        if self.link_ranges:
            patches.append(P("_backprop_utils.backprop_step", _backprop_utils, "backprop_step",
                             self._wrap_backprop_step))
        if self.function_ranges:
            patches.append(P("FunctionNode.apply", function_node.FunctionNode, "apply",
                             self._wrap_function_apply))
        return patches

    def apply(self, chainer: Any) -> None:
        super().apply(chainer)
        # ``chainer.grad`` is re-exported at the top level: point it at ours too.
        grad = chainer.function_node.grad
        self._grad_alias = chainer.__dict__.get("grad")
        if self._grad_alias is not None and self._grad_alias is not grad:
            chainer.grad = grad

    def remove(self) -> None:
        chainer = self.module
        super().remove()
        if chainer is not None and getattr(self, "_grad_alias", None) is not None:
            chainer.grad = chainer.function_node.grad

    # -- helpers ------------------------------------------------------------
    def _in_training_mode(self) -> bool:
        cfg = self.config
        return bool(cfg.train) and bool(cfg.enable_backprop)

    def _entry(self, link: Any, parent: LinkEntry | None) -> LinkEntry:
        table = parent.children if parent is not None else self.roots
        key = id(link)

        number = next(self._numbers)
        entries = self.entries

        def forget(_ref: Any, table: dict = table, key: int = key) -> None:
            table.pop(key, None)
            entries.pop(number, None)  # links made on the fly must not pile up

        name = getattr(link, "name", None)
        cls_name = type(link).__name__
        if parent is None:
            path, depth = (name or ""), 1
        else:
            own = name or cls_name
            path = f"{parent.path}/{own}" if parent.path else own
            depth = parent.depth + 1
        entry = LinkEntry(weakref.ref(link, forget), path, depth, number)
        device = self._gpu_of(link)
        if self.link_ranges:
            if self.link_depth == 0 or depth <= self.link_depth:
                text = names.link_text(path, cls_name,
                                       f"gpu{device}" if device is not None else "")
                entry.info = self.tracer.info(text, names.LINK)
                entry.bwd_info = self.tracer.info(names.link_backward_text(text),
                                                  names.LINK_BACKWARD)
            elif parent is not None:  # deeper than the limit: its backward is its ancestor's
                entry.index = parent.index
        entries[number] = entry
        table[key] = entry
        return entry

    def _gpu_of(self, link: Any) -> int | None:
        """The GPU id holding ``link``'s arrays (and register it for sync)."""
        try:
            device = link.device
        except Exception:
            return None
        cupy_device = getattr(device, "device", None)
        dev_id = getattr(cupy_device, "id", None)
        if isinstance(dev_id, int) and getattr(device, "xp", None).__name__ == "cupy":
            self.tracer.sync.add_devices((dev_id,))
            return dev_id
        return None

    # -- wrappers -----------------------------------------------------------
    # Each make-hooks receives its Patch and returns the hooks its wrapper calls
    # (see :mod:`.base`): our bookkeeping before and after the call, inside
    # try/except (fail -> patch off, call through); the user's call is made by
    # the wrapper, its exception untouched.

    def _wrap_updater(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        state = tracer.state

        def enter(instance: Any, args: tuple, kwargs: dict) -> Any:
            ts = state()
            if ts.iter_explicit:
                return None
            lifted = ts.quiet
            if lifted:
                if lifted != ts.in_trainer:  # in an extension or inference: not training
                    return None
                ts.quiet = 0  # only Trainer.run's own quiet: its update is training
            try:
                if ts.iter_busy:  # an implicit one left open: close it first
                    tracer.end_iteration(ts)
                tracer.begin_iteration(ts, explicit=True)
            except Exception as exc:
                patch.fail(exc)
            return (ts, lifted)

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            ts, lifted = st
            ts.quiet += lifted
            if ts.iter_explicit:
                try:
                    tracer.end_iteration(ts)
                except Exception as err:
                    patch.fail(err)

        return Around(enter, exit)

    def _wrap_data(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        state = tracer.state
        facts = tracer.facts
        is_iterator = patch.attr == "__next__"
        training = self._in_training_mode
        replay, kind = self.replay, patch.attr  # replay: the REPLAY_BATCH experiment

        def open_data(ts: Any) -> bool:
            if ts.quiet or ts.phase is not None:
                return False
            opened = False
            try:
                if ts.iter_busy or training():  # else: evaluation by hand
                    opened = True
                    tracer.begin_phase(ts, names.DATA)
            except Exception as exc:
                patch.fail(exc)
            return opened

        def close_data(ts: Any, instance: Any, result: Any) -> None:
            try:
                tracer.end_phase(ts)
            except Exception as exc:
                patch.fail(exc)
            if is_iterator and type(result) is list:
                facts["batch_size"] = len(result)
                facts.setdefault("iterator", type(instance).__name__)

        if replay is not None:
            # The experiment replaces the call itself: a Python wrapper (a frame of ours).
            def body(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
                ts = state()
                if not open_data(ts):
                    return wrapped(*args, **kwargs)
                result = None
                try:
                    result = replay.call(kind, wrapped, instance, args, kwargs)
                finally:
                    close_data(ts, instance, result)
                return result

            return Body(body)

        def enter(instance: Any, args: tuple, kwargs: dict) -> Any:
            ts = state()
            return (ts, instance) if open_data(ts) else None

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            close_data(st[0], st[1], result)

        return Around(enter, exit)

    def _wrap_link(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        begin, end = tracer.begin, tracer.end
        training = self._in_training_mode
        inference_info = tracer.info(names.INFERENCE, names.INFERENCE)
        forward = (names.FORWARD,)  # the outermost link opened the forward phase

        def outer_enter(instance: Any, ts: Any) -> Any:
            """The outermost link: the forward phase, or an inference range."""
            if ts.quiet:
                return None
            if not training():
                if not ts.iter_busy or ts.phase is None:
                    tok = begin(inference_info, ts)
                    ts.quiet += 1
                    return [tok]
                return None
            if ts.phase is None:
                try:
                    tracer.begin_phase(ts, names.FORWARD)
                except Exception as exc:
                    patch.fail(exc)  # closed after the call, as the phase it opened
                return forward
            return None

        def outer_exit(ts: Any, mode: Any) -> None:
            if mode is forward:
                tracer.end_phase(ts)
            else:
                ts.quiet -= 1
                end(mode[0], ts)

        return Hot("link_wrapper", core=tracer.core, roots=self.roots,
                   make_entry=self._entry, outer_enter=outer_enter, outer_exit=outer_exit,
                   entry_cls=LinkEntry, variable_cls=self.variable_cls,
                   # Below the link level only the outermost link matters (forward phase,
                   # inference): the links it calls need no entry and no bookkeeping at all.
                   inner_links_matter=self.link_ranges,
                   attribute_backward=self.link_ranges and not self.function_ranges)

    def _wrap_backward(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        state = tracer.state

        def enter(instance: Any, args: tuple, kwargs: dict) -> Any:
            ts = state()
            if ts.quiet or ts.phase is not None:
                return None
            try:
                tracer.begin_phase(ts, names.BACKWARD)
            except Exception as exc:
                patch.fail(exc)  # closed below, as after a call
            return ts

        def exit(ts: Any, result: Any, exc: BaseException | None) -> None:
            try:
                if ts.bwd_link_tok is not None:
                    tracer.end(ts.bwd_link_tok, ts)
                ts.bwd_link = ts.bwd_link_tok = None
                if ts.phase == names.BACKWARD:
                    tracer.end_phase(ts)
                if ts.await_update:  # inside Optimizer.update(lossfun): the update follows
                    ts.await_update = False
                    if exc is None and patch.on:
                        tracer.begin_phase(ts, names.UPDATE)
            except Exception as err:
                patch.fail(err)

        return Around(enter, exit)

    def _wrap_optimizer(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        state = tracer.state
        impl = self.impl

        def loss_enter(ts: Any, args: tuple, kwargs: dict) -> Any:
            if not patch.on or ts.phase is not None:
                return None
            try:
                tracer.begin_phase(ts, names.FORWARD)
            except Exception as exc:
                patch.fail(exc)
            return ts

        def loss_exit(ts: Any, result: Any, exc: BaseException | None) -> None:
            try:
                tracer.end_phase(ts)
            except Exception as err:
                patch.fail(err)

        def forward_phase(ts: ThreadState, lossfun: Callable) -> Callable:
            """The loss function as the forward phase (its call is made from C natively)."""
            switch = impl.switch()

            def enter(instance: Any, args: tuple, kwargs: dict) -> Any:
                return loss_enter(ts, args, kwargs)

            return impl.around(lossfun, switch, enter, loss_exit, patch.fail)

        def enter(instance: Any, args: tuple, kwargs: dict) -> Any:
            ts = state()
            if ts.quiet:
                return None
            outer = ts.opt_depth == 0
            ts.opt_depth += 1
            opened_update = awaiting = False
            call_args, call_kwargs = args, kwargs
            try:
                if outer and not ts.iter_busy:
                    tracer.begin_iteration(ts, explicit=False)
                lossfun = args[0] if args else kwargs.get("lossfun")
                if lossfun is not None:
                    if args:
                        call_args = (forward_phase(ts, lossfun), *args[1:])
                    else:
                        call_kwargs = dict(kwargs, lossfun=forward_phase(ts, lossfun))
                    if not ts.await_update:
                        ts.await_update = awaiting = True
                elif ts.phase is None:
                    opened_update = True
                    tracer.begin_phase(ts, names.UPDATE)
            except Exception as exc:
                patch.fail(exc)  # the user's own arguments; what was opened is closed below
                call_args, call_kwargs = args, kwargs
            return (ts, outer, opened_update, awaiting), call_args, call_kwargs

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            ts, outer, opened_update, awaiting = st
            try:
                ts.opt_depth -= 1
                if opened_update or (awaiting and ts.phase == names.UPDATE):
                    tracer.end_phase(ts)
                if awaiting:
                    ts.await_update = False
                if outer and ts.iter_busy and not ts.iter_explicit:
                    tracer.end_iteration(ts)
            except Exception as err:
                patch.fail(err)

        return Around(enter, exit, replace_args=True)

    def _wrap_extension(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        state, begin, end = tracer.state, tracer.begin, tracer.end
        cache: dict[tuple[str, type], RangeInfo] = {}

        def enter(instance: Any, args: tuple, kwargs: dict) -> Any:
            ts = state()
            if ts.extension is instance:  # super().__call__ of the same extension
                return None
            previous = ts.extension
            entered = False
            tok = None
            try:
                cls = type(instance)
                name = getattr(instance, "name", None) or getattr(instance, "default_name", "")
                info = cache.get((name, cls))
                if info is None:
                    info = tracer.info(names.extension_text(str(name), cls.__name__),
                                       names.EXTENSION)
                    if tracer.kept(info):  # a name past the tracer's cap: not cached
                        cache[(name, cls)] = info
                ts.quiet += 1
                ts.extension = instance
                entered = True
                tok = begin(info, ts)
            except Exception as exc:
                patch.fail(exc)
            return (ts, previous, tok) if entered else None

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            ts, previous, tok = st
            ts.quiet -= 1
            ts.extension = previous
            try:
                end(tok, ts)
            except Exception as err:
                patch.fail(err)

        return Around(enter, exit)

    def _function_info(self, backward: bool) -> Callable[[str], tuple[RangeInfo, bool]]:
        """The hot path's ``new_info(label) -> (info, cache)``: a label past the tracer's cap
        of names (labels such as ``_ * 0.37`` never end) must not be cached."""
        tracer = self.tracer

        def new_info(label: str) -> tuple[RangeInfo, bool]:
            info = tracer.info(names.function_text(label, backward), names.FUNCTION)
            return info, tracer.kept(info)

        return new_info

    def _wrap_backprop_step(self, patch: Patch) -> Hooks:
        return Hot("backprop_wrapper", core=self.tracer.core,
                   new_info=self._function_info(True),
                   default_label=self.function_node_cls.__dict__.get("label"),
                   entry_cls=LinkEntry, entries=self.entries, backward=names.BACKWARD,
                   function_ranges=self.function_ranges, method=False)

    def _wrap_function_apply(self, patch: Patch) -> Hooks:
        return Hot("apply_wrapper", core=self.tracer.core,
                   new_info=self._function_info(False),
                   default_label=self.function_node_cls.__dict__.get("label"),
                   entry_cls=LinkEntry, method=True)
