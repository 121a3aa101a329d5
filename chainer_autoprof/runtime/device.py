"""The device layer: which backend of the device-sync call runs (:func:`get_backend`), and
the GPUs arrays live on.  The callers' one entry: every backend is named here.

Everything is stdlib-only at import time and never imports CuPy: CuPy is
used only once the user's own code has imported it (``'cupy' in
sys.modules``), and CUDA is touched only on the first real call
(:mod:`.cupy_device`, the only module of these that talks to CUDA).

Synchronization rule: CuPy arrays living on GPU device ``d`` mean that device
``d`` must be synchronized before a host timestamp is meaningful; NumPy (and
any other host) arrays need nothing.  Use :func:`array_device_ids` to get the
set of ids to pass to :meth:`DeviceBackend.synchronize`.

Backends (their interfaces, :class:`EventTimer` and :class:`DeviceBackend`, in
:mod:`.device_api`):

* :class:`CupyBackend` -- the real one (CuPy already imported; :mod:`.cupy_device`).
* :class:`LazyBackend` -- behaves as :class:`NullBackend` until CuPy shows up
  in ``sys.modules``, then binds a :class:`CupyBackend` (:mod:`.cupy_device`).
* :class:`NullBackend` -- no-ops (NumPy-only runs; :mod:`.device_api`).
* :class:`CountingBackend` -- CPU test stand-in that counts (and optionally
  logs) calls; selected by ``CHAINER_AUTOPROF_TEST_DEVICE=counting``
  (:mod:`.counting_device`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .counting_device import CountingBackend, HostEventTimer
from .cupy_device import CupyBackend, CupyEventTimer, LazyBackend, LazyEventTimer, imported_cupy
from .device_api import DEFAULT_MAX_PENDING, DeviceBackend, EventTimer, NullBackend, NullEventTimer

__all__ = [
    "DEFAULT_MAX_PENDING",
    "ENV_TEST_DEVICE",
    "ENV_TEST_DEVICE_LOG",
    "CountingBackend",
    "CupyBackend",
    "CupyEventTimer",
    "DeviceBackend",
    "EventTimer",
    "HostEventTimer",
    "LazyBackend",
    "LazyEventTimer",
    "NullBackend",
    "NullEventTimer",
    "array_device_ids",
    "device_names",
    "get_backend",
    "reset_backend",
]

#: Set to ``counting`` to make :func:`get_backend` return a CountingBackend.
ENV_TEST_DEVICE = "CHAINER_AUTOPROF_TEST_DEVICE"
#: File the env-selected CountingBackend appends to (``%p`` -> pid).
ENV_TEST_DEVICE_LOG = "CHAINER_AUTOPROF_TEST_DEVICE_LOG"


# --------------------------------------------------------------------------
# Selection and helpers
# --------------------------------------------------------------------------

_cache: tuple[tuple[str, str], DeviceBackend] | None = None


def get_backend() -> DeviceBackend:
    """The process-wide backend (cached per test-env setting).

    ``CHAINER_AUTOPROF_TEST_DEVICE=counting`` -> :class:`CountingBackend`
    (logging to ``CHAINER_AUTOPROF_TEST_DEVICE_LOG`` if set); else
    :class:`CupyBackend` if CuPy is already imported; else a
    :class:`LazyBackend` (no-op until the script imports CuPy).
    """
    global _cache
    key = (os.environ.get(ENV_TEST_DEVICE, ""), os.environ.get(ENV_TEST_DEVICE_LOG, ""))
    if _cache is not None and _cache[0] == key:
        return _cache[1]
    backend: DeviceBackend
    if key[0].strip().lower() == "counting":
        backend = CountingBackend(key[1] or None)
    elif imported_cupy() is not None:
        backend = CupyBackend()
    else:
        backend = LazyBackend()
    _cache = (key, backend)
    return backend


def reset_backend() -> None:
    """Forget the cached backend (tests)."""
    global _cache
    _cache = None


def array_device_ids(arrays: Iterable[Any]) -> set[int]:
    """GPU device ids of the CuPy ndarrays among ``arrays``.

    NumPy arrays, ``None`` and anything else are ignored; without an imported
    CuPy the result is always empty (CuPy is never imported here).
    """
    cp = imported_cupy()
    nd = getattr(cp, "ndarray", None) if cp is not None else None
    if nd is None:
        return set()
    return {a.device.id for a in arrays if isinstance(a, nd)}


def device_names(ids: Iterable[int]) -> list[dict[str, Any]]:
    """The GPUs in use: id and name (the name only where the program imported CuPy)."""
    out: list[dict[str, Any]] = []
    cupy = imported_cupy()
    for dev in sorted(ids):
        entry: dict[str, Any] = {"id": dev}
        if cupy is not None:
            try:
                props = cupy.cuda.runtime.getDeviceProperties(dev)
                name = props.get("name", b"")
                entry["name"] = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:  # a device's name is optional  # noqa: BLE001
                pass
        out.append(entry)
    return out
