"""CUPTI read in C (``cupti_native.c``, the ``_cupti`` extension): the collector's native twin.

:class:`NativeCuptiCollector` is a :class:`~.gpu_activity.CuptiCollector` whose CUPTI calls
go to libcupti through the extension instead of cupti-python: the extension registers its
own buffer callbacks, walks each completed buffer in C (no Python object per record, the
GIL not held), keeps the API calls that launched nothing, and calls :meth:`_on_buffer`
once per buffer with two int64 tables (operations, their launching calls) and the range of
kernel name ids it saw first (their texts stay in the extension's name store until the name
table needs them: :meth:`~..common.gpu_records.NameTable.extend_from`).  Those are handed on
as they are (a :class:`~..common.gpu_records.TableBatch`: the attribution's C kernels read
the tables whole) and give, when read, the same :class:`~..common.gpu_records.ActivityBatch`
columns the cupti-python path builds: the attribution's figures cannot tell the two apart.

Which libcupti: :func:`libcupti_candidates` (:data:`ENV_CUPTI_LIBRARY` first, then the
``nvidia-cuda-cupti`` wheels, newest CUDA first, then a CUDA toolkit, then the loader's
own search); the first that loads is used.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Callable, Union

import numpy as np

from ..common.gpu_records import (
    CUPTI_KIND_CONCURRENT_KERNEL,
    CUPTI_KIND_DRIVER,
    CUPTI_KIND_MEMCPY,
    CUPTI_KIND_MEMSET,
    CUPTI_KIND_RUNTIME,
    DRIVER,
    RUNTIME,
    ActivityBatch,
    ApiCalls,
    ExternalIds,
    GpuOps,
    LocateKernel,
    NameSource,
    NameTable,
    TableBatch,
)
from .gpu_activity import (
    BUFFER_BYTES,
    FLUSH_FORCED,
    FLUSH_PERIOD_MS,
    QUIET_DRIVER,
    QUIET_RUNTIME,
    ClockPair,
    CuptiCollector,
    describe_error,
)

#: A libcupti to load instead of those found (a path): a CUDA toolkit elsewhere, or the
#: tests' library that serves recorded activity.
ENV_CUPTI_LIBRARY = "CHAINER_AUTOPROF_CUPTI_LIBRARY"
#: CUPTI's activity kinds of the operations themselves, and of the API calls.
OP_KIND_IDS = (CUPTI_KIND_CONCURRENT_KERNEL, CUPTI_KIND_MEMCPY, CUPTI_KIND_MEMSET)
API_KIND_IDS = (CUPTI_KIND_RUNTIME, CUPTI_KIND_DRIVER)
#: CUPTI's activity kinds the collector enables (as :data:`.gpu_activity.ACTIVITY_KINDS`).
ACTIVITY_KIND_IDS = OP_KIND_IDS + API_KIND_IDS
#: Which API calls CUPTI records for the native reader: ``launches`` (the default: the API
#: kinds left off and only the calls that put work on a stream switched on, by callback id,
#: as CUPTI documents for "a small set" of calls: CUPTI traces no other call), ``all`` (the
#: runtime and driver kinds, the quiet calls then switched off: every other call is traced;
#: on an H200 this cost the PTB-shaped RNN up to twice what ``launches`` does, for the same
#: figures).  Where libcupti refuses a call's switch, ``launches`` falls back to ``all``
#: and says so in the reader's name.
ENV_CUPTI_CALLS = "CHAINER_AUTOPROF_CUPTI_CALLS"
DEFAULT_CALLS = "launches"
CALLS_CHOICES = ("all", "launches")
#: The walked tables' bytes that may wait in the extension for :meth:`hand_over` (the drain
#: takes them four times a second; 16 full buffers' rows): beyond, a buffer's operations
#: are dropped and counted (``queue_dropped_ops``), never memory.
WAITING_BYTES = 256 << 20
#: CUPTI_SUCCESS
SUCCESS = 0
#: The rows of the extension's operation and call tables: the columns, in order.
OP_NAMES = GpuOps.columns()
API_NAMES = ApiCalls.columns()
INT64 = np.dtype(np.int64)
#: What the extension hands a table over in (its ``Block``: the buffer protocol).
Buffer = Union[bytes, bytearray, memoryview]


class NativeCuptiError(RuntimeError):
    """A CUPTI call failed; ``status`` is its ``CUptiResult``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def load_extension() -> ModuleType:
    """The ``_cupti`` extension, checked against the columns it must fill (ImportError)."""
    from . import _cupti  # type: ignore[attr-defined]

    if tuple(_cupti.OP_COLUMNS) != GpuOps.columns() or \
            tuple(_cupti.API_COLUMNS) != ApiCalls.columns():
        raise ImportError("the _cupti extension was built for other columns: rebuild it")
    module: ModuleType = _cupti
    return module


def locate_kernel(kinds: tuple[int, ...]) -> LocateKernel | None:
    """The attribution's range lookup in C (``cupti_locate.c``), where the extension loads
    and counts range kinds as ``kinds`` (the attribution's); else ``None`` (NumPy's twin)."""
    try:
        ext = load_extension()
    except ImportError:
        return None
    if tuple(getattr(ext, "LOCATE_KINDS", ())) != tuple(kinds):
        return None
    kernel: LocateKernel = ext.locate
    return kernel


def libcupti_candidates() -> list[str]:
    """Where libcupti may be, in the order tried (see the module docstring)."""
    chosen = os.environ.get(ENV_CUPTI_LIBRARY, "").strip()
    if chosen:
        return [chosen]
    wheels: list[Path] = []
    for entry in dict.fromkeys(sys.path):
        root = Path(entry or ".") / "nvidia"
        if root.is_dir():
            wheels += root.glob("*/lib/libcupti.so*")
    found = sorted({str(p) for p in wheels if p.is_file()}, key=_cuda_major, reverse=True)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            lib = Path(home) / "extras" / "CUPTI" / "lib64" / "libcupti.so"
            if lib.is_file():
                found.append(str(lib))
    return [*found, "libcupti.so"]


def _driver_missing() -> str:
    """``"; libcuda.so.1 ..."`` where the CUDA driver cannot be loaded (CUPTI's usual
    failure without a GPU), else ``""``."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"; libcuda.so.1 cannot be loaded ({exc})"
    return ""


def _cuda_major(path: str) -> int:
    suffix = path.rsplit(".so.", 1)[-1].split(".")[0]
    return int(suffix) if suffix.isdigit() else 0


class NativeCuptiCollector(CuptiCollector):
    """A collector reading CUPTI through the ``_cupti`` extension (module docstring)."""

    def __init__(self, on_batch: Callable[[ActivityBatch], None], *,
                 buffer_bytes: int = BUFFER_BYTES, names: NameTable | None = None,
                 extension: ModuleType | None = None, library: str = "",
                 calls: str = DEFAULT_CALLS, waiting_bytes: int = WAITING_BYTES) -> None:
        super().__init__(on_batch, buffer_bytes=buffer_bytes, names=names)
        self._ext = extension
        self.library = library
        self.waiting_bytes = waiting_bytes
        #: The API calls CUPTI records (:data:`ENV_CUPTI_CALLS`): as asked, until
        #: :meth:`_subscribe` finds libcupti refusing ``launches``.
        self.calls = calls
        self._switched_on: list[tuple[int, int]] = []  # (domain, cbid) turned on one by one
        #: extension name id -> this collector's NameTable id (-1: not yet told)
        self._remap = np.zeros(0, dtype=np.int64)
        #: Whether every extension id so far is this collector's own (no remap needed); the
        #: ids seen so far are below ``_top``.
        self._identity = True
        self._top = 0
        #: Whether the extension's ids came in order, each buffer's from ``_top`` on (then
        #: new names are added unread: they cannot be in the table already).
        self._in_order = True
        self.api_handed = 0
        self._handing = threading.Lock()  # (hand_over)
        self._no_external = ExternalIds.empty()  # the native reader reads none: one for all
        self._errors = 0  # ours; the extension counts its own (a buffer it could not read)

    # -- what the extension calls, once per buffer, in hand_over ------------------------
    def _on_buffer(self, ops: Buffer, n_ops: int, api: Buffer, n_api: int, room: int,
                   first_name: int, new_names: int, store: NameSource,
                   pair: ClockPair | None) -> None:
        """A buffer's tables, and the clock pair the extension read as it completed (None:
        CUPTI's clock failed).  The counts are read from the extension when asked for
        (:meth:`_sync_counts`: at a flush and at the end), not at every buffer."""
        if self.closed:
            return
        try:
            batch = self.batch_from_tables(ops, n_ops, api, n_api, room, first_name,
                                           new_names, store)
            if pair is not None:
                self._add_pair(pair)
            self.on_batch(batch)
        except Exception as exc:  # CUPTI's thread must never see our error  # noqa: BLE001
            self._errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._sync_counts()

    def batch_from_tables(self, ops: Buffer, n_ops: int, api: Buffer, n_api: int, room: int,
                          first_name: int, new_names: int, store: NameSource) -> ActivityBatch:
        """The extension's tables (column after column, ``room`` rows each, the first
        ``n_*`` of them filled) -> a :class:`TableBatch` of them (its columns made when
        read); the kernel
        names new to the extension: its ids ``first_name`` .. ``first_name + new_names -
        1``, their texts in ``store``."""
        if new_names:
            self._learn_names(first_name, first_name + new_names, store)
        # the tables as they are: the usual path reads them in C; the columns are made when
        # asked for (the names remapped in place, where they must be, for either reader)
        batch = TableBatch(ops, n_ops, api, n_api, room, self._no_external, self.names)
        if not self._identity and n_ops:
            name = batch.ops.name
            named = name >= 0
            name[named] = self._remap[name[named]]
        return batch

    def _learn_names(self, first: int, top: int, store: NameSource) -> None:
        if self._identity:
            # the usual: one collector, the table's own ids so far, the new ones next (their
            # texts fetched from the store when first asked: none made here)
            if first != self._top:
                self._in_order = False  # a buffer overtook another: the texts are checked
            elif self._in_order and self.names.extend_from(first, top, store):
                self._top = top  # the table's ids 0 .. top - 1 are exactly the store's
                return
            fresh = store.texts(first, top)
            if self.names.extend_new(first, fresh):
                self._top = max(self._top, top)
                return
            ours = self.names.intern_all(fresh)
            if ours == list(range(first, top)):
                self._top = max(self._top, top)
                return
            self._remap = np.arange(max(self._top, top), dtype=np.int64)  # those so far
            self._identity = False
        else:
            ours = self.names.intern_all(store.texts(first, top))
        if top > len(self._remap):
            grown = np.full(max(top, 2 * len(self._remap)), -1, dtype=np.int64)
            grown[:len(self._remap)] = self._remap
            self._remap = grown
        self._remap[first:top] = ours  # all at once: a name's first buffer holds hundreds

    def hand_over(self) -> None:
        """The buffers the extension walked since the last call, to ``on_batch`` now, on this
        thread (CUPTI's own thread never takes the GIL); one thread at a time (the drain's
        and a stop's flush), so that they reach ``on_batch`` in the order CUPTI completed
        them."""
        ext = self._ext
        if ext is not None and not self.closed:
            with self._handing:
                ext.hand_over()

    def _sync_counts(self) -> None:
        ext = self._ext
        if ext is None:
            return
        (self.buffers, records, self.ops, self.api_handed, self.incomplete,
         self.dropped_records, errors, self.queue_dropped_ops) = ext.count_values()
        self.records = records - self.incomplete
        self.callback_errors = self._errors + errors
        if errors and not self.last_error:
            self.last_error = "a buffer could not be read (out of memory)"

    # -- CUPTI through the extension ---------------------------------------------------------
    def _timestamp(self) -> Callable[[], int] | None:
        ext = self._ext
        return None if ext is None else ext.timestamp

    def _check(self, code: int, what: str) -> None:
        if code != SUCCESS:
            assert self._ext is not None
            raise NativeCuptiError(f"{what}: {self._ext.result_string(code)}{_driver_missing()}",
                                   code)

    def _load(self) -> str | None:
        """Load libcupti; ``None``, or why it could not be."""
        ext = self._ext
        if ext is None:
            return "the native CUPTI reader is not built"
        why = ext.load(self.library)
        if why is not None:
            return f"libcupti could not be loaded from {self.library} ({why})"
        return None

    def _subscribe(self) -> None:
        """Register the extension's callbacks and enable the activity kinds (CUPTI's error
        raises)."""
        ext = self._ext
        assert ext is not None
        self._check(ext.register(self.buffer_bytes, self._on_buffer, self.waiting_bytes),
                    "cuptiActivityRegisterCallbacks")
        self.system_thread_ids = ext.system_thread_ids() == SUCCESS
        self._enable()
        ext.flush_period(FLUSH_PERIOD_MS)  # -1 or an error: buffers go when full
        self._pair()

    def _enable(self) -> None:
        """Enable the operations' kinds and the calls :attr:`calls` names (``launches``
        falls back to ``all`` where libcupti refuses a call's switch)."""
        ext = self._ext
        assert ext is not None
        for kind in OP_KIND_IDS:
            self._check(ext.enable(kind), f"cuptiActivityEnable({kind})")
            self._enabled.append(kind)
        if self.calls != "launches" or not self._switch_on_launches(ext):
            self.calls = "all"
            for kind in API_KIND_IDS:
                self._check(ext.enable(kind), f"cuptiActivityEnable({kind})")
                self._enabled.append(kind)
            for domain, table, quiet in ((RUNTIME, ext.RUNTIME_CBIDS, QUIET_RUNTIME),
                                         (DRIVER, ext.DRIVER_CBIDS, QUIET_DRIVER)):
                for name in quiet:
                    if name in table:  # a failure leaves the call recorded: harmless
                        ext.enable_api(domain, table[name], False)

    def _switch_on_launches(self, ext: ModuleType) -> bool:
        """Switch on, call by call, those that put work on a stream (the API kinds stay
        off); whether libcupti took every one (if not, those taken are switched off)."""
        if not ext.RUNTIME_LAUNCH_CBIDS or not ext.DRIVER_LAUNCH_CBIDS:
            return False  # built without the cbid headers' lists
        for domain, ids in ((RUNTIME, ext.RUNTIME_LAUNCH_CBIDS),
                            (DRIVER, ext.DRIVER_LAUNCH_CBIDS)):
            for cbid in ids:
                if ext.enable_api(domain, cbid, True) != SUCCESS:
                    self._switch_off_calls()
                    return False
                self._switched_on.append((domain, cbid))
        return True

    def _switch_off_calls(self) -> None:
        ext = self._ext
        while self._switched_on and ext is not None:
            domain, cbid = self._switched_on.pop()
            try:
                ext.enable_api(domain, cbid, False)
            except Exception:  # CUPTI may be gone at exit: switch off what it can  # noqa: BLE001
                pass

    def flush(self) -> None:
        ext = self._ext
        if ext is None:
            return
        try:
            self._check(ext.flush_all(FLUSH_FORCED), "cuptiActivityFlushAll")
            self.hand_over()
            self._pair()
        except Exception as exc:  # counted, never reaches the callback's caller  # noqa: BLE001
            self._errors += 1
            self.last_error = describe_error(exc)
        self._sync_counts()

    def stop(self, timeout_s: float) -> str | None:
        late = super().stop(timeout_s)
        if self._ext is not None:
            self._ext.close()  # a buffer CUPTI hands over later is freed unread
            self._sync_counts()
        return late

    def after_fork(self) -> None:
        """A forked child: nothing of the parent's CUPTI is called; a buffer the child's copy
        of the extension were handed would be freed unread."""
        super().after_fork()
        if self._ext is not None:
            self._ext.close()
        self._ext = None

    def _let_go(self) -> None:
        """Completed buffers are freed unread from now on."""
        if self._ext is not None:
            self._ext.close()

    def _disable(self) -> None:
        self._switch_off_calls()
        ext = self._ext
        while self._enabled and ext is not None:
            try:
                ext.disable(self._enabled.pop())
            except Exception:  # CUPTI may be gone at exit: disable what it can  # noqa: BLE001
                pass

    def _count_dropped(self) -> None:
        """Counted by the extension at every buffer."""


def start(on_batch: Callable[[ActivityBatch], None], *, buffer_bytes: int = BUFFER_BYTES,
          names: NameTable | None = None, calls: str = DEFAULT_CALLS,
          waiting_bytes: int = WAITING_BYTES) -> NativeCuptiCollector | str:
    """A running native collector (the first libcupti that loads), or why there is none;
    ``calls``: :data:`ENV_CUPTI_CALLS`."""
    try:
        ext = load_extension()
    except ImportError as exc:
        return f"the native CUPTI reader is not built ({exc})"
    reasons: list[str] = []
    for library in libcupti_candidates():
        collector = NativeCuptiCollector(on_batch, buffer_bytes=buffer_bytes, names=names,
                                         extension=ext, library=library, calls=calls,
                                         waiting_bytes=waiting_bytes)
        reason = collector.start()
        if reason is None:
            return collector
        reasons.append(reason)
        if not reason.startswith("libcupti could not be loaded"):
            break  # libcupti loaded and CUPTI said no: another copy would say the same
    return reasons[-1]
