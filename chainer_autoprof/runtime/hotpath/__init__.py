"""The hot path: what runs on every Link call, FunctionNode apply, backprop step and range.

One protocol, two implementations, chosen here in one place (:func:`select`),
after coverage.py's CTracer/PyTracer: ``_native`` (a C extension built from
``_native.c``) and :mod:`.python`, its pure-Python twin.  Both modules define:

* ``Switch()``: a patch's ``on`` and ``hits``;
* ``around(original, switch, enter, exit, fail, method=False, replace_args=False,
  proxy=False)``: a wrapper calling Python ``enter``/``exit`` hooks before and
  after the original (every patch but the three below);
* ``link_wrapper``, ``apply_wrapper``, ``backprop_wrapper``: the wrappers of
  ``Link.__call__``, ``FunctionNode.apply`` and ``_backprop_utils.backprop_step``,
  which run in C without calling Python but for rare events (a new link, the
  outermost link's phase, a new function label);
* ``switch_of(obj)``, ``is_wrapper(obj)``.

A wrapper's ``core`` is ``tracer.core``: the native ``Core`` (the tracer's
``begin``/``end``/``state`` in C, with the NVTX push/pop of a native
``NvtxDomain`` and the recorder's append into a ``RecordBuffer`` through a
``RecorderHook``), or for the Python implementation the tracer itself.

Which one runs is reported by ``--status``, the summary's overhead line and
the trace metadata (``implementation``), with the reason when it is the
Python one.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from . import python

#: Test-only: the implementation used when CHAINER_PROF_NATIVE is not set ("1": the native
#: one, which must then load; "0": the Python one).
ENV_TEST_NATIVE = "CHAINER_AUTOPROF_TEST_NATIVE"


class NativeRequiredError(RuntimeError):
    """The native implementation was required (test runs) and cannot be used."""


class Implementation:
    """The implementation chosen: its name, its module, and why when it is the Python one."""

    __slots__ = ("module", "name", "reason")

    def __init__(self, name: str, module: Any, reason: str = "") -> None:
        self.name = name
        self.module = module
        self.reason = reason

    @property
    def native(self) -> bool:
        return self.name == "native"

    def describe(self) -> str:
        """``native``, or ``python (why)``."""
        return self.name + (f" ({self.reason})" if self.reason else "")

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}

    def __repr__(self) -> str:
        return f"Implementation({self.describe()!r})"


PYTHON = Implementation("python", python)


def load_native() -> Any:
    """The extension module (raises ImportError with the reason when it cannot be used)."""
    module = importlib.import_module(f"{__name__}._native")
    if getattr(module, "PROTOCOL", None) != python.PROTOCOL:
        raise ImportError(f"the built extension is stale (protocol "
                          f"{getattr(module, 'PROTOCOL', None)}, expected {python.PROTOCOL})")
    return module


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
