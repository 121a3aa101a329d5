"""Live GPU activity through CUPTI (cupti-python): kernels, copies, memsets and the calls
that launched them, handed over as :class:`~..common.gpu_records.ActivityBatch` blocks.

Like :mod:`.device`, this talks to CUDA, and only when asked: nothing here imports
``cupti`` before :meth:`CuptiCollector.start`.  What CUPTI gives back goes through
:func:`~..common.gpu_records.batch_from_records` (tested on the real recordings); only
the calls into CUPTI below (enable, register, flush, disable) are untested without a GPU.

CUPTI hands filled buffers back on a thread of its own; the collector converts each one
there and passes the batch to ``on_batch`` (which must be quick and thread-safe: the
agent queues it).  Nothing runs on the training thread.  With runtime and driver API
records on, each kernel is tied to its launching call (what the attribution needs); the
noisiest runtime calls that launch nothing (``cudaGetDevice``, ``cudaGetLastError``,
...) are turned off where CUPTI allows it.

Threads: :meth:`start` asks CUPTI for system thread ids (``gettid``, the agent's
``tid``); where it cannot, CUPTI reports ``pthread_self()`` cut to 32 bits, and the agent
maps each thread's ``threading.get_ident() & 0xFFFFFFFF`` to its ``tid``
(:attr:`CuptiCollector.system_thread_ids` says which).

Clock: a pair (CUPTI timestamp, ``perf_counter_ns``) is read at the start, with every
buffer and at the end (:attr:`CuptiCollector.clock_pairs`), each between two
``perf_counter_ns`` reads whose distance bounds its error.

Faults never reach the training: :func:`start` returns a collector or one line saying
why there is none (cupti-python missing, no GPU, CUPTI held by another tool such as
Nsight Systems or Compute: ``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``); an error
in a buffer callback is counted and the buffer dropped; records CUPTI itself dropped are
counted (:attr:`CuptiCollector.dropped_records`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

from ..common.gpu_records import ActivityBatch, ClockPairs, NameTable, batch_from_records

#: Bytes of one activity buffer CUPTI asks for (8 MiB: about 40,000 kernel records).
BUFFER_BYTES = 8 << 20
#: CUPTI's result code when another subscriber (Nsight) holds CUPTI.
CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39
#: Activity kinds enabled, by their names in ``cupti.ActivityKind``.
ACTIVITY_KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "RUNTIME", "DRIVER")
#: Runtime calls that launch nothing and come by thousands per iteration (CUPTI's cbids):
#: cudaGetLastError, cudaPeekAtLastError, cudaSetDevice, cudaGetDevice,
#: cudaStreamIsCapturing.
QUIET_RUNTIME_CBIDS = (10, 11, 16, 17, 317)


def read_clock_pair(timestamp: Callable[[], int]) -> tuple[int, int, int]:
    """``(other clock ns, perf_counter_ns, read ns)``: ``timestamp()`` read between two
    ``perf_counter_ns`` reads; the pair's perf time is their middle, its error at most
    their distance."""
    p0 = time.perf_counter_ns()
    other = int(timestamp())
    p1 = time.perf_counter_ns()
    return other, (p0 + p1) // 2, p1 - p0


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
        self._pairs: list[tuple[int, int, int]] = []
        self.system_thread_ids = False
        self.buffers = 0
        self.records = 0
        self.dropped_records = 0
        self.callback_errors = 0
        self.last_error = ""
        self.running = False

    # -- what CUPTI calls, on its own thread ----------------------------------------------
    def _buffer_requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0  # (size, max records: 0 = as many as fit)

    def _buffer_completed(self, activities: Iterable[Any]) -> None:
        try:
            batch = batch_from_records(activities, self.names)
            self._pair()
            self.buffers += 1
            self.records += len(batch)
            self._count_dropped()
            self.on_batch(batch)
        except Exception as exc:  # CUPTI's thread must never see our error
            self.callback_errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"

    def _pair(self) -> None:
        cupti = self._cupti
        if cupti is not None:
            pair = read_clock_pair(cupti.get_timestamp)
            with self._lock:
                self._pairs.append(pair)
                if len(self._pairs) > 4096:  # keep the first and a thinned rest
                    self._pairs = self._pairs[:1] + self._pairs[1::2]

    def _count_dropped(self) -> None:
        count = getattr(self._cupti, "activity_get_num_dropped_records", None)
        if count is None:
            return
        try:
            self.dropped_records += int(count(0, 0))
        except Exception:
            pass

    # -- control ------------------------------------------------------------------------
    def start(self) -> str | None:
        """Subscribe and enable the activity kinds; ``None``, or why it could not."""
        try:
            from cupti import cupti  # cupti-python; only when GPU activity is wanted
        except ImportError as exc:
            return f"cupti-python is not installed ({exc}): pip install chainer-autoprof[cupti]"
        self._cupti = cupti
        try:
            id_types = getattr(cupti, "ActivityThreadIdType", None)
            setter = getattr(cupti, "set_thread_id_type", None)
            if id_types is not None and setter is not None:
                try:
                    setter(id_types.SYSTEM)
                    self.system_thread_ids = True
                except Exception:
                    self.system_thread_ids = False
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            for name in ACTIVITY_KINDS:
                kind = getattr(cupti.ActivityKind, name)
                cupti.activity_enable(kind)
                self._enabled.append(kind)
            quiet = getattr(cupti, "activity_enable_runtime_api", None)
            if quiet is not None:
                for cbid in QUIET_RUNTIME_CBIDS:
                    try:
                        quiet(cbid, 0)
                    except Exception:
                        pass
            self._pair()
        except Exception as exc:
            reason = describe_error(exc)
            self._disable()
            self._cupti = None
            return reason
        self.running = True
        return None

    def flush(self) -> None:
        """Hand over every completed record now (CUPTI calls back before this returns)."""
        if self._cupti is None:
            return
        try:
            self._cupti.activity_flush_all(1)  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
            self._pair()
        except Exception as exc:
            self.callback_errors += 1
            self.last_error = describe_error(exc)

    def stop(self) -> None:
        """Flush, then turn collection off (idempotent)."""
        if not self.running:
            return
        self.running = False
        self.flush()
        self._disable()

    def _disable(self) -> None:
        cupti = self._cupti
        while self._enabled:
            kind = self._enabled.pop()
            try:
                cupti.activity_disable(kind)
            except Exception:
                pass

    @property
    def clock_pairs(self) -> ClockPairs:
        with self._lock:
            return ClockPairs.from_rows(list(self._pairs))


def describe_error(exc: BaseException) -> str:
    """One line for a CUPTI failure, naming the usual cause."""
    text = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "status", None)
    if code == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED or \
            "MULTIPLE_SUBSCRIBERS" in text.upper():
        return ("CUPTI is already in use by another tool (Nsight Systems or Nsight Compute "
                f"attached?): no GPU activity ({text})")
    if "NO_DEVICE" in text.upper() or "NOT_INITIALIZED" in text.upper():
        return f"no CUDA device or driver for CUPTI: no GPU activity ({text})"
    return f"CUPTI could not start: no GPU activity ({text})"


def start(on_batch: Callable[[ActivityBatch], None], **kw: Any) -> CuptiCollector | str:
    """A running collector, or the one line saying why GPU activity is off."""
    collector = CuptiCollector(on_batch, **kw)
    reason = collector.start()
    return reason if reason is not None else collector
