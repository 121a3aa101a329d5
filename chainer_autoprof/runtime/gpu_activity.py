"""Live GPU activity through CUPTI: kernels, copies, memsets and the calls that launched
them, handed over as :class:`~..common.gpu_records.ActivityBatch` blocks.

Two readers of CUPTI's records, chosen in one place (:func:`.cupti_readers.start`,
reported by the collector's :attr:`~CuptiCollector.reader`): the native one
(:mod:`.cupti_native`, a C extension that walks CUPTI's buffers without the GIL), where it
is built and libcupti loads; else :class:`CuptiCollector` through cupti-python, described
below.  Both hand the session the same columns.

Like :mod:`.device`, this talks to CUDA, and only when asked: nothing here imports
``cupti`` before :meth:`CuptiCollector.start`.  What CUPTI gives back goes through
:func:`~..common.gpu_records.batch_from_records` (tested on the real recordings); the
calls into CUPTI are those of cupti-python 12.6 to 13.4 (``cupti.pyi``): ``set_thread_id_type``,
``activity_register_callbacks``, ``activity_enable``/``activity_disable``,
``activity_enable_runtime_api``/``activity_enable_driver_api``, ``activity_flush_period``,
``activity_flush_all``, ``activity_get_num_dropped_records(context, stream, &dropped)``
and ``get_timestamp``; failures raise ``cuptiError`` (``.status``: a ``CUptiResult``) or,
without a CUDA driver, ``NotSupportedError``.  They run only on a GPU machine.

CUPTI hands filled buffers back on a thread of its own; the collector converts each one
there and passes the batch to ``on_batch`` (which must be quick and thread-safe: the
agent queues it).  Nothing runs on the training thread.  With runtime and driver API
records on, each kernel is tied to its launching call (what the attribution needs); the
noisiest calls that launch nothing (``cudaGetDevice``, ``cuGetProcAddress``, ...) are
turned off by name where CUPTI knows them (:data:`QUIET_RUNTIME`, :data:`QUIET_DRIVER`).

Threads: :meth:`start` asks CUPTI for system thread ids (``gettid``, the agent's
``tid``); where it cannot, CUPTI reports ``pthread_self()`` cut to 32 bits, and the agent
maps each thread's ``threading.get_ident() & 0xFFFFFFFF`` to its ``tid``
(:attr:`CuptiCollector.system_thread_ids` says which).

Clock: a pair (CUPTI timestamp, ``perf_counter_ns``) is read at the start, with every
buffer and at the end (:attr:`CuptiCollector.clock_pairs`), each between two
``perf_counter_ns`` reads whose distance bounds its error.

Faults never reach the training: :func:`start` returns a collector or one line saying
why there is none (cupti-python missing, no CUDA driver or device, CUPTI held by another
tool such as Nsight Systems or Compute: ``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``);
an error in a buffer callback is counted and that buffer dropped; records CUPTI itself
dropped are counted (:attr:`CuptiCollector.dropped_records`), and so are operations still
running when the last buffers were forced out (:attr:`CuptiCollector.incomplete`).
:meth:`CuptiCollector.stop` never waits longer than it is told: CUPTI's last flush runs on
a helper thread, and a flush that does not return in time is given up with one line.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Callable, Iterable

import numpy as np

from ..common.gpu_records import ActivityBatch, ClockPairs, NameTable, batch_from_records

#: Bytes of one activity buffer CUPTI asks for (8 MiB: tens of thousands of records).
BUFFER_BYTES = 8 << 20
#: How often CUPTI's own thread hands over what it holds (ms): the attribution's delay.
FLUSH_PERIOD_MS = 1000
#: CUPTI's result code when another subscriber (Nsight) holds CUPTI.
CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39
#: ... and when the user may not profile (``NVreg_RestrictProfilingToAdminUsers``).
CUPTI_ERROR_INSUFFICIENT_PRIVILEGES = 35
#: ``CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`` (``cupti.ActivityFlag.FLUSH_FORCED``).
FLUSH_FORCED = 1
#: Activity kinds enabled, by their names in ``cupti.ActivityKind``.
ACTIVITY_KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "RUNTIME", "DRIVER")
#: Runtime and driver calls that launch nothing and come by hundreds per iteration (names in
#: ``cupti.runtime_api_trace_cbid`` / ``driver_api_trace_cbid``): not recorded.
QUIET_RUNTIME = ("cudaGetDevice_v3020", "cudaSetDevice_v3020", "cudaGetLastError_v3020",
                 "cudaPeekAtLastError_v3020", "cudaStreamIsCapturing_v10000",
                 "cudaDeviceGetAttribute_v5000")
QUIET_DRIVER = ("cuGetProcAddress_v2", "cuStreamGetCaptureInfo_v2", "cuDeviceGetAttribute",
                "cuCtxGetCurrent")
#: Clock pairs kept (the first and a thinned rest beyond).
MAX_PAIRS = 4096


#: ``(other clock ns, perf_counter_ns, read ns)``: see :func:`read_clock_pair`.
ClockPair = tuple[int, int, int]


def read_clock_pair(timestamp: Callable[[], int]) -> ClockPair:
    """``(other clock ns, perf_counter_ns, read ns)``: ``timestamp()`` read between two
    ``perf_counter_ns`` reads; the pair's perf time is their middle, its error at most
    their distance."""
    p0 = time.perf_counter_ns()
    other = int(timestamp())
    p1 = time.perf_counter_ns()
    return other, (p0 + p1) // 2, p1 - p0


def complete(batch: ActivityBatch) -> tuple[ActivityBatch, int]:
    """``batch`` without the operations CUPTI handed over unfinished (a forced flush gives
    those with no end), and how many there were."""
    ops = batch.ops
    ok = (ops.start > 0) & (ops.end >= ops.start)
    bad = len(ops) - int(np.count_nonzero(ok))
    if not bad:
        return batch, 0
    return ActivityBatch(ops.take(ok), batch.api, batch.external, batch.names), bad


class CuptiCollector:
    """Collects CUPTI activity into batches for ``on_batch`` (see the module docstring)."""

    def __init__(self, on_batch: Callable[[ActivityBatch], None], *,
                 buffer_bytes: int = BUFFER_BYTES, names: NameTable | None = None) -> None:
        self.on_batch = on_batch
        self.buffer_bytes = buffer_bytes
        self.names = names if names is not None else NameTable()
        self._cupti: Any = None
        self._enabled: list[Any] = []
        self._lock = threading.Lock()
        self._pairs: list[ClockPair] = []
        self.system_thread_ids = False
        self.buffers = 0
        self.records = 0
        self.ops = 0
        self.dropped_records = 0
        self.incomplete = 0
        self.callback_errors = 0
        #: Operations of buffers dropped before the session saw them (the native reader's
        #: queue full; this reader hands each buffer on at once).
        self.queue_dropped_ops = 0
        self.last_error = ""
        self.running = False
        #: Whether CUPTI's activity kinds are enabled while running (:meth:`record`).
        self.recording = True
        #: Set once collection stopped: a buffer CUPTI still hands over is not converted.
        self.closed = False
        #: Which reader runs: ``native (libcupti's path)`` or ``python (why not native)``.
        self.reader = "python"

    # -- what CUPTI calls, on its own thread ----------------------------------------------
    def _buffer_requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0  # (size, max records: 0 = as many as fit)

    def _buffer_completed(self, activities: Iterable[Any]) -> None:
        """A buffer of records, on CUPTI's thread: converted, then handed to ``on_batch``."""
        if self.closed:
            return
        try:
            batch, unfinished = complete(batch_from_records(activities, self.names))
            self._pair()
            self.buffers += 1
            self.records += len(batch)
            self.ops += len(batch.ops)
            self.incomplete += unfinished
            self._count_dropped()
            self.on_batch(batch)
        except Exception as exc:  # CUPTI's thread must never see our error  # noqa: BLE001
            self.callback_errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"

    def _timestamp(self) -> Callable[[], int] | None:
        """CUPTI's clock, where CUPTI runs."""
        cupti = self._cupti
        return None if cupti is None else cupti.get_timestamp

    def _pair(self) -> None:
        timestamp = self._timestamp()
        if timestamp is not None:
            self._add_pair(read_clock_pair(timestamp))

    def _add_pair(self, pair: ClockPair) -> None:
        with self._lock:
            self._pairs.append(pair)
            if len(self._pairs) > MAX_PAIRS:  # keep the first and a thinned rest
                self._pairs = self._pairs[:1] + self._pairs[1::2]

    def _count_dropped(self) -> None:
        """Records CUPTI dropped since the last call (its buffers were full)."""
        cupti = self._cupti
        if cupti is None:
            return
        dropped = ctypes.c_size_t(0)
        try:  # context NULL, stream 0: the global queue; the count goes to *dropped
            cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
        except Exception:  # the dropped count is optional  # noqa: BLE001
            return
        self.dropped_records += int(dropped.value)

    # -- control ------------------------------------------------------------------------
    def start(self) -> str | None:
        """Subscribe and enable the activity kinds; ``None``, or why it could not."""
        why = self._load()
        if why is not None:
            return why
        try:
            self._subscribe()
        except Exception as exc:  # CUPTI's error: GPU activity off, said once  # noqa: BLE001
            reason = describe_error(exc)
            self._disable()
            self._let_go()
            self.closed = True
            return reason
        self.running = True
        return None

    def _load(self) -> str | None:
        """Make CUPTI callable; ``None``, or why it cannot be."""
        try:
            from cupti import cupti  # cupti-python; only when GPU activity is wanted
        except ImportError as exc:
            return (f"cupti-python is not installed ({exc}): pip install "
                    "chainer-autoprof[cupti]")
        except Exception as exc:  # e.g. its CUDA bindings cannot load  # noqa: BLE001
            return f"cupti-python cannot be imported ({type(exc).__name__}: {exc})"
        self._cupti = cupti
        return None

    def _subscribe(self) -> None:
        """Register the buffer callbacks and enable the activity kinds (CUPTI's error raises)."""
        cupti = self._cupti
        try:
            cupti.set_thread_id_type(cupti.ActivityThreadIdType.SYSTEM)
            self.system_thread_ids = True
        except Exception as exc:
            if _no_driver(exc):
                raise
            self.system_thread_ids = False
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self._enable()
        try:
            cupti.activity_flush_period(FLUSH_PERIOD_MS)
        except Exception:  # noqa: BLE001
            pass  # CUPTI hands buffers over when they fill, and at the end
        self._pair()

    def _enable(self) -> None:
        """Enable the activity kinds, the quiet calls switched off (CUPTI's error raises)."""
        cupti = self._cupti
        for name in ACTIVITY_KINDS:
            kind = getattr(cupti.ActivityKind, name)
            cupti.activity_enable(kind)
            self._enabled.append(kind)
        _quiet(cupti, "runtime_api_trace_cbid", "activity_enable_runtime_api",
               QUIET_RUNTIME)
        _quiet(cupti, "driver_api_trace_cbid", "activity_enable_driver_api", QUIET_DRIVER)

    def _let_go(self) -> None:
        """Nothing more of CUPTI is called."""
        self._cupti = None

    def flush(self) -> None:
        """Hand over every record now (CUPTI calls back before this returns)."""
        cupti = self._cupti
        if cupti is None:
            return
        flag = int(getattr(getattr(cupti, "ActivityFlag", None), "FLUSH_FORCED", FLUSH_FORCED))
        try:
            cupti.activity_flush_all(flag)
            self._pair()
        except Exception as exc:  # counted, never reaches the callback's caller  # noqa: BLE001
            self.callback_errors += 1
            self.last_error = describe_error(exc)

    def stop(self, timeout_s: float) -> str | None:
        """Flush, then turn collection off (idempotent), waiting ``timeout_s`` at most;
        ``None``, or the one line saying what did not finish."""
        if not self.running:
            return None
        self.running = False
        done = threading.Event()

        def last_flush() -> None:
            try:
                self.flush()
                self._disable()
            finally:
                done.set()

        worker = threading.Thread(target=last_flush, name="chainer_autoprof-cupti-stop",
                                  daemon=True)
        worker.start()
        if done.wait(timeout_s):
            self.closed = True
            return None
        self.closed = True  # a buffer CUPTI hands over later is not read
        return (f"CUPTI did not hand back its last buffers within {timeout_s:g} s: the GPU "
                "figures miss the last records")

    def hand_over(self) -> None:
        """Hand completed buffers to ``on_batch`` now: here they were, on CUPTI's thread."""

    def record(self, on: bool) -> None:
        """Record (``on``) or not, while running: CUPTI's activity kinds enabled or disabled,
        so that outside a capture window CUPTI traces nothing and costs nothing.  What was
        recorded before comes with CUPTI's next buffer.  CUPTI's error raises."""
        if not self.running or on == self.recording:
            return
        self.recording = on
        if on:
            self._enable()
        else:
            self._disable()

    def after_fork(self) -> None:
        """A forked child: CUPTI's state is its parent's; nothing is called, nothing kept."""
        self._cupti = None
        self._enabled = []
        self.running = False
        self.closed = True

    def _disable(self) -> None:
        cupti = self._cupti
        while self._enabled:
            kind = self._enabled.pop()
            try:
                cupti.activity_disable(kind)
            except Exception:  # CUPTI may be gone at exit: disable what it can  # noqa: BLE001
                pass

    @property
    def clock_pairs(self) -> ClockPairs:
        with self._lock:
            return ClockPairs.from_rows(list(self._pairs))

    def pair_rows(self) -> list[ClockPair]:
        """The clock pairs as read, ``(cupti_ns, perf_counter_ns, read_ns)`` rows (a copy:
        one C call under the GIL, which an append or a thinning cannot split, no lock)."""
        return list(self._pairs)

    @property
    def pair_count(self) -> int:
        return len(self._pairs)


def _quiet(cupti: Any, table: str, switch: str, names: Iterable[str]) -> None:
    """Turn off the records of the calls ``names`` (those this CUPTI knows)."""
    ids = getattr(cupti, table, None)
    off = getattr(cupti, switch, None)
    if ids is None or off is None:
        return
    for name in names:
        cbid = getattr(ids, name, None)
        if cbid is None:
            continue
        try:
            off(int(cbid), 0)
        except Exception:  # CUPTI may be gone at exit: unsubscribe what it can  # noqa: BLE001
            pass


def _no_driver(exc: BaseException) -> bool:
    text = str(exc).upper()
    return "DRIVER IS NOT FOUND" in text or "LIBCUDA" in text


def describe_error(exc: BaseException) -> str:
    """One line for a CUPTI failure, naming the usual cause."""
    text = f"{type(exc).__name__}: {exc}"
    upper = text.upper()
    code = getattr(exc, "status", None)
    if code == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED or \
            "MULTIPLE_SUBSCRIBERS" in upper:
        return ("CUPTI is already in use by another tool (Nsight Systems or Nsight Compute "
                f"attached?): {text}")
    if code == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES or "INSUFFICIENT_PRIVILEGES" in upper:
        return ("CUPTI needs permission to profile the GPU "
                f"(NVreg_RestrictProfilingToAdminUsers=0, or run as root): {text}")
    if _no_driver(exc):
        return f"no CUDA driver for CUPTI: {text}"
    if "NO_DEVICE" in upper or "NOT_INITIALIZED" in upper or "INVALID_DEVICE" in upper:
        return f"no CUDA device for CUPTI: {text}"
    return f"CUPTI could not start: {text}"
