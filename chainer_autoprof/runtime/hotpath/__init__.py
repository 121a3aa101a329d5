"""The hot path: what runs on every Link call, FunctionNode apply, backprop step and range.

One protocol (:class:`.protocol.HotPath`), two implementations, chosen here in
one place (:func:`select`), after coverage.py's CTracer/PyTracer: ``_native``
(a C extension built from the C files of this directory, checked against the
protocol when it loads) and :mod:`.python`, its pure-Python twin.  Each part
of one lies beside its twin: the core (``core.c`` / ``core.py``: the
per-thread range stack and the sinks' calls), the NVTX domain
(``nvtx_domain``), the recorder's hook (``record``), the wrappers
(``wrappers``).

Callers outside this package use the chosen :class:`Implementation` only: it
makes the tracer's core, the wrappers, the NVTX domain and the recorder's
hook, and says whether its wrappers are Python frames; nothing outside
branches on which one runs.  Which one runs is reported by ``--status``, the
summary's overhead line and the trace metadata (``implementation``), with the
reason when it is the Python one.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any, Callable

from . import python
from .protocol import (
    HOT_WRAPPERS,
    CoreLike,
    FailFn,
    HotPath,
    NvtxDomainLike,
    RecorderHookLike,
    SwitchLike,
    Wrapper,
    check,
)
from .wrappers import finish as finish_wrapper
from .wrappers import switch_of as wrapper_switch

if TYPE_CHECKING:
    from ...common.typedefs import Args, Kwargs
    from ..policies import CaptureWindow
    from ..ranges import RangeInfo, ThreadState

__all__ = ["ENV_TEST_NATIVE", "PYTHON", "Implementation", "NativeRequiredError",
           "finish_wrapper", "load_native", "select", "wrapper_switch"]

#: Test-only: the implementation used when CHAINER_PROF_NATIVE is not set ("1": the native
#: one, which must then load; "0": the Python one).
ENV_TEST_NATIVE = "CHAINER_AUTOPROF_TEST_NATIVE"


class NativeRequiredError(RuntimeError):
    """The native implementation was required (test runs) and cannot be used."""


class Implementation:
    """The implementation chosen: its name, why when it is the Python one, and what it makes.

    ``wrapper_switch(obj)`` and ``finish_wrapper`` (module functions) serve
    wrappers of either implementation.
    """

    __slots__ = ("module", "name", "reason")

    def __init__(self, name: str, module: HotPath, reason: str = "") -> None:
        self.name = name
        self.module = module
        self.reason = reason

    # -- reporting ------------------------------------------------------------
    def describe(self) -> str:
        """``native``, or ``python (why)``."""
        return self.name + (f" ({self.reason})" if self.reason else "")

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}

    def __repr__(self) -> str:
        return f"Implementation({self.describe()!r})"

    # -- what callers need of it ------------------------------------------------
    @property
    def wrapper_frames(self) -> bool:
        """Whether its wrappers are Python frames (an uncaught traceback then skips them)."""
        return self.module.WRAPPER_FRAMES

    def core(self, state_cls: type, info_cls: type, new_state: Callable[[], ThreadState],
             sync: Callable[[], None], window: CaptureWindow | None = None,
             clock: Callable[[], int] | None = None) -> CoreLike:
        """A tracer's core: its ``state``/``begin``/``end`` and its sinks (``clock`` None:
        ``time.perf_counter_ns``)."""
        return self.module.Core(state_cls, info_cls, new_state, sync, window, clock)

    def switch(self) -> SwitchLike:
        """A patch's switch (``on``, ``hits``), read by this implementation's wrappers."""
        return self.module.Switch()

    def around(self, original: Callable[..., Any], switch: SwitchLike,
               enter: Callable[[Any, Args, Kwargs], Any],
               exit: Callable[[Any, Any, BaseException | None], Any] | None, fail: FailFn,
               method: bool = False, replace_args: bool = False,
               proxy: bool = False) -> Wrapper:
        """A wrapper calling ``enter`` before and ``exit`` after the original."""
        return self.module.around(original, switch, enter, exit, fail, method=method,
                                  replace_args=replace_args, proxy=proxy)

    def hot_wrapper(self, kind: str, original: Callable[..., Any], switch: SwitchLike,
                    fail: FailFn, **params: Any) -> Wrapper:
        """One of the specialized wrappers (:data:`.protocol.HOT_WRAPPERS`) with ``params``."""
        if kind not in HOT_WRAPPERS:
            raise ValueError(f"no hot wrapper {kind!r} (known: {', '.join(HOT_WRAPPERS)})")
        make: Callable[..., Wrapper] = getattr(self.module, kind)
        return make(original, switch, fail, **params)

    def switch_of(self, obj: object) -> SwitchLike | None:
        """The switch of a wrapper made by this implementation, else None."""
        return self.module.switch_of(obj)

    def nvtx_domain(self, name: str) -> NvtxDomainLike | None:
        """The NVTX domain ``name`` (one per name and process, registered once), or None
        when no NVTX tool listens."""
        key = (self.name, name)
        domain = _domains.get(key)
        if domain is None:
            domain = _domains[key] = self.module.NvtxDomain(name)
        return domain if domain.enabled else None

    def recorder_hook(self, capacity: int, iter_info: RangeInfo,
                      iteration_ended: Callable[[Any, int, int, ThreadState], None],
                      flush: Callable[[ThreadState], None]) -> RecorderHookLike:
        """The recorder's per-range append into ``ts.record`` (its ``end``), which the native
        core runs itself."""
        return self.module.RecorderHook(capacity, iter_info, iteration_ended, flush)


PYTHON = Implementation("python", python)
#: The NVTX domains made in this process, by implementation and name.
_domains: dict[tuple[str, str], NvtxDomainLike] = {}


def load_native() -> HotPath:
    """The extension module, checked against the protocol (raises ImportError with the reason
    when it cannot be used)."""
    return check(importlib.import_module(f"{__name__}._native"))


def select(native: bool = True, explicit: bool = True) -> Implementation:
    """THE choice of implementation.

    ``native``: the ``native`` setting; ``explicit``: whether it was set (else the
    test-only :data:`ENV_TEST_NATIVE` may give the default).  The native one
    runs when wanted and loadable; otherwise the Python one, with the reason.
    """
    required = False
    if not explicit:
        test = os.environ.get(ENV_TEST_NATIVE, "").strip()
        if test in ("0", "1"):
            native = test == "1"
            required = native
    if not native:
        reason = "CHAINER_PROF_NATIVE=0" if explicit else f"{ENV_TEST_NATIVE}=0"
        return Implementation("python", python, reason)
    try:
        module = load_native()
    except Exception as exc:  # ImportError, or a broken build
        why = f"native extension unavailable: {type(exc).__name__}: {exc}"
        if required:
            raise NativeRequiredError(f"{ENV_TEST_NATIVE}=1 but the {why}") from exc
        return Implementation("python", python, why)
    return Implementation("native", module)
