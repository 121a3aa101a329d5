"""The pure-Python twin's wrappers (twin of ``wrappers.c``): what replaces a patched function.

Every wrapper is a plain function (so bound methods of instrumented classes
are plain bound methods: they pickle and deepcopy), with the same behaviour
as its native twin, call for call.  What Python cannot give: the wrapper is
one Python frame per call, so it shows in tracebacks (the launcher's printer
and the agent's uncaught-exception hook leave it out) and counts towards the
recursion limit.  The specialized wrappers call the Python :class:`~.core.Core`
(its ``state``/``begin``/``end``, and its thread-local read inline).
"""

from __future__ import annotations

import functools
import types
from typing import TYPE_CHECKING, Any, Callable, cast

from .core import Core
from .protocol import CoreLike, SwitchLike

if TYPE_CHECKING:
    from ...common.typedefs import AnyFunction

#: The attribute naming the owning link's entry index on a FunctionNode.
LINK_ATTR = "_chainer_autoprof_link"


class Switch:
    """A patch's state: ``on`` (the hook runs) and ``hits`` (calls seen)."""

    __slots__ = ("hits", "on")

    def __init__(self) -> None:
        self.on = True
        self.hits = 0


def switch_of(obj: Any) -> Any:
    """The switch of a wrapper of ours (made by either implementation), else None."""
    try:
        return getattr(obj, "_chainer_autoprof_switch", None) if callable(obj) else None
    except Exception:  # any object: an odd __getattr__ is not ours  # noqa: BLE001
        return None


def is_wrapper(obj: Any) -> bool:
    return switch_of(obj) is not None


def finish(original: AnyFunction, wrapper: AnyFunction, switch: SwitchLike) -> AnyFunction:
    """``wrapper`` made to look like ``original`` (name, doc, ``__wrapped__``), marked as ours."""
    # a function's own attributes too (``__isabstractmethod__``, ...); not an object's
    updated = ("__dict__",) if isinstance(original, types.FunctionType) else ()
    functools.update_wrapper(wrapper, original, updated=updated)
    wrapper._chainer_autoprof_switch = switch  # type: ignore[attr-defined]
    return wrapper


def _contain(fail: Callable[[BaseException], Any], exc: Exception) -> None:
    fail(exc)


class _Proxy:
    """A callable object wrapped with ``around(..., proxy=True)``: attribute reads go through."""

    __slots__ = ("__wrapped__", "_chainer_autoprof_call", "_chainer_autoprof_switch")

    def __init__(self, original: Any, call: AnyFunction, switch: SwitchLike) -> None:
        object.__setattr__(self, "__wrapped__", original)
        object.__setattr__(self, "_chainer_autoprof_call", call)
        object.__setattr__(self, "_chainer_autoprof_switch", switch)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._chainer_autoprof_call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__wrapped__, name, value)

    def __repr__(self) -> str:
        return f"<chainer_autoprof wrapper of {self.__wrapped__!r}>"


def around(original: AnyFunction, switch: SwitchLike, enter: AnyFunction, exit: Any,
           fail: Callable[[BaseException], Any], method: bool = False,
           replace_args: bool = False, proxy: bool = False) -> AnyFunction:
    """A wrapper calling ``enter`` before and ``exit`` after the original.

    ``enter(instance, args, kwargs)`` (``instance`` None unless ``method``)
    returns None (call straight through, no exit) or a state; with
    ``replace_args``, ``(state, args, kwargs)`` to call the original with
    (state None: no exit).  ``exit(state, result, exc)`` runs after the call,
    whether it returned or raised.  An Exception in either goes to ``fail``
    and the call goes on.
    """

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        switch.hits += 1
        if not switch.on:
            return original(*args, **kwargs)
        if method:
            if not args:
                return original(*args, **kwargs)
            instance, rest = args[0], args[1:]
        else:
            instance, rest = None, args
        try:
            state = enter(instance, rest, kwargs)
        except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
            _contain(fail, exc)
            state = None
        if state is None:
            return original(*args, **kwargs)
        call_args, call_kwargs = args, kwargs
        if replace_args:
            try:
                state, new_args, call_kwargs = state
                if type(new_args) is not tuple or type(call_kwargs) is not dict:
                    raise TypeError("enter() must return (state, tuple, dict)")
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                _contain(fail, exc)
                return original(*args, **kwargs)
            call_args = (instance, *new_args) if method else new_args
            if state is None:
                return original(*call_args, **call_kwargs)
        if exit is None:
            return original(*call_args, **call_kwargs)
        try:
            result = original(*call_args, **call_kwargs)
        except BaseException as exc:
            try:
                exit(state, None, exc)
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                _contain(fail, err)
            raise
        try:
            exit(state, result, None)
        except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
            _contain(fail, err)
        return result

    if proxy:
        return _Proxy(original, wrapper, switch)
    return finish(original, wrapper, switch)


def link_wrapper(original: AnyFunction, switch: SwitchLike, fail: AnyFunction, core: CoreLike, *,
                 roots: dict[int, Any], make_entry: AnyFunction, outer_enter: AnyFunction,
                 outer_exit: AnyFunction, entry_cls: type, variable_cls: type,
                 inner_links_matter: bool, attribute_backward: bool) -> AnyFunction:
    """The ``Link.__call__`` wrapper: the link call tree, its ranges, the backward owner.

    Per call: find the link's entry under its parent's (``make_entry`` on a
    miss), push the entry on the thread's link stack (``ts.links``), begin the
    entry's range.  At the outermost link ``outer_enter(link, ts)`` opens the
    forward phase or an inference range (returns what ``outer_exit(ts, mode)``
    closes).  A link called inside the same link (``super().__call__``)
    passes through, and below link granularity every inner link does.  The
    innermost link that returned a Variable owns its creator node's backward.
    """
    state, begin, end = core.state, core.begin, core.end
    local = cast(Core, core)._local  # this twin's core: its thread-local, read inline (no call)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        switch.hits += 1
        if not switch.on or not args:
            return original(*args, **kwargs)
        instance = args[0]
        try:
            ts = local.state
        except AttributeError:
            ts = state()
        links = ts.links
        if links:
            parent = links[-1]
            if parent.ref() is instance or not inner_links_matter:
                return original(*args, **kwargs)  # super().__call__ of the same link, or inner
        else:
            parent = None
        mode = tok = entry = None
        pushed = False
        try:
            table = parent.children if parent is not None else roots
            entry = table.get(id(instance))
            if entry is None or entry.ref() is not instance:
                entry = make_entry(instance, parent)
            if parent is None:
                mode = outer_enter(instance, ts)
            links.append(entry)
            pushed = True
            info = entry.info
            if info is not None:
                tok = begin(info, ts)
        except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
            _contain(fail, exc)  # what was opened is closed below, as after a call
        except BaseException:
            if pushed:
                links.pop()
            if mode is not None:
                outer_exit(ts, mode)
            raise
        try:
            out = original(*args, **kwargs)
        finally:
            if pushed:
                try:
                    links.pop()
                except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                    _contain(fail, exc)
            if tok is not None:
                try:
                    end(tok, ts)
                except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                    _contain(fail, exc)
            if mode is not None:
                try:
                    outer_exit(ts, mode)
                except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                    _contain(fail, exc)
        if attribute_backward and pushed and isinstance(out, variable_cls):
            try:  # the innermost link that returned it owns its backward
                node = getattr(getattr(out, "_node", None), "_creator_node", None)
                if node is not None and getattr(node, LINK_ATTR, None) is None:
                    setattr(node, LINK_ATTR, entry.index)  # type: ignore[union-attr]  # pushed: set
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                _contain(fail, exc)
        return out

    return finish(original, wrapper, switch)


def _function_info(infos: dict[Any, Any], new_info: AnyFunction, node: Any) -> Any:
    label = node.label
    info = infos.get(label)
    if info is None:
        info, cache = new_info(label)
        if cache:  # not a label past the tracer's cap of names ("_ * 0.37" never ends)
            infos[label] = info
    return info


def apply_wrapper(original: AnyFunction, switch: SwitchLike, fail: AnyFunction, core: CoreLike,
                  new_info: AnyFunction, default_label: Any, entry_cls: type,
                  entries: Any = None, backward: Any = None, function_ranges: bool = True,
                  method: bool = True) -> AnyFunction:
    """The ``FunctionNode.apply`` wrapper: a function range, and its owner for backward.

    ``new_info(label) -> (info, cache)`` makes the range of a label seen the first time (the
    native twin keeps one per class while ``label`` is ``default_label``).
    """
    return _function_wrapper(original, switch, fail, core, new_info, backprop=False)


def backprop_wrapper(original: AnyFunction, switch: SwitchLike, fail: AnyFunction,
                     core: CoreLike, new_info: AnyFunction, default_label: Any,
                     entry_cls: type, entries: Any = None, backward: Any = None,
                     function_ranges: bool = True, method: bool = False) -> AnyFunction:
    """The ``backprop_step`` wrapper: link backward ranges, and function ranges.

    In the backward phase (``ts.phase == backward``): the node's owning link
    (its entry index in ``entries``) opens that link's backward range when it
    changes; at function granularity a node no link owns closes it, and every
    node gets a function range.
    """
    return _function_wrapper(original, switch, fail, core, new_info, backprop=True,
                             entries=entries, backward=backward,
                             function_ranges=function_ranges)


def _function_wrapper(original: AnyFunction, switch: SwitchLike, fail: AnyFunction,
                      core: CoreLike, new_info: AnyFunction, *, backprop: bool,
                      entries: Any = None, backward: Any = None,
                      function_ranges: bool = True) -> AnyFunction:
    """Both function wrappers in one body: what opens the range differs (``backprop``, a
    constant of the closure, picks it), the thread's state and the range's end do not."""
    state, begin, end = core.state, core.begin, core.end
    local = cast(Core, core)._local
    infos: dict[str, Any] = {}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        switch.hits += 1
        if not switch.on:
            return original(*args, **kwargs)
        try:
            ts = local.state
        except AttributeError:
            ts = state()
        tok = None
        if not backprop:
            if not args:
                return original(*args, **kwargs)
            node = args[0]
            try:
                info = _function_info(infos, new_info, node)
                links = ts.links
                if links:  # the innermost link being called owns its backward
                    setattr(node, LINK_ATTR, links[-1].index)
                tok = begin(info, ts)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                _contain(fail, exc)
        elif ts.phase != backward:
            return original(*args, **kwargs)
        else:
            try:
                func = args[0] if args else kwargs["func"]
                # The link that owns this node: at link granularity the innermost link
                # that returned its output (a node no link returned, such as an activation
                # between two links, stays in the current range); at function granularity
                # the innermost link it was applied in (none: outside every link).
                owner = getattr(func, LINK_ATTR, None)
                if owner is not None:
                    if owner != ts.bwd_link:
                        if ts.bwd_link_tok is not None:
                            end(ts.bwd_link_tok, ts)
                        ts.bwd_link = owner
                        entry = entries.get(owner)
                        info = entry.bwd_info if entry is not None else None
                        ts.bwd_link_tok = None
                        ts.bwd_link_tok = begin(info, ts) if info is not None else None
                elif function_ranges and ts.bwd_link is not None:
                    if ts.bwd_link_tok is not None:
                        end(ts.bwd_link_tok, ts)
                    ts.bwd_link = ts.bwd_link_tok = None
                if function_ranges:
                    tok = begin(_function_info(infos, new_info, func), ts)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                _contain(fail, exc)
        if tok is None:
            return original(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            try:
                end(tok, ts)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                _contain(fail, exc)

    return finish(original, wrapper, switch)
