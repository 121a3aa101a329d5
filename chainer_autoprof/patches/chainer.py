"""What is wrapped in Chainer, and how each call maps to ranges.

Targets (each a :class:`~.base.Patch`):

* ``Updater.update`` (and overrides): the iteration boundary, one iteration
  however many optimizers a custom updater steps.
* ``Iterator.__next__``/``next`` and ``Converter.__call__`` /
  ``convert._call_converter``: the *data* phase.
* ``Link.__call__`` and every subclass's own ``__call__`` (old-style models):
  the *forward* phase at the outermost link, link ranges below it.
* ``Variable.backward``, ``chainer.grad`` and ``chainer.backward``: the
  *backward* phase.
* ``Optimizer.update`` (``GradientMethod.update``, overrides, delegating
  wrappers): the *update* phase, which is the parameter update itself; with a
  ``lossfun`` the loss call is the forward phase and the update phase starts
  when the backward inside it returns.  ``Optimizer.setup``: the optimizers a
  step may wait for (:mod:`.steps`).
* ``Extension.__call__`` (and overrides): an extension range; links called
  inside are not training.
* ``Trainer.run`` and ``Trainer.extend`` (:mod:`.trainer`): whatever the
  trainer runs outside ``Updater.update`` is not training, and extensions
  given as plain functions get an extension range too.
* ``FunctionNode.apply`` and ``_backprop_utils.backprop_step`` at function
  granularity (``backprop_step`` also at link granularity, for link ranges in
  backward), and the backward passes (``_backprop._backprop_to_all``,
  ``function_node._backprop``): a pass run inside another's backward
  (``F.forget``) keeps its link ranges inside the function running it.

Iterations (README, "What an iteration is"): an updater's ``update`` is one,
and on a thread that trains in an updater nothing outside it is training.
Without an updater, an iteration opens at the first training event after the
last one closed and closes when the step's last optimizer update returns
(:mod:`.steps`: with several optimizers, the last one the step waits for);
one that reaches no update is none (the tracer records it as such).  A
forward under ``train=False`` or ``no_backprop_mode`` outside an iteration is
*inference*.  Nothing here knows NVTX; no array or Variable is kept.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any, Callable

from ..common import names
from ..runtime.events import RangeInfo, ThreadState, Tracer
from . import trainer as trainer_patches
from .base import Around, Body, Hooks, Hot, Instrumentor, Patch
from .steps import Steps

if TYPE_CHECKING:
    from types import ModuleType

    import chainer

    from ..common.typedefs import AnyFunction, Args, Kwargs
    from ..runtime.events import ThreadState
    from .replay import Replay


def cut_short(exc: BaseException) -> bool:
    """Whether ``exc`` leaving a phase stops the step (not an iterator's end of data)."""
    return not isinstance(exc, (StopIteration, GeneratorExit))


class LinkEntry:
    """A link as seen in the call tree: its path, depth and ranges.

    ``index`` names the entry whose backward range covers this link's
    backward: its own, or for a link deeper than the depth limit, its
    nearest ancestor's.
    """

    __slots__ = ("__weakref__", "bwd_info", "children", "depth", "index", "info", "path", "ref")

    def __init__(self, ref: weakref.ref[Any], path: str, depth: int, index: int) -> None:
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
                 replay: Replay | None = None) -> None:
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
        self.steps = Steps(tracer)  # a step of a loop without an updater, several optimizers

    # -- targets ----------------------------------------------------------
    def targets(self, chainer: ModuleType) -> list[Patch]:
        # Chainer's submodules, once Chainer itself is imported (never imported by us first)
        from chainer import _backprop, _backprop_utils, function_node, link, optimizer, variable
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
            P("chainer.backward", _backprop, "backward", self._wrap_backward),
            P("Optimizer.update", optimizer.Optimizer, "update", self._wrap_optimizer,
              subclasses=True),
            P("Optimizer.setup", optimizer.Optimizer, "setup", self._wrap_setup,
              subclasses=True),
            P("Extension.__call__", extension.Extension, "__call__", self._wrap_extension,
              subclasses=True),
            P("Trainer.run", trainer.Trainer, "run",
              lambda p: trainer_patches.wrap_trainer_run(self.tracer, p)),
            P("Trainer.extend", trainer.Trainer, "extend",
              lambda p: trainer_patches.wrap_trainer_extend(self.tracer, p,
                                                           extension.Extension)),
        ]
        mpu: ModuleType | None
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
            patches += [
                P("_backprop_utils.backprop_step", _backprop_utils, "backprop_step",
                  self._wrap_backprop_step),
                # every backward pass: Variable.backward, chainer.backward, F.forget's
                # recomputation (_backprop_to_all), chainer.grad (function_node._backprop)
                P("_backprop._backprop_to_all", _backprop, "_backprop_to_all",
                  self._wrap_backward_pass),
                P("function_node._backprop", function_node, "_backprop",
                  self._wrap_backward_pass),
            ]
        if self.function_ranges:
            patches.append(P("FunctionNode.apply", function_node.FunctionNode, "apply",
                             self._wrap_function_apply))
        return patches

    def apply(self, chainer: ModuleType) -> None:
        super().apply(chainer)
        # ``chainer.grad`` and ``chainer.backward`` are re-exported at the top level: point
        # them at ours too.
        self._aliases: list[str] = []
        for name, wrapped in (("grad", chainer.function_node.grad),
                              ("backward", chainer._backprop.backward)):
            alias = chainer.__dict__.get(name)
            if alias is not None and alias is not wrapped:
                setattr(chainer, name, wrapped)
                self._aliases.append(name)

    def remove(self) -> None:
        chainer = self.module
        super().remove()
        if chainer is not None:
            originals = {"grad": chainer.function_node.grad,
                         "backward": chainer._backprop.backward}
            for name in getattr(self, "_aliases", ()):
                setattr(chainer, name, originals[name])

    # -- helpers ------------------------------------------------------------
    def _in_training_mode(self) -> bool:
        cfg = self.config
        return bool(cfg.train) and bool(cfg.enable_backprop)

    def _entry(self, link: chainer.Link, parent: LinkEntry | None) -> LinkEntry:
        table = parent.children if parent is not None else self.roots
        key = id(link)

        number = next(self._numbers)
        entries = self.entries

        def forget(_ref: Any, table: dict[int, Any] = table, key: int = key) -> None:
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

    def _gpu_of(self, link: chainer.Link) -> int | None:
        """The GPU id holding ``link``'s arrays (and register it for sync)."""
        try:
            device = link.device
        except Exception:  # a link without a device: no GPU to sync  # noqa: BLE001
            return None
        cupy_device = getattr(device, "device", None)
        dev_id = getattr(cupy_device, "id", None)
        xp = getattr(device, "xp", None)
        if isinstance(dev_id, int) and getattr(xp, "__name__", None) == "cupy":
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

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            ts = state()
            if ts.iter_explicit:
                return None
            lifted = ts.quiet
            if lifted:
                if lifted != ts.in_trainer:  # in an extension or inference: not training
                    return None
                ts.quiet = 0  # only Trainer.run's own quiet: its update is training
            try:
                ts.by_updater = True  # outside an updater, this thread no longer trains
                if ts.iter_busy:  # an implicit one left open: close it first
                    tracer.end_iteration(ts)
                tracer.begin_iteration(ts, explicit=True)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(exc)
            return (ts, lifted)

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            ts, lifted = st
            ts.quiet += lifted
            if ts.iter_explicit:  # (an error of ours goes to patch.fail: Around's promise)
                tracer.end_iteration(ts)

        return Around(enter, exit)

    def _wrap_data(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        state = tracer.state
        facts = tracer.facts
        is_iterator = patch.attr == "__next__"
        training = self._in_training_mode
        replay, kind = self.replay, patch.attr  # replay: the REPLAY_BATCH experiment
        steps = self.steps
        module_function = not isinstance(patch.owner, type)  # _call_converter(converter, ...)

        def open_data(ts: ThreadState, source: Any) -> bool:
            """``source``: the iterator or converter (what opens a step, when it opens one)."""
            if ts.quiet or ts.phase is not None:
                return False
            opened = False
            try:
                key = id(source)
                if ts.iter_owed and key == ts.loop_source:
                    steps.begins_again(ts)  # the loop's next batch: the next step
                # else: evaluation by hand, or outside the updater of an updater's thread
                if ts.iter_busy or (not ts.by_updater and training()):
                    opened = True
                    tracer.begin_phase(ts, names.DATA, key)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(exc)
            return opened

        def source_of(instance: Any, args: Args) -> Any:
            return (args[0] if args else None) if module_function else instance

        def examples(args: Args, kwargs: Kwargs) -> int:
            """The examples a converter is handed (its ``batch``: a list or tuple of them)."""
            if is_iterator:
                return 0
            at = 1 if module_function else 0
            batch = args[at] if len(args) > at else kwargs.get("batch")
            return len(batch) if type(batch) is list or type(batch) is tuple else 0

        def close_data(ts: ThreadState, instance: Any, result: Any,
                       exc: BaseException | None, converted: int = 0) -> None:
            try:
                tracer.end_phase(ts)
                if exc is not None and ts.iter_busy and not ts.iter_counts:
                    if cut_short(exc):
                        tracer.confirm_iteration(ts)  # the step was stopped: it counts
                    else:  # out of data: what the batches began reached no update
                        tracer.end_iteration(ts)
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(err)
            if exc is None:
                # the samples this step trains on, as many batches as it takes (gradient
                # accumulation), each as long as it is (a partial last one)
                ts.iter_converted += converted
                if is_iterator and (type(result) is list or type(result) is tuple):
                    ts.iter_samples += len(result)
            if is_iterator and type(result) is list:
                # the batch size: the longest training batch (not a partial last one)
                facts["batch_size"] = max(len(result), facts.get("batch_size") or 0)
                facts.setdefault("iterator", type(instance).__name__)

        if replay is not None:
            # The experiment replaces the call itself: a Python wrapper (a frame of ours).
            def body(wrapped: AnyFunction, instance: Any, args: Args, kwargs: Kwargs) -> Any:
                ts = state()
                if not open_data(ts, source_of(instance, args)):
                    return wrapped(*args, **kwargs)
                try:
                    result = replay.call(kind, wrapped, instance, args, kwargs)
                except BaseException as exc:
                    close_data(ts, instance, None, exc)
                    raise
                close_data(ts, instance, result, None, examples(args, kwargs))
                return result

            return Body(body)

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            ts = state()
            if not open_data(ts, source_of(instance, args)):
                return None
            try:
                return (ts, instance, examples(args, kwargs))
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(exc)
                return (ts, instance, 0)

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            close_data(st[0], st[1], result, exc, st[2])

        return Around(enter, exit)

    def _wrap_link(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        begin, end = tracer.begin, tracer.end
        training = self._in_training_mode
        inference_info = tracer.info(names.INFERENCE, names.INFERENCE)
        forward = (names.FORWARD,)  # the outermost link opened the forward phase
        steps = self.steps

        def outer_enter(instance: Any, ts: ThreadState) -> Any:
            """The outermost link: the forward phase, or an inference range."""
            if ts.quiet:
                return None
            if steps.many and not ts.iter_explicit and not ts.by_updater:
                steps.called(ts, instance)  # which models take part in the step
            # not training: test mode or no backprop, or an updater's thread outside it
            if not training() or (ts.by_updater and not ts.iter_busy):
                if ts.iter_by_data and not ts.iter_trained and ts.phase is None \
                        and ts.loop_source is not None and ts.iter_opener != ts.loop_source:
                    steps.evaluation(ts)  # batches from elsewhere than the loop's, evaluated
                if not ts.iter_busy or ts.phase is None:
                    tok = begin(inference_info, ts)
                    ts.quiet += 1
                    return [tok]
                return None
            if ts.phase is None:
                try:
                    if ts.iter_owed and ts.iter_opener == id(instance):
                        steps.begins_again(ts)  # the model that began the step: the next one
                    tracer.begin_phase(ts, names.FORWARD, id(instance))
                except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                    patch.fail(exc)  # closed after the call, as the phase it opened
                return forward
            return None

        def outer_exit(ts: ThreadState, mode: Any) -> None:
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

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            ts = state()
            if ts.quiet or ts.phase is not None or (ts.by_updater and not ts.iter_busy):
                return None  # inside a phase, or an updater's thread outside it: no phase
            try:
                tracer.begin_phase(ts, names.BACKWARD)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(exc)  # closed below, as after a call
            return ts

        def exit(ts: ThreadState, result: Any, exc: BaseException | None) -> None:
            # (an error of ours goes to patch.fail, and the call goes on: Around's promise)
            if exc is not None and cut_short(exc) and ts.iter_busy:
                tracer.confirm_iteration(ts)  # the step was stopped: it counts
            if ts.bwd_link_tok is not None:
                tracer.end(ts.bwd_link_tok, ts)
            ts.bwd_link = ts.bwd_link_tok = None
            if ts.phase == names.BACKWARD:
                tracer.end_phase(ts)
            if ts.await_update:  # inside Optimizer.update(lossfun): the update follows
                ts.await_update = False
                if exc is None and patch.on:
                    tracer.begin_phase(ts, names.UPDATE)

        return Around(enter, exit)

    def _wrap_optimizer(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        state = tracer.state
        impl = self.impl

        def loss_enter(ts: ThreadState, args: Args, kwargs: Kwargs) -> Any:
            if not patch.on or ts.phase is not None:
                return None
            try:
                tracer.begin_phase(ts, names.FORWARD)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(exc)
            return ts

        def loss_exit(ts: ThreadState, result: Any, exc: BaseException | None) -> None:
            try:
                tracer.end_phase(ts)
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(err)

        def forward_phase(ts: ThreadState, lossfun: AnyFunction) -> AnyFunction:
            """The loss function as the forward phase (its call is made from C natively)."""
            switch = impl.switch()

            def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
                return loss_enter(ts, args, kwargs)

            return impl.around(lossfun, switch, enter, loss_exit, patch.fail)

        steps = self.steps

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            ts = state()
            if ts.quiet:
                return None
            outer = ts.opt_depth == 0
            ts.opt_depth += 1
            opened_update = awaiting = again = False
            call_args, call_kwargs = args, kwargs
            try:
                if not ts.iter_explicit:  # a loop of the program's own: this update is a step's
                    if outer:
                        ts.by_updater = False  # an update by hand: training outside an updater
                        if not ts.iter_busy:
                            tracer.begin_iteration(ts, explicit=False, opener=id(instance))
                        tracer.confirm_iteration(ts)
                        if ts.iter_by_data:  # where the loop's steps get their batches
                            ts.loop_source = ts.iter_opener
                    again = steps.updating(ts, instance) and outer
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
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(exc)  # the user's own arguments; what was opened is closed below
                call_args, call_kwargs = args, kwargs
            return (ts, outer, opened_update, awaiting, again), call_args, call_kwargs

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            ts, outer, opened_update, awaiting, again = st
            try:
                ts.opt_depth -= 1
                if opened_update or (awaiting and ts.phase == names.UPDATE):
                    tracer.end_phase(ts)
                if awaiting:
                    ts.await_update = False
                if outer and ts.iter_busy and not ts.iter_explicit:
                    if exc is not None:
                        tracer.end_iteration(ts)
                    else:  # the step's last update ends it
                        steps.after_update(ts, again)
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(err)

        return Around(enter, exit, replace_args=True)

    def _wrap_setup(self, patch: Patch) -> Hooks:
        """``Optimizer.setup``: the optimizers a step of a loop without an updater may wait for."""
        steps = self.steps

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            return instance

        def exit(optimizer: chainer.Optimizer, result: Any, exc: BaseException | None) -> None:
            if exc is None:
                steps.set_up(optimizer)

        return Around(enter, exit)

    def _wrap_backward_pass(self, patch: Patch) -> Hooks:
        """A backward pass (``_backprop_to_all``, chainer.grad's ``_backprop``) in the backward
        phase keeps the link backward ranges it opens to itself.

        Link backward ranges follow one another as the pass goes from link to link.  A pass
        run inside another's function (``F.forget`` recomputing its function during the
        backward, a FunctionNode whose backward calls ``chainer.grad``) opens its own inside
        that function's range: they end with the pass, and the outer pass goes on in the link
        range it was in, so that every range ends inside its parent.
        """
        tracer = self.tracer
        state, end = tracer.state, tracer.end

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            ts = state()
            if ts.phase != names.BACKWARD:
                return None
            outer = (ts.bwd_link, ts.bwd_link_tok)
            ts.bwd_link = ts.bwd_link_tok = None
            return ts, outer

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            ts, (link, tok) = st
            try:
                if ts.bwd_link_tok is not None:
                    end(ts.bwd_link_tok, ts)
            finally:
                ts.bwd_link, ts.bwd_link_tok = link, tok

        return Around(enter, exit)

    def _wrap_extension(self, patch: Patch) -> Hooks:
        tracer = self.tracer
        state, begin, end = tracer.state, tracer.begin, tracer.end
        cache: dict[tuple[Any, type], RangeInfo] = {}  # (the extension's name, its class)

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
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
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(exc)
            return (ts, previous, tok) if entered else None

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            ts, previous, tok = st
            ts.quiet -= 1
            ts.extension = previous
            end(tok, ts)  # (an error of ours goes to patch.fail: Around's promise)

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
