"""The hot path's protocol: what each implementation module provides, checked when it loads.

Two modules implement it: the native extension ``_native`` (built from the C
files of this directory) and :mod:`.python`, its pure-Python twin.
:class:`HotPath` is the interface, as a :class:`typing.Protocol` a type
checker holds the Python twin to; :func:`check` verifies the extension
against it when it is loaded (every name present and of the right kind, the
same :data:`PROTOCOL`), so that a stale or broken build is reported with the
reason and the Python twin runs instead.

:data:`PROTOCOL` is defined here and nowhere else: ``build.py`` hands it to
the C compiler (``-DCHAINER_AUTOPROF_PROTOCOL=N``), so an extension built
before a change of the protocol says so.  Bump it whenever what the
implementations expect of their callers changes (a callback's arguments, a
slot the C code reads, a sink entry's shape).

Sinks reach the core as entries ``(native, begin, end, mask)``: ``native``
is a part made by the implementation (its ``NvtxDomain`` or ``RecorderHook``)
that the native core runs in C instead of calling ``begin``/``end`` (the
Python core always calls them); ``mask`` is the sink's category mask (bits
of :data:`..common.names.CATEGORY_BITS`, ``-1``: every category): a range is
handed to the sinks whose mask has the bit ``1 << info.category_index``.
"""

from __future__ import annotations

import inspect
import typing
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, Tuple

if TYPE_CHECKING:
    from array import array

    from ...common.typedefs import Args, Kwargs
    from ..policies import CaptureWindow
    from ..ranges import RangeInfo, ThreadState

#: The protocol's version: what the implementations expect of their callers.
PROTOCOL = 4

#: A patched function's replacement (a plain function, a native ``Wrapper`` or a proxy).
Wrapper = Callable[..., Any]
#: A sink's ``begin(info, ts)`` and ``end(info, t0_ns, t1_ns, ts)``.
BeginFn = Callable[["RangeInfo", "ThreadState"], None]
EndFn = Callable[["RangeInfo", int, int, "ThreadState"], None]
#: What the core gets of a sink: ``(native part or None, begin or None, end or None, mask)``.
SinkEntry = Tuple[Optional[object], Optional[BeginFn], Optional[EndFn], int]
#: A patch's error handler: ``fail(exc)`` turns that hook off; the call goes on.
FailFn = Callable[[BaseException], Any]
#: The names of the specialized wrappers a patch may ask for (``patches.base.Hot``).
HOT_WRAPPERS = ("link_wrapper", "apply_wrapper", "backprop_wrapper")


class SwitchLike(Protocol):
    """A patch's state, read by its wrappers: ``on`` (the hook runs), ``hits`` (calls seen)."""

    on: bool
    hits: int


class CoreLike(Protocol):
    """A tracer's ranges: this thread's state, begin/end with the sinks, the sinks."""

    def state(self) -> ThreadState:
        """This thread's state (created on first use, through ``new_state``)."""

    def current(self) -> ThreadState | None:
        """This thread's state, or None (none is created)."""

    def forget(self) -> None:
        """This thread's state is dropped from the core (the thread is ending)."""

    def begin(self, info: RangeInfo, ts: ThreadState | None = None) -> RangeInfo | None:
        """Open ``info``; the token for :meth:`end` (None: nothing emitted)."""

    def end(self, token: RangeInfo | None, ts: ThreadState | None = None) -> None:
        """Close the range opened with ``token`` (a no-op for None)."""

    def set_sinks(self, entries: Sequence[SinkEntry], timed: bool) -> None:
        """The sinks, in order (``timed``: one of them reads ``t0``/``t1``)."""


class NvtxDomainLike(Protocol):
    """One NVTX domain: registered strings, categories, prebuilt attributes.

    ``begin``/``end`` are the NVTX sink's calls where a core does not run the
    domain itself: push ``info.nvtx``, pop.
    """

    @property
    def name(self) -> str: ...
    @property
    def enabled(self) -> bool:
        """Whether an NVTX tool listens."""
    @property
    def begin(self) -> BeginFn: ...
    @property
    def end(self) -> EndFn: ...

    def attributes(self, message: str | None = None, color: int | None = None,
                   category: str | None = None, keep: bool = True) -> object:
        """Event attributes (``keep=False``: a string registered for this use only)."""

    def push(self, attributes: Any) -> None: ...
    def pop(self) -> None: ...
    def mark(self, message: str | None = None, color: int | None = None) -> None: ...
    def start_range(self, message: str | None = None, color: int | None = None) -> int: ...
    def end_range(self, range_id: int) -> None: ...


class RecorderHookLike(Protocol):
    """The recorder's per-range append: ``(index, t0, t1, depth)`` into ``ts.record``.

    ``end`` is the recorder sink's call where a core does not run the hook
    itself; the iteration's range goes to ``iteration_ended(buf, t0, t1, ts)``
    and a full buffer to ``flush(ts)``.  ``take(ts)`` and ``copy(ts)``: the rows
    ``ts.record`` holds as int64, four a row (``take``: its buffer emptied in
    the same step), whichever buffer the twin keeps.
    """

    @property
    def end(self) -> EndFn: ...
    def take(self, ts: ThreadState) -> bytearray | array[int]: ...
    def copy(self, ts: ThreadState) -> bytearray | array[int]: ...


class SwitchFactory(Protocol):
    def __call__(self) -> SwitchLike: ...


class CoreFactory(Protocol):
    def __call__(self, state_cls: type, info_cls: type, new_state: Callable[[], ThreadState],
                 sync: Callable[[], None], window: CaptureWindow | None = None,
                 clock: Callable[[], int] | None = None) -> CoreLike: ...


class NvtxDomainFactory(Protocol):
    def __call__(self, name: str) -> NvtxDomainLike: ...


class RecorderHookFactory(Protocol):
    def __call__(self, capacity: int, iter_info: RangeInfo,
                 iteration_ended: Callable[[Any, int, int, ThreadState], None],
                 flush: Callable[[ThreadState], None]) -> RecorderHookLike: ...


class HotPath(Protocol):
    """What an implementation module of the hot path provides (``_native`` and ``python``).

    The classes: ``Switch``, ``Core(state_cls, info_cls, new_state, sync,
    window=None, clock=None)`` (``clock`` None: the monotonic clock of
    ``time.perf_counter_ns``), ``NvtxDomain(name)``, ``RecorderHook(capacity,
    iter_info, iteration_ended, flush)``.  The wrapper factories: ``around``
    (Python ``enter``/``exit`` hooks before and after the original), and the
    specialized ``link_wrapper``, ``apply_wrapper``, ``backprop_wrapper``.
    ``WRAPPER_FRAMES``: whether its wrappers are Python frames on the stack.
    """

    PROTOCOL: int
    WRAPPER_FRAMES: bool

    # The classes (read-only: a module's class is no settable attribute of that type).
    @property
    def Switch(self) -> SwitchFactory: ...  # noqa: N802
    @property
    def Core(self) -> CoreFactory: ...  # noqa: N802
    @property
    def NvtxDomain(self) -> NvtxDomainFactory: ...  # noqa: N802
    @property
    def RecorderHook(self) -> RecorderHookFactory: ...  # noqa: N802

    def around(self, original: Callable[..., Any], switch: SwitchLike,
               enter: Callable[[Any, Args, Kwargs], Any],
               exit: Callable[[Any, Any, BaseException | None], Any] | None, fail: FailFn,
               method: bool = False, replace_args: bool = False,
               proxy: bool = False) -> Wrapper: ...

    def link_wrapper(self, original: Callable[..., Any], switch: SwitchLike, fail: FailFn,
                     core: CoreLike, *, roots: dict[int, Any],
                     make_entry: Callable[[Any, Any], Any],
                     outer_enter: Callable[[Any, ThreadState], Any],
                     outer_exit: Callable[[ThreadState, Any], None], entry_cls: type,
                     variable_cls: type, inner_links_matter: bool,
                     attribute_backward: bool) -> Wrapper: ...

    def apply_wrapper(self, original: Callable[..., Any], switch: SwitchLike, fail: FailFn,
                      core: CoreLike, new_info: Callable[[str], tuple[RangeInfo, bool]],
                      default_label: Any, entry_cls: type, entries: Any = None,
                      backward: Any = None, function_ranges: bool = True,
                      method: bool = True) -> Wrapper: ...

    def backprop_wrapper(self, original: Callable[..., Any], switch: SwitchLike, fail: FailFn,
                         core: CoreLike, new_info: Callable[[str], tuple[RangeInfo, bool]],
                         default_label: Any, entry_cls: type, entries: Any = None,
                         backward: Any = None, function_ranges: bool = True,
                         method: bool = False) -> Wrapper: ...

    def switch_of(self, obj: object) -> SwitchLike | None: ...
    def is_wrapper(self, obj: object) -> bool: ...


def members() -> dict[str, str]:
    """Each name of :class:`HotPath` and its kind: ``int``, ``bool`` (its constants), ``class``
    (its read-only properties) or ``function`` (its methods)."""
    kinds = {name: hint.__name__ for name, hint in typing.get_type_hints(HotPath).items()}
    for name, value in vars(HotPath).items():
        if isinstance(value, property):
            kinds[name] = "class"
        elif inspect.isfunction(value) and not name.startswith("_"):
            kinds[name] = "function"
    return kinds


def _member_kind(value: object) -> str:
    if type(value) in (int, bool):
        return type(value).__name__
    if isinstance(value, type):
        return "class"
    return "function" if callable(value) else type(value).__name__


def problems(module: ModuleType) -> list[str]:
    """What ``module`` lacks of :class:`HotPath` (empty: it implements the protocol)."""
    found: list[str] = []
    for name, kind in members().items():
        if not hasattr(module, name):
            found.append(f"no {name}")
            continue
        got = _member_kind(getattr(module, name))
        if got != kind:
            found.append(f"{name} is a {got}, not a {kind}")
    version = getattr(module, "PROTOCOL", None)
    if isinstance(version, int) and version != PROTOCOL:
        found.insert(0, f"protocol {version}, expected {PROTOCOL}")
    return found


def check(module: ModuleType) -> HotPath:
    """``module`` as a :class:`HotPath`; raises ImportError saying what is wrong with it."""
    found = problems(module)
    if found:
        stale = found[0].startswith("protocol ")
        raise ImportError(("the built extension is stale (" if stale else
                           f"{module.__name__} does not implement the hot path's protocol (")
                          + "; ".join(found) + ")")
    return typing.cast(HotPath, module)


__all__ = ["HOT_WRAPPERS", "PROTOCOL", "BeginFn", "CoreLike", "EndFn", "FailFn", "HotPath",
           "NvtxDomainLike", "RecorderHookLike", "SinkEntry", "SwitchLike", "Wrapper",
           "check", "members", "problems"]
