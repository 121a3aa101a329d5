"""THE choice of reader of CUPTI's records, in one place and reported (the collector's
``reader``): the native one (:mod:`.cupti_native`) where its extension is built and libcupti
loads, else cupti-python's (:class:`.gpu_activity.CuptiCollector`).  Both hand the session
the same columns; the native module's C extension is loaded only when a reader starts."""

from __future__ import annotations

import os
from typing import Any, Callable

from ..common.gpu_records import ActivityBatch
from . import cupti_native
from .gpu_activity import CuptiCollector

#: Which reader of CUPTI's records: ``native`` (required), ``python`` (cupti-python), or
#: unset: the native one where it can run, else cupti-python.
ENV_CUPTI_READER = "CHAINER_AUTOPROF_CUPTI_READER"
#: What the native reader says when it cannot run at all (cupti-python is tried then).
NATIVE_UNAVAILABLE = ("the native CUPTI reader is not built", "libcupti could not be loaded")


def start(on_batch: Callable[[ActivityBatch], None], **kw: Any) -> CuptiCollector | str:
    """THE choice of reader (:data:`ENV_CUPTI_READER`): a running collector, or the one line
    saying why GPU activity is off."""
    want = os.environ.get(ENV_CUPTI_READER, "").strip().lower()
    if want not in ("", "native", "python"):
        return f"{ENV_CUPTI_READER}={want!r}: accepted native or python"
    calls = os.environ.get(cupti_native.ENV_CUPTI_CALLS, "").strip().lower() \
        or cupti_native.DEFAULT_CALLS
    if calls not in cupti_native.CALLS_CHOICES:
        return (f"{cupti_native.ENV_CUPTI_CALLS}={calls!r}: accepted "
                + " or ".join(cupti_native.CALLS_CHOICES))
    why_not_native = f"{ENV_CUPTI_READER}=python"
    if want != "python":
        got = cupti_native.start(on_batch, calls=calls, **kw)
        if not isinstance(got, str):
            got.reader = f"native ({got.library})"
            if got.calls == "launches":
                got.reader += "; only the launching calls recorded"
            elif calls == "launches":  # asked for, refused
                got.reader += "; libcupti switches no single call on: every call recorded"
            return got
        if want == "native" or not got.startswith(NATIVE_UNAVAILABLE):
            return got  # required, or CUPTI itself said no
        why_not_native = got
    collector = CuptiCollector(on_batch, **kw)
    collector.reader = f"python ({why_not_native})"
    reason = collector.start()
    return reason if reason is not None else collector
